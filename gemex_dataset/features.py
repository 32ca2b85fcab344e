"""The typed columns of a built GEMeX dataset: one row per question.

Every column is defined here and nowhere else. `features(image_mode)` is what the
Parquet shards are written with and what the card's `dataset_info` declares.
"""

from __future__ import annotations

from datasets import ClassLabel, Features, Image, List, Value

from builders.sft import MESSAGES

QUESTION_TYPES: tuple[str, ...] = ("open_ended", "closed_ended", "single_choice", "multi_choice")
"""The four question formats, in the paper's order; also the names of the per-type configs."""


def features(image_mode: str) -> Features:
    """Columns for a build in `image_mode` (`reference`, `embed` or `none`).

    `none` drops the `image` column; the other two hold an `Image()` (a path for
    `reference`, bytes for `embed`) and `messages`, the row as TRL's chat turns (the
    `sft` config; `builders/sft.py`). Boxes in `boxes` are xyxy in the pixels of the
    stored image (`image_width` x `image_height`); `boxes_224` are the released
    224 x 224 letterbox-frame boxes, unchanged.
    """
    columns: dict = {"question_id": Value("string")}
    if image_mode != "none":
        columns["image"] = Image()
    columns.update(
        {
            "image_path": Value("string"),
            "image_width": Value("int32"),
            "image_height": Value("int32"),
            "subject_id": Value("string"),
            "study_id": Value("string"),
            "dicom_id": Value("string"),
            "split": Value("string"),
            "question_type": ClassLabel(names=list(QUESTION_TYPES)),
            "content_type": Value("string"),
            "question": Value("string"),
            "choices": List(Value("string")),
            "answer": Value("string"),
            "answer_letters": List(Value("string")),
            "reason": Value("string"),
            "regions": List(Value("string")),
            "boxes": List(List(Value("float32"), length=4)),
            "boxes_224": List(List(Value("int32"), length=4)),
            "report": Value("string"),
            "source_layout": Value("string"),
            "row_id": Value("string"),
            "q_id": Value("int64"),
        }
    )
    if image_mode != "none":
        columns["messages"] = MESSAGES
    return Features(columns)
