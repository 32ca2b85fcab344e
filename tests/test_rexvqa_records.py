"""rexvqa_dataset.records and rows: strict on what formats.md marks sure, tolerant of the rest, exact round trip."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from builders.assembly.report import Reject
from rexvqa_dataset.record_columns import checked
from rexvqa_dataset.records import RawRecord, find_source_files, metadata_folder, read_file
from rexvqa_dataset.rows import age_in_years, question_row, raw_record, same_value
from rexvqa_dataset.synthetic.release import make_study

BASE = {
    "question": "Is there a pleural effusion?",
    "options": ["A. Yes", "B. No", "C. Cannot tell", "D. Only on the lateral view"],
    "correct_answer": "A",
    "correct_answer_explanation": "Blunted costophrenic angle.",
    "task_name": "Presence Assessment",
    "category": "Lung and Pleural Opacity",
    "subcategory": "Pleural effusion",
    "study_id": "study-1",
    "ImagePath": [
        "../deid_png/p/a/studies/s/series/r/instances/1.png",
        "../deid_png/p/a/studies/s/series/r/instances/2.png",
    ],
    "ImageViewPosition": ["PA", "LATERAL"],
    "PatientAge": "058Y",
    "PatientSex": "F",
    "Indication": "Cough.",
    "Comparison": math.nan,
    "Findings": "Small left effusion.",
    "Impression": "Effusion.",
}


def write(path: Path, records: dict, text: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else json.dumps(records, allow_nan=True), encoding="utf-8")
    return path


def row_of(record: dict, question_id: str = "q1") -> dict:
    return question_row(RawRecord("f.json", question_id, "train", record))[0]


def assert_round_trip(record: dict) -> None:
    row = row_of(copy.deepcopy(record))
    row = json.loads(json.dumps(row))  # as stored: plain JSON types
    back = raw_record(row)
    assert same_value(back, record), (back, record)


# ---------------------------------------------------------------------------------------------
# Reading files


def test_bare_nan_is_read_and_becomes_null(tmp_path):
    path = write(tmp_path / "metadata" / "test_vqa_data.json", {"q1": BASE})
    assert "NaN" in path.read_text()
    [raw] = list(read_file(path, "test"))
    row = row_of(raw.data)
    assert row["comparison"] is None and row["findings"] == "Small left effusion."


def test_source_may_be_the_release_root_or_its_metadata_folder(tmp_path):
    for name in ("train_vqa_data.json", "valid_vqa_data.json", "test_vqa_data.json"):
        write(tmp_path / "metadata" / name, {})
    assert metadata_folder(tmp_path) == tmp_path / "metadata" == metadata_folder(tmp_path / "metadata")
    assert [s for _, s in find_source_files(tmp_path)] == ["train", "validation", "test"]


def test_cut_file_is_one_reject_naming_the_cut_record(tmp_path):
    path = write(tmp_path / "train_vqa_data.json", {}, text='{"q1": {"question": ')
    [item] = list(read_file(path, "train"))
    assert isinstance(item, Reject) and item.record == "q1" and "the file ends inside this record" in item.reason


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"options": BASE["options"][:3]}, "options"),
        ({"options": BASE["options"] + ["E. Maybe"]}, "options"),
        ({"correct_answer": "E"}, "correct_answer"),
        ({"question": None}, "question"),
        ({"ImagePath": []}, "ImagePath"),
        ({"options": ["A. Yes", "B. No", "C. Maybe", "Unknown"]}, "options[3]"),
    ],
)
def test_sure_fields_are_checked(tmp_path, change, field):
    path = write(tmp_path / "train_vqa_data.json", {"q1": {**BASE, **change}})
    [item] = list(read_file(path, "train"))
    assert isinstance(item, Reject) and item.record == "q1" and item.field == field


def test_record_without_question_is_rejected_naming_the_field(tmp_path):
    record = {k: v for k, v in BASE.items() if k != "question"}
    path = write(tmp_path / "train_vqa_data.json", {"q1": record, "q2": BASE})
    items = list(read_file(path, "train"))
    assert isinstance(items[0], Reject) and items[0].field == "question" and isinstance(items[1], RawRecord)


def test_option_letters_must_run_in_order(tmp_path):
    path = write(
        tmp_path / "train_vqa_data.json", {"q1": {**BASE, "options": ["A. Yes", "C. No", "B. Maybe", "D. Unknown"]}}
    )
    [reject] = list(checked(read_file(path, "train")))
    assert isinstance(reject, Reject) and reject.field == "options[1]"


def test_a_report_field_that_is_a_real_number_is_rejected(tmp_path):
    path = write(tmp_path / "train_vqa_data.json", {"q1": {**BASE, "Findings": 3.0}})
    [reject] = list(checked(read_file(path, "train")))
    assert isinstance(reject, Reject) and reject.field == "Findings" and "the number 3.0" in reject.reason


# ---------------------------------------------------------------------------------------------
# Typed rows


def test_row_columns():
    row = row_of(BASE)
    assert row["options"] == ["Yes", "No", "Cannot tell", "Only on the lateral view"]
    assert (row["answer"], row["answer_index"]) == ("A", 0)
    assert (row["task_name"], row["task_name_raw"]) == (0, "Presence Assessment")
    assert (row["patient_age"], row["patient_age_years"]) == ("058Y", 58.0)
    assert row["view_positions"] == ["PA", "LATERAL"]
    assert json.loads(row["extra"]) == {
        "cxr_vqa:absent": [
            "PatientID",
            "AccessionNumber",
            "StudyInstanceUid",
            "StudyDate",
            "ImageModality",
            "validation_code",
        ]
    }
    assert json.loads(
        row_of(
            {
                **BASE,
                "PatientID": "p",
                "AccessionNumber": "a",
                "StudyInstanceUid": "1.2",
                "StudyDate": "20200101",
                "ImageModality": ["DX"],
                "validation_code": 0,
                "class": "normal",
            }
        )["extra"]
    ) == {"class": "normal"}


@pytest.mark.parametrize(
    ("age", "years"),
    [("058Y", 58.0), ("007M", 7 / 12), ("002D", 2 / 365.25), ("003W", 21 / 365.25), ("58", None), (None, None)],
)
def test_age_in_years(age, years):
    assert age_in_years(age) == (pytest.approx(years) if years else None)


def test_unknown_task_is_kept_and_noted_not_rejected():
    row, notes = question_row(RawRecord("f", "q", "train", {**BASE, "task_name": "Severity Assessment"}))
    assert (row["task_name"], row["task_name_raw"], notes.unknown_task) == (
        -1,
        "Severity Assessment",
        "Severity Assessment",
    )


def test_tolerated_oddities_become_null_columns():
    row, notes = question_row(
        RawRecord(
            "f",
            "q",
            "train",
            {
                **BASE,
                "PatientAge": "58 years",
                "ImageViewPosition": ["PA"],
                "validation_code": "yes",
                "ImageModality": "DX",
            },
        )
    )
    assert row["view_positions"] == ["PA", None]
    assert row["validation_code"] is None and row["image_modality"] == ["DX"]
    assert (row["patient_age"], row["patient_age_years"], notes.odd_ages) == ("58 years", None, ["58 years"])


# ---------------------------------------------------------------------------------------------
# Round trip: row -> released record, same content


@pytest.mark.parametrize(
    "change",
    [
        {},
        {
            "class": "abnormal",
            "Manufacturer": None,
            "ImageShape": [[2500, 2048]],
            "ImageBodyPart": ["CHEST"],
            "new_key": {"a": [1, math.nan]},
        },
        {"Comparison": None, "Indication": math.nan},
        {"ImageViewPosition": ["PA"]},
        {"ImageViewPosition": ["PA", None, "LL"]},
        {"ImageViewPosition": None},
        {"PatientID": 12345, "StudyDate": "20200101", "validation_code": 1, "ImageModality": ["DX", "DX"]},
        {"validation_code": True, "ImageModality": "DX", "PatientAge": math.nan},
        {"task_name": "Something else"},
    ],
)
def test_round_trip_to_the_raw_record(change):
    assert_round_trip({**BASE, **change})


def test_round_trip_without_optional_keys():
    assert_round_trip({k: v for k, v in BASE.items() if k not in ("ImageViewPosition", "PatientAge", "Findings")})


def test_round_trip_of_synthetic_records():
    for index in range(40):
        for record in make_study(5, index, "train", 4).records.values():
            assert_round_trip(record)
