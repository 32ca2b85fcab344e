"""Loading a checkpoint's processor the way a user does (`AutoProcessor.from_pretrained`), and
stopping at once, in one line, when what comes back cannot feed a vision-language model.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL processors hold a video processor, and transformers builds it
only with torchvision importable; without it `AutoProcessor` raises an ImportError deep in its
loading, or (for a checkpoint whose processor class it cannot resolve) hands back the bare
tokenizer, and training then fails much later on an attribute error. torchvision must be the
build made for the installed torch: PyPI's wheels are built against PyPI's (CUDA) torch, and
beside a CPU torch from download.pytorch.org they fail to load (``operator torchvision::nms
does not exist``).
"""

from __future__ import annotations

import torch


class RecipeError(RuntimeError):
    """Something the user fixes before a recipe can run: one line, no traceback."""


TORCHVISION_INSTALL = (
    "pip install torchvision from the index your torch came from, e.g. "
    "pip install torchvision --index-url https://download.pytorch.org/whl/cpu for a CPU torch"
)


def torchvision_problem() -> str | None:
    """Why torchvision cannot be used beside the installed torch, or None when it imports."""
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        return "torchvision is not installed"
    except (ImportError, RuntimeError, OSError) as error:  # a build for another torch fails in its C++ operators
        first = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        return f"torchvision does not load beside torch {torch.__version__} ({first})"
    return None


def load_processor(model_name_or_path: str, **kwargs):
    """`AutoProcessor.from_pretrained(model_name_or_path, **kwargs)`, refused with a `RecipeError`
    naming what to install when it cannot build an image processor."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(model_name_or_path, **kwargs)
    except (ImportError, RuntimeError) as error:
        problem = torchvision_problem()
        if problem is None and "torchvision" not in str(error).lower():
            raise
        raise RecipeError(
            f"{model_name_or_path}: its processor cannot be built: {problem or 'it needs torchvision'}; "
            f"{TORCHVISION_INSTALL}"
        ) from None
    if getattr(processor, "image_processor", None) is None:
        problem = torchvision_problem()
        why = (
            f" ({problem}; Qwen-VL processors need it for their video processor: {TORCHVISION_INSTALL})"
            if problem
            else ""
        )
        raise RecipeError(
            f"{model_name_or_path}: AutoProcessor loaded only a {type(processor).__name__}, no image processor{why}"
        )
    return processor


def bf16_available() -> bool:
    """Whether this machine trains in bf16: a GPU that has it (the recipes' default there)."""
    from transformers.utils import is_torch_bf16_gpu_available

    return is_torch_bf16_gpu_available()


def default_dtype() -> str:
    """bfloat16 on a GPU that has it, float32 elsewhere (a CPU smoke run)."""
    return "bfloat16" if bf16_available() else "float32"
