"""What the GEMeX and ReXVQA task files share: where the built dataset is, the prompt the recipes
generate with, in lmms-eval's message format, and the per-question payload the scorers read.

The dataset comes from an environment variable (``CXR_VQA_GEMEX`` / ``CXR_VQA_REXVQA``: a built
folder or a Hub repo id) because lmms-eval's task files take no arguments; the model's family from
``CXR_VQA_MODEL_TYPE`` (its config's ``model_type``, e.g. ``qwen3_vl``), which gives the box
convention it writes in (``CXR_VQA_BOX_CONVENTION`` says it outright; else ``pixels``, as
``cxr-vqa evaluate --box-convention``) and the side multiple of its resize; and the pixel budget
from ``CXR_VQA_MAX_PIXELS`` / ``CXR_VQA_MIN_PIXELS`` (`builders.pixel_budget.from_environment`; the
defaults of ``--max-pixels``/``--min-pixels``). For the Qwen conventions (``qwen2.5-vl``,
``norm1000``) each image is handed to the model already resized to the budget at its family's
factor (Qwen3-VL's 32 px, Qwen2-VL's and Qwen2.5-VL's 28), exactly as the recipes train on it, so the
model sees at most the budget whatever its wrapper's own ``max_pixels``, and ``qwen2.5-vl`` boxes
are scored in those pixels.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence

from builders.box_frame import BOX_CONVENTIONS
from builders.pixel_budget import from_environment
from training_recipes.data import ConversationSettings, box_convention_for, row_images, to_messages

BOX_CONVENTION_VARIABLE = "CXR_VQA_BOX_CONVENTION"
MODEL_TYPE_VARIABLE = "CXR_VQA_MODEL_TYPE"
QWEN_CONVENTIONS = ("qwen2.5-vl", "norm1000")


def dataset_source(variable: str, dataset: str) -> str:
    """The built folder or Hub repo id named by `variable`; a clear error when it is unset."""
    value = os.environ.get(variable, "").strip()
    if not value:
        raise RuntimeError(
            f"{variable} is not set: point it at a built {dataset} folder or its Hub repo id to run the {dataset} lmms-eval tasks"
        )
    return value


def model_type() -> str | None:
    return os.environ.get(MODEL_TYPE_VARIABLE, "").strip() or None


def box_convention() -> str:
    value = os.environ.get(BOX_CONVENTION_VARIABLE, "").strip() or box_convention_for(model_type() or "")
    if value not in BOX_CONVENTIONS:
        raise ValueError(f"{BOX_CONVENTION_VARIABLE}={value!r}: expected one of {', '.join(BOX_CONVENTIONS)}")
    return value


def settings() -> ConversationSettings:
    """The recipes' conversation settings for the configured model family: images at the pixel budget for the Qwen conventions."""
    convention = box_convention()
    budget = from_environment(model_type=model_type()) if convention in QWEN_CONVENTIONS else None
    return ConversationSettings(convention, pixel_budget=budget)


def images(row: Mapping, kind: str) -> list:
    return row_images(dict(row), kind, settings())


def chat_messages(row: Mapping, kind: str) -> list[dict]:
    """The recipes' generation prompt (system turn, one image part per image, the question) with
    each image part carrying its RGB image, as lmms-eval's chat models take it."""
    images_ = iter(images(row, kind))
    messages = to_messages(dict(row), kind, settings(), with_answer=False)
    return [
        {
            "role": message["role"],
            "content": [
                {"type": "image", "url": next(images_)}
                if part["type"] == "image"
                else {"type": "text", "text": part["text"]}
                for part in message["content"]
            ],
        }
        for message in messages
    ]


def user_text(row: Mapping, kind: str) -> str:
    """The same prompt for lmms-eval's simple models (images passed apart): the instruction folded
    into the question, as for chat templates without a system role."""
    messages = to_messages(dict(row), kind, ConversationSettings(box_convention(), fold_system=True), with_answer=False)
    return "".join(part["text"] for part in messages[-1]["content"] if part["type"] == "text")


def prompt_functions(kind: str) -> tuple[Callable, Callable, Callable]:
    """A task file's `doc_to_visual`, `doc_to_text` and `doc_to_messages` for the rows of `kind`, as lmms-eval calls them."""

    def doc_to_visual(doc: dict) -> list:
        return images(doc, kind)

    def doc_to_text(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> str:
        return user_text(doc, kind)

    def doc_to_messages(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> list[dict]:
        return chat_messages(doc, kind)

    return doc_to_visual, doc_to_text, doc_to_messages


def scored_item(row: Mapping, results: Sequence[str], columns: Sequence[str]) -> dict:
    """One question's payload for the aggregations: its scoring columns (never images) and the reply."""
    return {"row": {c: row[c] for c in columns if c in row}, "reply": results[0] if results else ""}


def rows_and_replies(items: Sequence[Mapping]) -> tuple[list[dict], dict[str, str]]:
    rows = [item["row"] for item in items]
    return rows, {item["row"]["question_id"]: item["reply"] for item in items}


@functools.cache
def bert_scorer():
    """One BERTScore model per run (the task files are re-executed per task; this module is not)."""
    from builders.scoring.text_metrics import BertScorer

    return BertScorer()
