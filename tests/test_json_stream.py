"""Raw JSON releases are read record by record: damaged bytes cost only the records they touch.

Unit checks of `builders.json_stream`, then real builds through the CLI of releases spoiled
the ways a download or an editor spoils them; in each the build report's counts add up.
"""

import io
import json
import math
import re
from pathlib import Path

import pytest

from builders.json_stream import Damage, LineError, RecordStream, loads_line
from cxr_vqa.cli import main
from gemex_dataset.synthetic.release import generate as generate_gemex
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_records_match_json_load_whatever_the_block_size(block, indent):
    records = {"q1": {"a": [1, 2.5, None], "b": "x" * 50, "nan": math.nan}, "q2": {"n": 12345678}, "q3": {}}
    text = json.dumps(records, indent=indent)
    read = dict(RecordStream(io.StringIO(text), "object", block=block))
    assert read.keys() == records.keys() and read["q2"] == {"n": 12345678} and read["q1"]["b"] == "x" * 50
    assert math.isnan(read["q1"]["nan"])
    array = list(RecordStream(io.StringIO(json.dumps(list(records.values()), indent=indent)), "array", block=block))
    assert [label for label, _ in array] == ["index 0", "index 1", "index 2"]


def test_an_escape_that_is_half_a_pair_costs_its_record_and_a_whole_pair_does_not():
    """`\\ud800` alone decodes to a lone surrogate that no UTF-8 column can store: read as a value, it would crash staging."""
    text = '{"a": {"q": "\\ud83d\\ude00"}, "b": {"q": ["x", {"deep": "\\ud800"}]}, "c\\ud801": {"q": 1}, "d": {"q": 2}}'
    items = list(RecordStream(io.StringIO(text), "object"))
    assert items[0] == ("a", {"q": "\U0001f600"})
    assert isinstance(items[1], Damage) and items[1].record == "b" and items[1].reason.endswith("at $.q[1].deep")
    assert (
        isinstance(items[2], Damage) and items[2].record == "c\\ud801" and items[2].reason.endswith("at the record id")
    )
    assert items[3] == ("d", {"q": 2})
    with pytest.raises(LineError, match=r"lone surrogate.* at \$\.question"):
        loads_line(b'{"question": "\\uDBFFx"}')


def test_empty_containers():
    assert list(RecordStream(io.StringIO(" { } "), "object")) == []
    assert list(RecordStream(io.StringIO("[]"), "array")) == []


@pytest.mark.parametrize("indent", [None, 1])
@pytest.mark.parametrize("block", [5, 1 << 20])
def test_a_bad_token_costs_one_record_even_beside_nested_objects(indent, block):
    records = {f"q{k}": {"x": k, "nested": {"a": {"b": 1}, "c": {"d": 2}}} for k in range(6)}
    text = json.dumps(records, indent=indent).replace('"x": 2', '"x": oops', 1)
    items = list(RecordStream(io.StringIO(text), "object", block=block))
    assert [i if isinstance(i, Damage) else i[0] for i in items][:2] == ["q0", "q1"]
    damage = [i for i in items if isinstance(i, Damage)]
    assert [d.record for d in damage] == ["q2"] and "malformed JSON" in damage[0].reason
    assert [i[0] for i in items if not isinstance(i, Damage)] == ["q0", "q1", "q3", "q4", "q5"]


def test_array_resynchronises_at_the_next_top_level_record():
    text = '[{"c": [{"from": 1}, {"from": 2}]}, {"c": [{"from": bad}, {"from": 4}]}, {"c": [{"from": 5}, {"from": 6}]}]'
    items = list(RecordStream(io.StringIO(text), "array", block=3))
    assert isinstance(items[1], Damage) and items[1].record == "index 1"
    assert [i for i in items if not isinstance(i, Damage)] == [
        ("index 0", {"c": [{"from": 1}, {"from": 2}]}),
        ("index 2", {"c": [{"from": 5}, {"from": 6}]}),
    ]


