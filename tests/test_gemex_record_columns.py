"""The per-type layout read a column at a time gives what the record path gives: the same rows, rejects and order.

Lines of a small synthetic release are spoilt one way each (every row rule and every check the
schema makes, and every way a line can be damaged), then read by both paths in small blocks,
so clean runs, spoilt lines and refused blocks alternate.
"""

import codecs
import copy
import json

import pyarrow as pa
import pytest

from builders.assembly.report import Reject
from gemex_dataset import record_columns, records
from gemex_dataset.records import RawQuestion, find_source_files, read_file
from gemex_dataset.synthetic.release import generate


def staged(items) -> list:
    """What the build stages from a reader's items: rows and rejects, in order."""
    out = []
    for item in items:
        if isinstance(item, pa.Table):
            out.extend(("row", row) for row in item.to_pylist())
        else:
            assert isinstance(item, Reject)
            out.append(("reject", item.file, item.record, item.field, item.reason))
    return out


def spoil(record: dict, how: str, qtype: str) -> dict | str:
    """One record spoilt (or made unusual but valid) one way; a str is a raw line."""
    r = copy.deepcopy(record)
    line = None
    if how == "choices_in_open" and qtype not in ("single_choice", "multi_choice"):
        r["choices"] = ["A: x", "B: y"]
    elif how == "choices_null":
        r["choices"] = None
    elif how == "choice_letter" and "choices" in r:
        r["choices"][1] = "C: wrong"
    elif how == "one_choice" and "choices" in r:
        r["choices"] = r["choices"][:1]
    elif how == "choice_colon" and "choices" in r:
        r["choices"][0] = "A- no colon"
    elif how == "answer_letter":
        r["answer"] = ["Z"] if qtype == "multi_choice" else "Z"
    elif how == "answer_repeat" and qtype == "multi_choice":
        r["answer"] = ["A", "A"]
    elif how == "answer_empty" and qtype == "multi_choice":
        r["answer"] = []
    elif how == "answer_lower" and qtype == "closed_ended":
        r["answer"] = "yes"
    elif how == "box_three":
        r["visual_locations"] = [[1, 2, 3]] + r["visual_locations"][1:]
    elif how == "box_inverted":
        r["visual_locations"][0] = [100, 100, 50, 150]
    elif how == "box_far":
        r["visual_locations"][0] = [10, 10, 300, 40]
    elif how == "box_clipped":
        r["visual_locations"][0] = [-5, 10, 230, 40.5]
    elif how == "box_halves":
        r["visual_locations"][0] = [44.5, 45.5, 100.5, 101.5]
    elif how == "box_null":
        r["visual_locations"][0] = None
    elif how == "corner_null":
        r["visual_locations"][0] = [1, None, 30, 40]
    elif how == "boxes_null":
        r["visual_locations"] = None
    elif how == "regions_short":
        r["visual_regions"] = r["visual_regions"][:-1] + ([] if len(r["visual_regions"]) > 1 else ["x", "y"])
    elif how == "region_null":
        r["visual_regions"][0] = None
    elif how == "region_unknown":
        r["visual_regions"][0] = "left big toe"
    elif how == "files_prefix":
        r["image_path"] = "files//" + r["image_path"]
    elif how == "upper_ext":
        r["image_path"] = r["image_path"].replace(".jpg", ".JPG")
    elif how == "not_mimic":
        r["image_path"] = "images/chest-1.png"
    elif how == "no_extension":
        r["image_path"] = "images/chest"
    elif how == "upper_prefix_dotted_name":
        r["image_path"] = "P" + r["image_path"][1:].replace("/p", "/P", 1).replace(".jpg", ".v2.jpeg")
    elif how == "mimic_too_deep":
        r["image_path"] = r["image_path"].replace("/s", "/x/s", 1)
    elif how == "non_ascii_path":
        r["image_path"] = r["image_path"].replace("p1", "p١", 1)
    elif how == "newline_path":
        r["image_path"] += "\n"
    elif how == "row_id_newline":
        r["row_id"] += "\n"
    elif how == "q_id_string":
        r["q_id"] = "3"
    elif how == "missing_reason":
        del r["reason"]
    elif how == "extra_key":
        r["extra"] = {"a": [1, 2]}
    elif how == "type_null":
        r["type"] = None
    elif how == "empty_question":
        r["question"] = ""
    elif how == "unicode_text":
        r["question"] = "Qu'est-ce qu'on voit — 肺?"
    elif how == "blank":
        line = ""
    elif how == "spaces":
        line = "   \t"
    elif how == "truncated":
        line = json.dumps(r)[:40]
    elif how == "two_objects":
        line = json.dumps(r) + json.dumps(r)
    elif how == "array":
        line = "[1, 2]"
    elif how == "null":
        line = "null"
    elif how == "nan_box":
        line = json.dumps(r).replace(json.dumps(r["visual_locations"][0]), "[NaN, 1, 2, 3]", 1)
    elif how == "infinity_box":
        line = json.dumps(r).replace(json.dumps(r["visual_locations"][0]), "[1, 2, Infinity, 3]", 1)
    elif how == "duplicate_key":
        line = json.dumps(r)[:-1] + ', "q_id": 7}'
    elif how == "crlf":
        line = json.dumps(r) + "\r"
    elif how == "bad_utf8":
        line = b'{"question": "\xe9t\xe9"}'.decode("latin-1")
    elif how == "surrogate":
        line = json.dumps(r).replace('"question": "', '"question": "\\ud800', 1)
    elif how == "float_q_id":
        line = json.dumps(r).replace(f'"q_id": {r["q_id"]}', f'"q_id": {r["q_id"]}.0', 1)
    return line if line is not None else r


