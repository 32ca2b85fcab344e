"""The typed columns of a built ReXVQA dataset: one row per question.

Every column is defined here and nowhere else. `features(image_mode)` is what the
Parquet shards are written with and what the card's `dataset_info` declares.
"""

from __future__ import annotations

import re

from datasets import ClassLabel, Features, Image, List, Value

from builders.assembly.conversations import conversation_column_docs, conversation_features
from builders.assembly.sft import question_features

TASKS: tuple[str, ...] = (
    "Presence Assessment",
    "Location and Distribution Assessment",
    "Negation Assessment",
    "Differential Diagnosis",
    "Geometric Information Assessment",
)
"""The five tasks as stored in the release, in formats.md's order (the ClassLabel's names)."""

OTHER_TASK = "other_task"
"""The config (and shard name) of rows whose `task_name` is none of `TASKS`."""

SPLIT_FILES = {"train_vqa_data.json": "train", "valid_vqa_data.json": "validation", "test_vqa_data.json": "test"}
LETTERS = "ABCD"
IMAGE_COLUMNS = ("images", "missing_images", "image_widths", "image_heights", "messages")
"""Columns filled when a study's images are loaded (the build's second pass)."""


COLUMN_DOCS: dict[str, str] = {
    "question_id": "the release's question id (the key of its record)",
    "images": "the study's images that could be read, in `ImagePath` order",
    "image_paths": "`ImagePath` as released, relative to `metadata/`",
    "view_positions": "view of each image in `images` (PA, AP, LATERAL, ...); null where not given",
    "missing_images": "released paths that were missing or unreadable (the row keeps its other images)",
    "image_widths": "width of each stored image, pixels",
    "image_heights": "height of each stored image, pixels",
    "study_id": "the release's study id",
    "question": "the question",
    "options": "the four option texts without their `A. ` prefix",
    "answer": "the correct letter, A to D",
    "answer_index": "the correct option's position, 0 to 3",
    "explanation": "the release's explanation of the answer",
    "task_name": "one of the five tasks (class label; -1 when the stored task is none of them)",
    "task_name_raw": "the task as stored",
    "category": "the question's category, as released",
    "subcategory": "the question's subcategory, as released",
    "patient_id": "ReXGradient patient id",
    "accession_number": "ReXGradient accession number",
    "study_instance_uid": "DICOM Study Instance UID",
    "study_date": "study date, YYYYMMDD as released",
    "patient_age": "DICOM age string as released (`058Y`, `007M`)",
    "patient_age_years": "the same age in years",
    "patient_sex": "as released",
    "image_modality": "as released",
    "validation_code": "as released (meaning unknown)",
    "indication": "report section; null where the release has NaN",
    "comparison": "report section; null where the release has NaN",
    "findings": "report section; null where the release has NaN",
    "impression": "report section; null where the release has NaN",
    "split": "train, validation or test",
    "extra": "JSON object of every released key the schema does not name",
    "messages": "the row as TRL chat turns (the `sft` config)",
}


def task_config(task: str) -> str:
    """'Location and Distribution Assessment' -> 'location_and_distribution_assessment'."""
    return re.sub(r"[^0-9a-z]+", "_", task.lower()).strip("_")


TASK_CONFIGS: tuple[str, ...] = tuple(task_config(t) for t in TASKS)


def features(image_mode: str) -> Features:
    """Columns for a build in `image_mode` (`reference`, `embed` or `none`).

    `images`, `view_positions`, `image_widths` and `image_heights` are parallel: the
    study's images that could be read, in `ImagePath` order. `image_paths` is the
    released list unchanged and `missing_images` the released paths that were missing
    or unreadable. `none` drops `images` and reads no image: every released path is
    listed in `view_positions`' order and the sizes are null.

    `task_name` is -1 when the stored task is none of `TASKS`; `task_name_raw` always
    holds the stored text. `extra` is a JSON object (NaN written as a bare `NaN`, as
    Python's json does) of every raw key the schema does not name, and of any named value
    the typed columns cannot give back exactly, so that `rows.raw_record` rebuilds the
    released record.
    """
    return question_features(
        {"images": List(Image())},
        {
            "image_paths": List(Value("string")),
            "view_positions": List(Value("string")),
            "missing_images": List(Value("string")),
            "image_widths": List(Value("int32")),
            "image_heights": List(Value("int32")),
            "study_id": Value("string"),
            "question": Value("string"),
            "options": List(Value("string")),
            "answer": Value("string"),
            "answer_index": Value("int32"),
            "explanation": Value("string"),
            "task_name": ClassLabel(names=list(TASKS)),
            "task_name_raw": Value("string"),
            "category": Value("string"),
            "subcategory": Value("string"),
            "patient_id": Value("string"),
            "accession_number": Value("string"),
            "study_instance_uid": Value("string"),
            "study_date": Value("string"),
            "patient_age": Value("string"),
            "patient_age_years": Value("float32"),
            "patient_sex": Value("string"),
            "image_modality": List(Value("string")),
            "validation_code": Value("int32"),
            "indication": Value("string"),
            "comparison": Value("string"),
            "findings": Value("string"),
            "impression": Value("string"),
            "split": Value("string"),
            "extra": Value("string"),
        },
        image_mode,
    )


PER_STUDY_CONFIG = "sft_per_study"
"""The config of one conversation per study (`builders.assembly.conversations`)."""
STUDY_COLUMNS: tuple[str, ...] = (
    "images",
    "image_paths",
    "view_positions",
    "missing_images",
    "image_widths",
    "image_heights",
    "study_id",
    "patient_id",
    "split",
)
"""The study's columns in `sft_per_study`: its images (those of all its questions, in order of first appearance) and ids."""
TURN_COLUMNS: tuple[str, ...] = (
    "question",
    "options",
    "answer",
    "answer_index",
    "explanation",
    "task_name",
    "task_name_raw",
    "category",
    "subcategory",
)
"""Per question, what its turn is made of: the `turns` structs of `sft_per_study`, typed as in `features`."""

PER_STUDY_COLUMN_DOCS = conversation_column_docs(COLUMN_DOCS, STUDY_COLUMNS, TURN_COLUMNS, "study", "study_id") | {
    "images": "the images of all the study's questions that could be read, in order of first appearance",
}


def per_study_features(image_mode: str) -> Features:
    """Columns of `sft_per_study` (only in builds with images): one row per study, its questions as turns."""
    return conversation_features(features(image_mode), STUDY_COLUMNS, TURN_COLUMNS)