def test_text_after_the_end_and_wrong_top_level():
    assert list(RecordStream(io.StringIO("[1] x"), "array"))[-1].record is None
    [damage] = list(RecordStream(io.StringIO("[1, 2]"), "object"))
    assert damage.record is None and "keyed by record id" in damage.reason


# ---------------------------------------------------------------------------------------------
# ReXVQA builds


def rexvqa_release(tmp_path: Path) -> tuple[Path, dict[str, dict]]:
    generate_rexvqa(tmp_path / "raw", num_studies=12, images=False)
    metadata = tmp_path / "raw" / "metadata"
    return metadata, {p.name: json.loads(p.read_text()) for p in sorted(metadata.glob("*.json"))}


def build_report(dataset: str, tmp_path: Path, source: Path) -> dict:
    """Build the text columns and return the report, whose counts must add up."""
    out = tmp_path / "out"
    assert (
        main(["build", dataset, "--source", str(source), "--out", str(out), "--image-mode", "none", "--overwrite"]) == 0
    )
    report = json.loads((out / "build_report.json").read_text())
    assert report["records_read"] == report["rows_written"] + report["rejected"]
    return report


def spoil(path: Path, records: dict, key: str, old: bytes, new: bytes) -> None:
    """Rewrite `path` (indent=1, as released) with `old` replaced by `new` inside record `key` only."""
    text = json.dumps(records, indent=1, allow_nan=True).encode()
    start = text.index(json.dumps(key).encode() + b": {")
    at = text.index(old, start)
    path.write_bytes(text[:at] + new + text[at + len(old) :])


