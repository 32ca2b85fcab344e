"""ReXVQA records read a batch at a time give what the record path gives: the same rows, notes, rejects and order.

Records of a small synthetic release are spoilt one way each (every check the schema and the
row rules make, every value `extra` must keep, and ways the file can be damaged), then
read by both paths in batches of several sizes, so clean runs and spoilt records alternate.
"""

import copy
import json
import math

import pyarrow as pa
import pytest

from builders.assembly.report import Reject
from rexvqa_dataset import record_columns
from rexvqa_dataset.build import RexvqaBuild
from rexvqa_dataset.records import RawRecord, find_source_files, read_file
from rexvqa_dataset.rows import question_row
from rexvqa_dataset.synthetic.release import generate

STAGING = RexvqaBuild.staging_schema()
BROKEN = "@@broken@@"
BAD_BYTES = "@@bad-bytes@@"
SURROGATE = "@@surrogate@@"
NULL = object()


def staged(items) -> list:
    """What the build stages from a reader's items, in order: rows as staged (with the views noted into `extra`) and rejects."""
    out = []
    for item in items:
        if isinstance(item, pa.Table):
            kept = item[record_columns.VIEWS_KEPT].to_pylist()
            rows = item.select(STAGING.names).cast(STAGING).to_pylist()
            out.extend(("row", row, ["ImageViewPosition"] if views else []) for row, views in zip(rows, kept))
        elif isinstance(item, Reject):
            out.append(("reject", item.file, item.record, item.field, item.reason))
        else:
            row, notes = question_row(item)
            if notes.unknown_task or notes.odd_ages:
                out.append(("noted", item.question_id))  # the columns never take such a row
            row["_file"] = item.file
            [row] = pa.Table.from_pylist([row], schema=STAGING).to_pylist()
            out.append(("row", row, notes.kept_in_extra))
    return out


SPOILS = {
    "option_letter": lambda r: r["options"].__setitem__(1, "C. wrong letter"),
    "three_options": lambda r: r.__setitem__("options", r["options"][:3]),
    "option_no_space": lambda r: r["options"].__setitem__(0, "A.no space"),
    "option_number": lambda r: r["options"].__setitem__(2, 3),
    "options_string": lambda r: r.__setitem__("options", "A. B. C. D."),
    "answer_e": lambda r: r.__setitem__("correct_answer", "E"),
    "answer_lower": lambda r: r.__setitem__("correct_answer", "a"),
    "task_unknown": lambda r: r.__setitem__("task_name", "Counting"),
    "task_empty": lambda r: r.__setitem__("task_name", ""),
    "question_empty": lambda r: r.__setitem__("question", ""),
    "question_null": lambda r: r.__setitem__("question", None),
    "question_missing": lambda r: r.pop("question"),
    "explanation_number": lambda r: r.__setitem__("correct_answer_explanation", 5),
    "study_id_int": lambda r: r.__setitem__("study_id", 123),
    "paths_empty": lambda r: r.__setitem__("ImagePath", []),
    "path_empty": lambda r: r.__setitem__("ImagePath", [""]),
    "path_null": lambda r: r["ImagePath"].append(None),
    "paths_string": lambda r: r.__setitem__("ImagePath", r["ImagePath"][0]),
    "views_short": lambda r: r.__setitem__("ImageViewPosition", []),
    "views_long": lambda r: r.__setitem__("ImageViewPosition", r["ImageViewPosition"] + ["PA", "AP", "LL"]),
    "views_null": lambda r: r.__setitem__("ImageViewPosition", None),
    "view_nan": lambda r: r.__setitem__("ImageViewPosition", [math.nan] * len(r["ImagePath"])),
    "view_number": lambda r: r.__setitem__("ImageViewPosition", [1] * len(r["ImagePath"])),
    "views_missing": lambda r: r.pop("ImageViewPosition"),
    "views_string": lambda r: r.__setitem__("ImageViewPosition", "PA"),
    "age_odd": lambda r: r.__setitem__("PatientAge", "58 years"),
    "age_int": lambda r: r.__setitem__("PatientAge", 58),
    "age_null": lambda r: r.__setitem__("PatientAge", None),
    "age_days": lambda r: r.__setitem__("PatientAge", "010D"),
    "age_weeks": lambda r: r.__setitem__("PatientAge", "003W"),
    "age_months": lambda r: r.__setitem__("PatientAge", "007M"),
    "age_missing": lambda r: r.pop("PatientAge"),
    "sex_number": lambda r: r.__setitem__("PatientSex", 1),
    "sex_null": lambda r: r.__setitem__("PatientSex", None),
    "report_null": lambda r: r.__setitem__("Findings", None),
    "report_nan": lambda r: r.__setitem__("Impression", math.nan),
    "report_number": lambda r: r.__setitem__("Findings", 3.5),
    "report_int": lambda r: r.__setitem__("Indication", 3),
    "report_infinity": lambda r: r.__setitem__("Comparison", math.inf),
    "report_missing": lambda r: r.pop("Comparison"),
    "patient_id_int": lambda r: r.__setitem__("PatientID", 12345),
    "study_date_int": lambda r: r.__setitem__("StudyDate", 20200101),
    "uid_nan": lambda r: r.__setitem__("StudyInstanceUid", math.nan),
    "modality_string": lambda r: r.__setitem__("ImageModality", "DX"),
    "modality_null": lambda r: r.__setitem__("ImageModality", None),
    "modality_nan_item": lambda r: r.__setitem__("ImageModality", [math.nan]),
    "modality_int_item": lambda r: r.__setitem__("ImageModality", [1]),
    "modality_null_item": lambda r: r.__setitem__("ImageModality", [None, "DX"]),
    "modality_missing": lambda r: r.pop("ImageModality"),
    "code_float": lambda r: r.__setitem__("validation_code", 1.0),
    "code_half": lambda r: r.__setitem__("validation_code", 1.5),
    "code_bool": lambda r: r.__setitem__("validation_code", True),
    "code_big": lambda r: r.__setitem__("validation_code", 2**40),
    "code_huge": lambda r: r.__setitem__("validation_code", 2**70),
    "code_negative": lambda r: r.__setitem__("validation_code", -(2**31)),
    "code_nan": lambda r: r.__setitem__("validation_code", math.nan),
    "code_infinity": lambda r: r.__setitem__("validation_code", math.inf),
    "code_null": lambda r: r.__setitem__("validation_code", None),
    "code_string": lambda r: r.__setitem__("validation_code", "1"),
    "code_missing": lambda r: r.pop("validation_code"),
    "extra_key": lambda r: r.__setitem__("new_key", {"nested": [1, math.nan, None, "ü"]}),
    "extra_deep": lambda r: r.__setitem__("deep", json.loads("[" * 300 + "]" * 300)),
    "unicode_text": lambda r: r.__setitem__("question", "Œdème pulmonaire ? 肺水肿 \u2028"),
    "surrogate_text": lambda r: r.__setitem__("correct_answer_explanation", SURROGATE),
    "surrogate_extra": lambda r: r.__setitem__("class", SURROGATE),
    "keys_reordered": lambda r: dict(reversed(list(r.items()))),
    "not_an_object": lambda r: ["a", "list"],
    "null_record": lambda r: NULL,
    "broken_token": lambda r: r.__setitem__("question", BROKEN),
    "bad_utf8": lambda r: r.__setitem__("category", BAD_BYTES),
}


