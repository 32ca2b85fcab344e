"""From a released ReXVQA question to a typed row, and back.

`ROW_RULES` are the checks the schema cannot make (option letters in order, NaN as the only
number a report field may hold), each stated once over a batch of records
(`record_columns.raw_columns`) with the reject of a row that fails it. `question_row` returns
the columns (other than the image ones) of a record that passed them; `raw_record` writes a
row back as its released record. The two are tied together:
`question_row` puts into `extra` every raw value that `raw_record` would not give back
from the typed columns (keys the schema does not name, a JSON null where NaN is the
default, a view list of another length than the image list, an integer id), so a row
always converts back to its record with the same content.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import pyarrow as pa

from builders.columns import in_lettered_order
from builders.row_rules import RowRule
from rexvqa_dataset.features import LETTERS, TASKS
from rexvqa_dataset.records import RawRecord

ABSENT_KEY = "cxr_vqa:absent"
"""In `extra`: named keys the record did not have, so that `raw_record` leaves them out."""

REPORT_FIELDS = {
    "Indication": "indication",
    "Comparison": "comparison",
    "Findings": "findings",
    "Impression": "impression",
}
TEXT_FIELDS = {
    "question": "question",
    "correct_answer_explanation": "explanation",
    "category": "category",
    "subcategory": "subcategory",
    "study_id": "study_id",
    "PatientAge": "patient_age",
    "PatientSex": "patient_sex",
    "PatientID": "patient_id",
    "AccessionNumber": "accession_number",
    "StudyInstanceUid": "study_instance_uid",
    "StudyDate": "study_date",
}
NAMED_KEYS = frozenset(
    [
        *TEXT_FIELDS,
        *REPORT_FIELDS,
        "options",
        "correct_answer",
        "task_name",
        "ImagePath",
        "ImageViewPosition",
        "ImageModality",
        "validation_code",
    ]
)
"""The raw keys the schema names; every other key goes to `extra`."""

OPTION_PREFIXES = pa.array([f"{letter}. " for letter in LETTERS])
_AGE = re.compile(r"^(?P<number>\d{3})(?P<unit>[DWMY])$")
YEARS_PER_UNIT = {"D": 1 / 365.25, "W": 7 / 365.25, "M": 1 / 12, "Y": 1.0}


@dataclass
class RowNotes:
    """What a row's conversion noticed without rejecting it, for the build report."""

    unknown_task: str | None = None
    odd_ages: list[str] = field(default_factory=list)
    kept_in_extra: list[str] = field(default_factory=list)


def is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _report_rule(key: str) -> RowRule:
    """A report field holds text, NaN or null: any other number does not fit its text column."""
    return RowRule(
        key, lambda columns: ~columns.misfit[key], lambda r: f"expected report text or NaN, got the number {r[key]!r}"
    )


ROW_RULES = (
    RowRule(
        "options",
        lambda columns: (columns["options"], in_lettered_order(columns["options"], OPTION_PREFIXES)),
        lambda option, k: f"expected '{LETTERS[k]}. <text>', got {option!r}",
        per_item=True,
    ),
    *map(_report_rule, REPORT_FIELDS),
)
"""The checks of a record that passed the schema, in the order a reject names the first that fails."""


def age_in_years(age: str | None) -> float | None:
    """The DICOM age string as years: '058Y' -> 58.0, '007M' -> 0.583, '002D', '003W'; None if not one."""
    match = _AGE.match(age) if isinstance(age, str) else None
    return int(match["number"]) * YEARS_PER_UNIT[match["unit"]] if match else None


def _text(value: object) -> str | None:
    """A text column's value: strings as they are, integers as digits; NaN, null and anything else as null."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _text_list(value: object) -> list[str | None]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v if isinstance(v, str) else None for v in value]
    return []


def _validation_code(value: object) -> int | None:
    """The code as an int32 column holds it, else None (the value is then kept as released in `extra`)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        return None
    return int(value) if -(2**31) <= value < 2**31 else None


def aligned_views(views: list | None, count: int) -> list[str | None]:
    """The view positions padded with null (or cut) to one per image."""
    views = list(views or [])[:count]
    return [v if isinstance(v, str) else None for v in views] + [None] * (count - len(views))


def question_row(raw: RawRecord) -> tuple[dict, RowNotes]:
    """The columns of a record that passed `ROW_RULES`, other than the image ones (`images`, `missing_images`,
    sizes), `view_positions` one per path."""
    data, notes = raw.data, RowNotes()
    task = data["task_name"]
    if task not in TASKS:
        notes.unknown_task = task
    age = _text(data.get("PatientAge"))
    years = age_in_years(age)
    if age is not None and years is None:
        notes.odd_ages.append(age)
    row = {
        "question_id": raw.question_id,
        "image_paths": list(data["ImagePath"]),
        "view_positions": aligned_views(data.get("ImageViewPosition"), len(data["ImagePath"])),
        "options": [option[3:] for option in data["options"]],
        "answer": data["correct_answer"],
        "answer_index": LETTERS.index(data["correct_answer"]),
        "task_name": TASKS.index(task) if task in TASKS else -1,
        "task_name_raw": task,
        "patient_age_years": years,
        "image_modality": _text_list(data.get("ImageModality")),
        "validation_code": _validation_code(data.get("validation_code")),
        "split": raw.split,
    }
    row.update({column: _text(data.get(key)) for key, column in TEXT_FIELDS.items()})
    row.update({column: _text(data.get(key)) for key, column in REPORT_FIELDS.items()})
    row["extra"] = "{}"
    extra = record_differences(data, raw_record(row))
    notes.kept_in_extra = sorted(k for k in extra if k in NAMED_KEYS)
    row["extra"] = json.dumps(extra, ensure_ascii=False, allow_nan=True)
    return row, notes