def test_rexvqa_bad_token_in_record_2_costs_only_record_2(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    records = files["train_vqa_data.json"]
    second = list(records)[1]
    spoil(metadata / "train_vqa_data.json", records, second, b'"question": "', b'"question": oops "')
    report = build_report("rexvqa", tmp_path, metadata)
    total = sum(len(r) for r in files.values())
    assert report["records_read"] == total and report["rows_written"] == total - 1
    [reject] = report["rejects"]
    assert (
        reject["record"] == second
        and "malformed JSON" in reject["reason"]
        and reject["file"].endswith("train_vqa_data.json")
    )


def test_rexvqa_bad_utf8_in_the_last_record_costs_only_it(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    records = files["test_vqa_data.json"]
    last = list(records)[-1]
    spoil(metadata / "test_vqa_data.json", records, last, b'"question": "', b'"question": "\xff\xfe')
    report = build_report("rexvqa", tmp_path, metadata)
    total = sum(len(r) for r in files.values())
    assert report["rows_written"] == total - 1
    [reject] = report["rejects"]
    assert reject["record"] == last and "not valid UTF-8" in reject["reason"]


def test_rexvqa_damage_in_the_first_record_costs_only_it_though_the_third_is_damaged_too(tmp_path):
    """No record has been read whole when the first fails, and the one after the next is damaged too: the
    records' indentation comes from the file's first lines, so the second, whole, is kept."""
    metadata, files = rexvqa_release(tmp_path)
    records = files["train_vqa_data.json"]
    first, third = list(records)[0:3:2]
    text = json.dumps(records, indent=1, allow_nan=True)
    text = first_and_third_spoilt(
        text, [text.index(json.dumps(key) + ": {") for key in (first, third)], '"question": "'
    )
    (metadata / "train_vqa_data.json").write_text(text)
    report = build_report("rexvqa", tmp_path, metadata)
    total = sum(len(r) for r in files.values())
    assert report["records_read"] == total and report["rows_written"] == total - 2
    assert [(r["record"], r["reason"].split(":")[-1].strip()) for r in report["rejects"]] == [
        (first, "Invalid \\escape"),
        (third, "Expecting ',' delimiter"),
    ]


def first_and_third_spoilt(text: str, starts: list[int], before: str) -> str:
    """`text` with a bad escape after the first `before` from `starts[0]`, a stray quote after the first from `starts[1]`."""
    third = text.index(before, starts[1]) + len(before)
    text = text[:third] + '" ' + text[third:]
    first = text.index(before, starts[0]) + len(before)
    return text[:first] + "\\x" + text[first:]


def test_rexvqa_truncated_file_keeps_the_records_before_the_cut(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    path = metadata / "train_vqa_data.json"
    records = files["train_vqa_data.json"]
    third = list(records)[2]
    text = path.read_bytes()
    path.write_bytes(text[: text.index(json.dumps(third).encode() + b": {") + 40])
    report = build_report("rexvqa", tmp_path, metadata)
    [reject] = report["rejects"]
    assert reject["record"] == third and "ends inside this record" in reject["reason"]
    assert report["rows_written"] == sum(len(r) for r in files.values()) - len(records) + 2


def test_rexvqa_deep_nesting_is_one_reject(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    records = files["valid_vqa_data.json"]
    first = next(iter(records))
    spoil(metadata / "valid_vqa_data.json", records, first, b'"question": ', f'"deep": {DEEP}, "question": '.encode())
    report = build_report("rexvqa", tmp_path, metadata)
    [reject] = report["rejects"]
    assert reject["record"] == first and "nested too deeply" in reject["reason"]
    assert report["rows_written"] == sum(len(r) for r in files.values()) - 1


def test_rexvqa_bom_at_the_start_of_every_file_is_accepted(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    for name in files:
        (metadata / name).write_bytes(b"\xef\xbb\xbf" + (metadata / name).read_bytes())
    report = build_report("rexvqa", tmp_path, metadata)
    assert report["rejected"] == 0 and report["rows_written"] == sum(len(r) for r in files.values())


def test_rexvqa_question_id_in_two_splits_keeps_the_first(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    train, test = files["train_vqa_data.json"], files["test_vqa_data.json"]
    shared = next(iter(train))
    test[shared] = next(iter(test.values()))
    (metadata / "test_vqa_data.json").write_text(json.dumps(test, indent=1, allow_nan=True))
    report = build_report("rexvqa", tmp_path, metadata)
    [reject] = report["rejects"]
    assert (reject["record"], reject["field"], reject["reason"]) == (shared, "question_id", "duplicate_question_id")
    assert reject["file"].endswith("test_vqa_data.json") and report["reject_reasons"] == {"duplicate_question_id": 1}
    assert any("duplicate_question_id" in notice for notice in report["notices"])


# ---------------------------------------------------------------------------------------------
# GEMeX builds


@pytest.fixture(scope="module")
def gemex_raw(tmp_path_factory):
    return generate_gemex(tmp_path_factory.mktemp("gemex-raw"), num_images=6, seed=3, images=False)


def llava_copy(gemex_raw, tmp_path: Path) -> tuple[Path, list[dict]]:
    path = gemex_raw.root / "llava" / "train" / "train_conversations.json"
    copy = tmp_path / "release" / path.relative_to(gemex_raw.root / "llava")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(path.read_bytes())
    return copy, json.loads(path.read_text())


def test_gemex_truncated_llava_keeps_every_record_before_the_cut(gemex_raw, tmp_path):
    path, records = llava_copy(gemex_raw, tmp_path)
    text = path.read_bytes()
    path.write_bytes(text[: len(text) * 2 // 3])
    report = build_report("gemex", tmp_path, tmp_path / "release")
    [reject] = report["rejects"]
    cut_at = int(reject["record"].removeprefix("index "))
    assert "ends inside this record" in reject["reason"] and cut_at > len(records) // 2
    assert report["records_read"] == cut_at + 1 and report["rows_written"] == cut_at


def test_gemex_llava_bad_utf8_and_bad_token_cost_their_records(gemex_raw, tmp_path):
    path, records = llava_copy(gemex_raw, tmp_path)
    text = json.dumps(records, indent=2).encode()
    images = text.split(b"<image>")  # one per record, inside its human turn's string
    text = b"<image>".join(images[:3] + [b"\xc3(" + images[3]] + images[4:])
    row_ids = text.split(b'"row_id": ')
    text = b'"row_id": '.join(row_ids[:7] + [b"oops " + row_ids[7]] + row_ids[8:])
    path.write_bytes(text)
    report = build_report("gemex", tmp_path, tmp_path / "release")
    assert {(r["record"], r["reason"].split(" at ")[0]) for r in report["rejects"]} == {
        ("index 2", "not valid UTF-8"),
        ("index 6", "malformed JSON"),
    }
    assert report["records_read"] == len(records) and report["rows_written"] == len(records) - 2


def test_gemex_llava_damage_in_the_first_record_costs_only_it_though_the_third_is_damaged_too(gemex_raw, tmp_path):
    path, records = llava_copy(gemex_raw, tmp_path)
    text = json.dumps(records, indent=1)
    starts = [m.start() for m in re.finditer(r"\n \{", text)]
    path.write_text(first_and_third_spoilt(text, [starts[0], starts[2]], '"value": "<image>'))
    report = build_report("gemex", tmp_path, tmp_path / "release")
    assert report["records_read"] == len(records) and report["rows_written"] == len(records) - 2
    assert [(r["record"], r["reason"].split(":")[-1].strip()) for r in report["rejects"]] == [
        ("index 0", "Invalid \\escape"),
        ("index 2", "Expecting ',' delimiter"),
    ]


def per_type_copy(gemex_raw, tmp_path: Path) -> Path:
    source = gemex_raw.root / "per_type" / "test"
    copy = tmp_path / "release" / "test"
    copy.mkdir(parents=True)
    for path in source.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    return copy


def test_gemex_deep_nesting_and_bom(gemex_raw, tmp_path):
    folder = per_type_copy(gemex_raw, tmp_path)
    path = folder / "open_ended_question.jsonl"
    lines = path.read_text().split("\n")
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([lines[0], DEEP] + lines[1:]).encode())
    expected = sum(len(p.read_text().split("\n")) for p in folder.iterdir())
    report = build_report("gemex", tmp_path, tmp_path / "release")
    [reject] = report["rejects"]
    assert reject["record"] == "line 2" and "nested too deeply" in reject["reason"]
    assert report["records_read"] == expected and report["rows_written"] == expected - 1


# ---------------------------------------------------------------------------------------------
# Damage that must not cost intact records


def pretty_llava(n: int, spoilt: range = range(0)) -> tuple[list[dict], str]:
    """`n` LLaVA-like records and their file as released (`indent=1`), a bad token in the records `spoilt`."""
    records = [
        {
            "conversations": [{"from": "human", "value": f"<image>\nq{k}"}, {"from": "gpt", "value": f"<answer> a{k}"}],
            "row_id": k,
            "image": f"p10/p1/s{k}/d{k}.jpg",
        }
        for k in range(n)
    ]
    return records, pretty(list(enumerate(records)), "array", spoilt, '"row_id": ')


def pretty_rexvqa(n: int, spoilt: range = range(0)) -> tuple[dict[str, dict], str]:
    """`n` ReXVQA-like records keyed by id and their file as released (`indent=1`), a bad token in the records `spoilt`."""
    records = {
        f"{k:06d}_q": {
            "question": f"q{k}",
            "options": ["A. x", "B. y"],
            "ImagePath": [f"i{k}.png"],
            "nested": {"a": {"b": k}},
        }
        for k in range(n)
    }
    return records, pretty(list(enumerate(records.items())), "object", spoilt, '"question": ')


def pretty(items: list[tuple[int, object]], kind: str, spoilt: range, field: str) -> str:
    """`json.dumps(records, indent=1)`, written a record at a time so that a record can be spoilt on its own."""
    parts = []
    for k, item in items:
        text = json.dumps(item[1] if kind == "object" else item, indent=1).replace("\n", "\n ")
        if k in spoilt:
            text = text.replace(field, field + "oops ", 1)
        parts.append(f"{json.dumps(item[0])}: {text}" if kind == "object" else text)
    opener, closer = ("{", "}") if kind == "object" else ("[", "]")
    return f"{opener}\n " + ",\n ".join(parts) + f"\n{closer}"


def read_items(text: str, kind: str, block: int = 1 << 16) -> tuple[list, list[Damage]]:
    items = list(RecordStream(io.StringIO(text), kind, block=block))
    return [i for i in items if not isinstance(i, Damage)], [i for i in items if isinstance(i, Damage)]


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("block", [1 << 10, 1 << 16, 1 << 20])
def test_damage_longer_than_the_block_costs_only_its_records(kind, block):
    """A damaged run crossing the read block does not end the file: the text read while trying candidates is searched too."""
    size = len(pretty_llava(1)[1] if kind == "array" else pretty_rexvqa(1)[1])
    damaged = range(20, 20 + 3 * block // size)
    records, text = (
        pretty_llava(damaged.stop + 20, damaged) if kind == "array" else pretty_rexvqa(damaged.stop + 20, damaged)
    )
    values = records if kind == "array" else list(records.values())
    read, damage = read_items(text, kind, block)
    assert [v for _, v in read] == values[: damaged.start] + values[damaged.stop :]
    assert len(damage) == 1 and damage[0].record in ("index 20", "000020_q")


def test_a_stray_bracket_after_a_llava_record_does_not_end_the_file():
    records, text = pretty_llava(21)
    end_of_3 = text.index("\n },\n {", text.index('"row_id": 3')) + 3
    read, damage = read_items(text[:end_of_3] + "]" + text[end_of_3:], "array")
    assert [v for _, v in read] == records and len(damage) == 1 and "']'" in damage[0].reason


@pytest.mark.parametrize("one_line", [False, True])
def test_a_stray_brace_inside_a_rexvqa_record_rejects_it_and_reads_no_nested_key(one_line):
    records, text = pretty_rexvqa(20)
    text = json.dumps(records) if one_line else text
    at = text.index('"question": "q5"') + len('"question": "q5"')
    read, damage = read_items(text[:at] + "}" + text[at:], "object")
    assert [k for k, _ in read] == [k for k in records if k != "000005_q"]
    assert [d.record for d in damage] == ["000005_q"] and "ends early" in damage[0].reason


def test_a_record_on_one_line_that_lost_its_closing_brace_does_not_swallow_the_records_after_it():
    records, _ = pretty_rexvqa(6)
    text = json.dumps(records)
    at = text.index('{"b": 3}}') + len('{"b": 3}')
    read, damage = read_items(text[:at] + text[at + 1 :], "object")
    assert [k for k, _ in read] == [k for k in records if k != "000003_q"] and [d.record for d in damage] == [
        "000003_q"
    ]


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("change", ["delete", "}", "]", "\n"])
def test_damage_before_the_first_record_keeps_the_records(kind, at, change):
    records, text = pretty_llava(5) if kind == "array" else pretty_rexvqa(5)
    values = records if kind == "array" else list(records.values())
    spoilt = text[:at] + text[at + 1 :] if change == "delete" else text[:at] + change + text[at + 1 :]
    read, damage = read_items(spoilt, kind)
    assert [v for _, v in read][-4:] == values[1:] and len(damage) <= 1


@pytest.mark.parametrize("kind", ["array", "object"])
def test_a_file_cut_just_before_its_closing_bracket_keeps_its_last_record(kind):
    text = pretty_llava(5)[1] if kind == "array" else pretty_rexvqa(5)[1]
    read, damage = read_items(text.rstrip()[:-1], kind)
    assert len(read) == 5 and [d.record for d in damage] == [None] and "ends without its closing" in damage[0].reason


@pytest.mark.parametrize("indent", [1, None])
def test_resync_work_is_linear_in_the_damaged_run(indent):
    """The characters the decoder and the search go over grow as the damaged run does (they grew as its square:
    each failed parse counted the lines of everything held before it)."""

    def work(damaged: int) -> tuple[int, int]:
        spoilt = range(10, 10 + damaged)
        text = pretty_rexvqa(damaged + 20, spoilt)[1]
        if indent is None:
            text = json.dumps(pretty_rexvqa(damaged + 20)[0]).replace('"question": ', '"question": oops ', damaged + 10)
            text = text.replace('"question": oops ', '"question": ', 10)
        stream = RecordStream(io.StringIO(text), "object")
        assert len([i for i in stream if not isinstance(i, Damage)]) == 20
        return stream.work, len(text)

    (small, small_text), (large, large_text) = work(500), work(4000)
    assert large / small < 1.2 * large_text / small_text and large < 40 * large_text


# ---------------------------------------------------------------------------------------------
# One valid value must not stop a build: each is one reject naming file, record, field

LONG = b"1" * 5000


def test_rexvqa_a_5000_digit_integer_is_one_reject_and_an_infinite_code_is_kept(tmp_path):
    metadata, files = rexvqa_release(tmp_path)
    train, test = files["train_vqa_data.json"], files["test_vqa_data.json"]
    second, infinite = list(train)[1], next(iter(test))
    spoil(metadata / "train_vqa_data.json", train, second, b'"question": ', b'"big": ' + LONG + b', "question": ')
    spoil(metadata / "test_vqa_data.json", test, infinite, b'"validation_code": ', b'"validation_code": 1e400, "was": ')
    report = build_report("rexvqa", tmp_path, metadata)
    [reject] = report["rejects"]
    assert (reject["record"], reject["field"]) == (second, "big") and "5000 digits" in reject["reason"]
    assert report["rows_written"] == sum(len(r) for r in files.values()) - 1
    from datasets import load_dataset

    row = load_dataset(
        "parquet", data_files=str(tmp_path / "out" / "data" / "test" / "*.parquet"), split="train"
    ).filter(lambda r: r["question_id"] == infinite)[0]
    assert row["validation_code"] is None and json.loads(row["extra"])["validation_code"] == math.inf


def test_gemex_huge_integers_are_one_reject_each(gemex_raw, tmp_path):
    folder = per_type_copy(gemex_raw, tmp_path)
    multi, closed = folder / "multi_choice_question.jsonl", folder / "closed_ended_question.jsonl"
    lines = multi.read_text().split("\n")
    lines[1] = lines[1].replace('"q_id": 1,', f'"q_id": {2**63},')
    multi.write_text("\n".join(lines))
    lines = closed.read_text().split("\n")
    lines[0] = lines[0].replace('"q_id": 0,', f'"q_id": {LONG.decode()},')
    closed.write_text("\n".join(lines))
    llava = tmp_path / "release" / "train" / "conversations.json"
    llava.parent.mkdir()
    records = json.loads((gemex_raw.root / "llava" / "train" / "train_conversations.json").read_text())
    llava.write_bytes(json.dumps(records, indent=1).encode().replace(b'"row_id": 0,', b'"row_id": ' + LONG + b",", 1))
    report = build_report("gemex", tmp_path, tmp_path / "release")
    found = {(r["file"].rsplit("/", 1)[1], r["record"], r["field"]) for r in report["rejects"]}
    assert found == {
        ("multi_choice_question.jsonl", "line 2", "q_id"),
        ("closed_ended_question.jsonl", "line 1", "q_id"),
        ("conversations.json", "index 0", "row_id"),
    }


def test_an_annotation_file_whose_name_is_not_utf8_is_one_reject_shown_escaped(gemex_raw, tmp_path):
    import os

    path, records = llava_copy(gemex_raw, tmp_path)
    other = os.path.join(os.fsencode(path.parent), b"more-\xff.json")
    with open(other, "wb") as f:
        f.write(path.read_bytes())
    report = build_report("gemex", tmp_path, tmp_path / "release")
    [reject] = report["rejects"]
    assert reject["file"].endswith("more-\\xff.json") and "not UTF-8" in reject["reason"]
    assert report["rows_written"] == len(records)