def spoilt_text(records: dict[str, dict]) -> bytes:
    """The file as the release writes it (`json.dumps(indent=1)`), a few records spoilt one way each and some ids repeated."""
    spoilt, names = {}, list(SPOILS)
    for k, (question_id, record) in enumerate(records.items()):
        spoilt[question_id] = record
        if k % 2 == 1:
            name = names[(k // 2) % len(names)]
            changed = copy.deepcopy(record)
            result = SPOILS[name](changed)
            value = changed if result is None else None if result is NULL else result
            spoilt[f"{question_id}-{name}" + (SURROGATE if name == "surrogate_text" else "")] = value
        if k % 17 == 5:
            spoilt[f"{question_id} "] = record
    text = json.dumps(spoilt, indent=1, ensure_ascii=False)
    repeated = next(iter(records))
    text = text[:-2] + f",\n {json.dumps(repeated)}: {json.dumps(records[repeated])}\n}}"  # an id twice in one file
    text = text.replace(f'"{BROKEN}"', "NaN-").replace(SURROGATE, "\\udc80").encode("utf-8")
    return text.replace(f'"{BAD_BYTES}"'.encode(), b'"\xff\xfe"')


@pytest.fixture(scope="module")
def spoilt_release(tmp_path_factory):
    root = tmp_path_factory.mktemp("rexvqa")
    generate(root, num_studies=60, images=False)
    for path, _ in find_source_files(root):
        path.write_bytes(spoilt_text(json.loads(path.read_text(encoding="utf-8"))))
    return root


@pytest.mark.parametrize("batch_records", [1, 7, 64, 8192])
def test_columns_give_the_record_paths_rows_notes_rejects_and_order(spoilt_release, batch_records):
    files = find_source_files(spoilt_release)
    assert len(files) == 3
    reasons = set()
    for path, split in files:
        by_record = staged(record_columns.checked(read_file(path, split)))
        by_columns = staged(record_columns.read(path, split, batch_records))
        assert by_columns == by_record, path
        reasons.update(item[4].split(":")[0][:30] for item in by_record if item[0] == "reject")
    assert len(reasons) > 12  # many kinds of reject, not one


def test_only_the_records_the_columns_cannot_vouch_for_take_the_record_path(tmp_path):
    generate(tmp_path, num_studies=30, images=False)
    [(path, split)] = [f for f in find_source_files(tmp_path) if f[1] == "train"]
    records = json.loads(path.read_text(encoding="utf-8"))
    spoilt_id = list(records)[5]
    records[spoilt_id]["PatientAge"] = "58 years"
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    items = list(record_columns.read(path, split))
    assert sum(item.num_rows for item in items if isinstance(item, pa.Table)) == len(records) - 1
    [spoilt] = [item for item in items if not isinstance(item, pa.Table)]
    assert isinstance(spoilt, RawRecord) and spoilt.question_id == spoilt_id