def same_value(a: object, b: object) -> bool:
    """Equal as JSON values, NaN equal to NaN, and an int not equal to a str or a bool."""
    if is_nan(a) or is_nan(b):
        return is_nan(a) and is_nan(b)
    if type(a) is not type(b) and not ({type(a), type(b)} <= {int, float} and bool not in {type(a), type(b)}):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def _surely_same(raw: object, rebuilt: object) -> bool:
    """`same_value` for the common case at the cost of one comparison: equal values of one type.

    Sound for `raw_record`'s values: Python's `==` says equal where JSON does not only for a
    bool against a number, and the numbers a rebuilt record holds outside the raw values it
    copies are top-level (`validation_code`), where the type check catches a bool.
    """
    return type(raw) is type(rebuilt) and raw == rebuilt


def record_differences(record: dict, rebuilt: dict) -> dict:
    """What `extra` must hold for `rebuilt` (the record as the columns give it back) to become `record`."""
    extra = {
        key: value
        for key, value in record.items()
        if key not in rebuilt or (not _surely_same(value, rebuilt[key]) and not same_value(value, rebuilt[key]))
    }
    absent = [key for key in rebuilt if key not in record]
    if absent:
        extra[ABSENT_KEY] = absent
    return extra


def released_views(row: dict) -> list[str | None]:
    """`view_positions` back in `image_paths`' order, null where an image went missing."""
    views = iter(row["view_positions"])
    missing = set(row.get("missing_images") or [])
    return [None if path in missing else next(views, None) for path in row["image_paths"]]


def drop_missing_views(row: dict, missing: list[str]) -> None:
    """Drop the views of `missing` images from `view_positions` (one per path when staged), keeping the round trip."""
    if not missing:
        return
    views = row["view_positions"]
    lost = [v for path, v in zip(row["image_paths"], views) if path in missing]
    row["view_positions"] = [v for path, v in zip(row["image_paths"], views) if path not in missing]
    if any(v is not None for v in lost):
        extra = json.loads(row["extra"])
        if "ImageViewPosition" not in extra:
            extra["ImageViewPosition"] = views
            row["extra"] = json.dumps(extra, ensure_ascii=False, allow_nan=True)


def raw_record(row: dict) -> dict:
    """The row written back as its released record (the value under its question id)."""
    task = row["task_name"]
    record = {
        "question": row["question"],
        "options": [f"{LETTERS[k]}. {text}" for k, text in enumerate(row["options"])],
        "correct_answer": row["answer"],
        "correct_answer_explanation": row["explanation"],
        "task_name": row["task_name_raw"] if row.get("task_name_raw") is not None else TASKS[task],
        "category": row["category"],
        "subcategory": row["subcategory"],
        "study_id": row["study_id"],
        "ImagePath": list(row["image_paths"]),
        "ImageViewPosition": released_views(row),
        "PatientAge": row["patient_age"],
        "PatientSex": row["patient_sex"],
    }
    record.update({key: row[column] if row[column] is not None else math.nan for key, column in REPORT_FIELDS.items()})
    record.update(
        {
            "PatientID": row["patient_id"],
            "AccessionNumber": row["accession_number"],
            "StudyInstanceUid": row["study_instance_uid"],
            "StudyDate": row["study_date"],
            "ImageModality": row["image_modality"],
            "validation_code": row["validation_code"],
        }
    )
    extra = json.loads(row["extra"]) if row["extra"] not in (None, "", "{}") else {}
    for key in extra.pop(ABSENT_KEY, []):
        record.pop(key, None)
    record.update(extra)
    return record


def study_columns(rows: list[dict]) -> dict:
    """The `sft_per_study` columns of one study's question rows: the images of all of them (each once, in order
    of first appearance, with its view and size), every released path and every missing one, and the ids."""
    first = rows[0]
    images: dict[str, tuple] = {}
    released: dict[str, None] = {}
    missing: dict[str, None] = {}
    for row in rows:
        released.update(dict.fromkeys(row["image_paths"]))
        missing.update(dict.fromkeys(row["missing_images"] or []))
        shown = [path for path in row["image_paths"] if path not in set(row["missing_images"] or [])]
        views = row["view_positions"] if len(row["view_positions"] or []) == len(shown) else [None] * len(shown)
        for item in zip(shown, row["images"], views, row["image_widths"], row["image_heights"]):
            images.setdefault(item[0], item[1:])
    kept = list(images.values())
    return {
        "images": [image for image, *_ in kept],
        "image_paths": list(released),
        "view_positions": [view for _, view, _, _ in kept],
        "missing_images": [p for p in missing if p not in images],
        "image_widths": [width for *_, width, _ in kept],
        "image_heights": [height for *_, height in kept],
        "study_id": first["study_id"],
        "patient_id": first["patient_id"],
        "split": first["split"],
    }