SPOILS = [
    "choices_in_open",
    "choices_null",
    "choice_letter",
    "one_choice",
    "choice_colon",
    "answer_letter",
    "answer_repeat",
    "answer_empty",
    "answer_lower",
    "box_three",
    "box_inverted",
    "box_far",
    "box_clipped",
    "box_halves",
    "box_null",
    "corner_null",
    "boxes_null",
    "regions_short",
    "region_null",
    "region_unknown",
    "files_prefix",
    "upper_ext",
    "not_mimic",
    "no_extension",
    "upper_prefix_dotted_name",
    "mimic_too_deep",
    "non_ascii_path",
    "newline_path",
    "row_id_newline",
    "q_id_string",
    "missing_reason",
    "extra_key",
    "type_null",
    "empty_question",
    "unicode_text",
    "blank",
    "spaces",
    "truncated",
    "two_objects",
    "array",
    "null",
    "nan_box",
    "infinity_box",
    "duplicate_key",
    "crlf",
    "bad_utf8",
    "surrogate",
    "float_q_id",
]


@pytest.fixture(scope="module")
def spoilt_release(tmp_path_factory):
    """A synthetic per-type release whose every file has each spoil on a line of its own, between clean lines."""
    root = tmp_path_factory.mktemp("per-type")
    generate(root, num_images=40, layouts=("per_type",), images=False)
    spoils = 0
    for path in sorted((root / "per_type").rglob("*_question.jsonl")):
        qtype = path.name.removesuffix("_question.jsonl")
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        lines = []
        for k, record in enumerate(records):
            lines.append(json.dumps(record))
            if k % 2 == 1:
                spoilt = spoil(record, SPOILS[spoils % len(SPOILS)], qtype)
                lines.append(spoilt if isinstance(spoilt, str) else json.dumps(spoilt))
                spoils += 1
        text = "\n".join(lines) + ("\n" if "test" in path.parts else "")  # some files end without a newline
        path.write_bytes((codecs.BOM_UTF8 if "valid" in path.parts else b"") + text.encode("utf-8", "surrogatepass"))
    return root


