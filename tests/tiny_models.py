"""Tiny vision-language models and processors built offline, for the recipe tests.

The models are `training_recipes.tiny_model`'s (random weights, a tokenizer trained here, the
families' released chat templates); Qwen2.5-VL's processor is image-only, since its released
class builds a video processor that needs torchvision, which no PyPI build imports beside the
CPU torch these tests run on.
"""

from __future__ import annotations

import functools
from pathlib import Path

from training_recipes import tiny_model
from training_recipes.tiny_model import (  # noqa: F401 - the tests read them from here
    IMAGE_SIZE,
    TinyVLM,
    corpus,
    image_only_qwen2_5_vl_processor_class,
    padded_vocab,
    qwen_tokenizer,
    tiny_gemma3,
    tiny_idefics3,
    train_tokenizer,
)

FAMILIES = ("qwen2_5_vl", "idefics3", "gemma3")
chat_template = tiny_model.chat_template


def tiny_qwen2_5_vl() -> TinyVLM:
    return tiny_model.tiny_qwen2_5_vl(processor_class=image_only_qwen2_5_vl_processor_class())


BUILDERS = {"qwen2_5_vl": tiny_qwen2_5_vl, "idefics3": tiny_idefics3, "gemma3": tiny_gemma3}


def tiny_vlm(family: str, seed: int = 0) -> TinyVLM:
    """A fresh tiny model and processor; Qwen2.5-VL's processor image-only."""
    return tiny_model.tiny_vlm(family, seed, BUILDERS)


def save_tiny_vlm(family: str, directory: Path, seed: int = 0) -> Path:
    return tiny_model.save_tiny_vlm(family, directory, seed, BUILDERS)


@functools.cache
def saved_tiny_vlm(family: str, root: str) -> str:
    return str(save_tiny_vlm(family, Path(root) / family))
