"""The typed columns of a built GEMeX dataset: one row per question.

Every column is defined here and nowhere else. `features(image_mode)` is what the
Parquet shards are written with and what the card's `dataset_info` declares.
"""

from __future__ import annotations

from datasets import ClassLabel, Features, Image, List, Value

from builders.assembly.conversations import conversation_column_docs, conversation_features
from builders.assembly.sft import question_features

QUESTION_TYPES: tuple[str, ...] = ("open_ended", "closed_ended", "single_choice", "multi_choice")
"""The four question formats, in the paper's order; also the names of the per-type configs."""
LLAVA_Q_TYPES: dict[str, str] = {t: f"{t}_questions" for t in QUESTION_TYPES}
"""Each question type's `q_type` in the LLaVA layout (and its key in the grouped layout)."""


COLUMN_DOCS: dict[str, str] = {
    "question_id": "stable unique id: `<split>/<dicom_id>/<question_type>/<n>` (the image path where the dicom_id, or the path less its extension, would not name one image alone)",
    "image": "the radiograph (a path to your file in `reference` mode, bytes in `embed` mode)",
    "image_path": "MIMIC-CXR-JPG path as released, relative to its `files/`",
    "image_width": "width of the stored image, pixels (what `boxes` refer to)",
    "image_height": "height of the stored image, pixels",
    "subject_id": "MIMIC-CXR subject (patient) id, from the path",
    "study_id": "MIMIC-CXR study id, from the path",
    "dicom_id": "MIMIC-CXR image id, from the path",
    "split": "train, validation or test",
    "question_type": "the format: open_ended, closed_ended, single_choice, multi_choice",
    "content_type": "what the question is about, as released (abnormality, disease, location, ...); null in the LLaVA layout",
    "question": "the question",
    "choices": "option texts without their letter; empty for open and closed questions",
    "answer": "as released: free text, `Yes.`/`No.`, a letter, or a JSON list of letters",
    "answer_letters": "the letters of a choice answer; empty otherwise",
    "reason": "the textual explanation",
    "regions": "anatomical region names, parallel to `boxes`; empty where the layout has none",
    "boxes": "`[x1, y1, x2, y2]` per region in the stored image's pixels; null without image sizes",
    "boxes_224": "the released boxes in Chest ImaGenome's 224 x 224 letterbox frame",
    "report": "the source radiology report; null in the LLaVA and grouped layouts",
    "source_layout": "the layout the record came from: per_type, llava or grouped",
    "row_id": "the image's index in its split, as released (`row_<k>`)",
    "q_id": "the question's index in its per-type file; null in other layouts",
    "messages": "the row as TRL chat turns (the `sft` config)",
}


def features(image_mode: str) -> Features:
    """Columns for a build in `image_mode` (`reference`, `embed` or `none`).

    `none` drops the `image` column; the other two hold an `Image()` (a path for
    `reference`, bytes for `embed`) and `messages`, the row as TRL's chat turns (the
    `sft` config; `builders/assembly/sft.py`). Boxes in `boxes` are xyxy in the pixels of the
    stored image (`image_width` x `image_height`); `boxes_224` are the released
    224 x 224 letterbox-frame boxes, unchanged.
    """
    return question_features(
        {"image": Image()},
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
        },
        image_mode,
    )


PER_IMAGE_CONFIG = "sft_per_image"
"""The config of one conversation per image (`builders.assembly.conversations`)."""
IMAGE_COLUMNS_PER_IMAGE: tuple[str, ...] = (
    "image",
    "image_path",
    "image_width",
    "image_height",
    "subject_id",
    "study_id",
    "dicom_id",
    "split",
)
"""The columns every question of an image shares: one value per conversation row."""
TURN_COLUMNS: tuple[str, ...] = (
    "question_type",
    "content_type",
    "question",
    "choices",
    "answer",
    "answer_letters",
    "reason",
    "regions",
    "boxes",
    "boxes_224",
)
"""Per question, what its turn is made of (prompt, reply, boxes): the `turns` structs of `sft_per_image`,
typed as in `features`, so a recipe can write the turns again in another model family's box convention."""

PER_IMAGE_COLUMN_DOCS = conversation_column_docs(
    COLUMN_DOCS, IMAGE_COLUMNS_PER_IMAGE, TURN_COLUMNS, "image", "dicom_id"
)


def per_image_features(image_mode: str) -> Features:
    """Columns of `sft_per_image` (only in builds with images): one row per image, its questions as turns."""
    return conversation_features(features(image_mode), IMAGE_COLUMNS_PER_IMAGE, TURN_COLUMNS)