@pytest.mark.parametrize("block_bytes", [1 << 11, 1 << 14, 1 << 24])
def test_columns_give_the_record_paths_rows_rejects_and_order(spoilt_release, block_bytes):
    files = find_source_files(spoilt_release / "per_type")
    assert len(files) == 12
    rejects = set()
    for src in files:
        by_record = staged(record_columns.checked(src, read_file(src)))
        by_columns = staged(record_columns.read(src, block_bytes))
        assert by_columns == by_record, src.path
        rejects.update(item[4].split(":")[0][:30] for item in by_record if item[0] == "reject")
    assert len(rejects) > 20  # many kinds of reject, not one


def test_only_the_lines_the_columns_cannot_vouch_for_take_the_record_path(tmp_path, monkeypatch):
    generate(tmp_path, num_images=40, layouts=("per_type",), images=False)
    [src] = [
        s
        for s in find_source_files(tmp_path / "per_type")
        if s.path.name == "single_choice_question.jsonl" and s.split == "train"
    ]
    lines = src.path.read_text(encoding="utf-8").splitlines()
    lines[5] = json.dumps(spoil(json.loads(lines[5]), "box_far", "single_choice"))
    src.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    by_record, per_type_question = [], records.per_type_question
    monkeypatch.setattr(
        records, "per_type_question", lambda *args: by_record.append(per_type_question(*args)) or by_record[-1]
    )
    items = list(record_columns.read(src, 1 << 14))
    assert sum(item.num_rows for item in items if isinstance(item, pa.Table)) == len(lines) - 1
    [spoilt] = by_record
    assert isinstance(spoilt, RawQuestion) and spoilt.record == "line 6"
    [reject] = [item for item in items if not isinstance(item, pa.Table)]
    assert (reject.record, reject.field) == ("line 6", "visual_locations[0]") and "far outside" in reject.reason


@pytest.mark.parametrize(
    "location, field, reason",
    [
        ("[[1, 2, 3]]", "visual_locations[0]", "box [1, 2, 3] is not four numbers"),
        ('[["a", 1, 2, 3]]', "visual_locations", "expected a list of boxes [x1, y1, x2, y2], got [['a', 1, 2, 3]]"),
        ("[1, 2]", "visual_locations", "expected a list of boxes [x1, y1, x2, y2], got [1, 2]"),
    ],
)
def test_a_llava_location_that_is_not_boxes_is_rejected_with_its_field(tmp_path, location, field, reason):
    """A LLaVA record's boxes are text its schema cannot type: the box rules reject what is not four numbers each."""
    record = {
        "conversations": [
            {"from": "human", "value": "<image>\nWhere is the effusion?"},
            {"from": "gpt", "value": f"<answer> Left base. <reason> Blunted angle. <location> {location}"},
        ],
        "row_id": 3,
        "q_type": "open_ended_questions",
        "image": "p10/p10000001/s50000001/d1.jpg",
    }
    good = json.loads(json.dumps(record).replace(location.replace('"', '\\"'), "[[1, 2, 30, 40]]"))
    path = tmp_path / "train" / "sub_training_data.json"
    path.parent.mkdir()
    path.write_text(json.dumps([good, record]), encoding="utf-8")
    [src] = find_source_files(tmp_path)
    [kept, reject] = list(record_columns.read(src))
    assert kept.num_rows == 1 and kept["boxes_224"].to_pylist() == [[[1, 2, 30, 40]]]
    assert (reject.record, reject.field, reject.reason) == ("index 1", field, reason)


def test_lines_the_columns_doubt_that_pass_take_their_places_among_the_clean_rows(spoilt_release, monkeypatch):
    """A line the column checks cannot vouch for but the record path keeps is staged in its own place."""
    schema_holds = record_columns._schema_holds

    def every_third_doubted(batch, question_type):
        ok = schema_holds(batch, question_type)
        ok[::3] = False
        return ok

    monkeypatch.setattr(record_columns, "_schema_holds", every_third_doubted)
    for src in find_source_files(spoilt_release / "per_type"):
        by_columns = staged(record_columns.read(src, 1 << 12))
        assert by_columns == staged(record_columns.checked(src, read_file(src))), src.path
