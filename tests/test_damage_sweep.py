"""Every single-byte damage of a small release file costs only the records it touches.

For a small GEMeX LLaVA array and a small ReXVQA object keyed by id, written as released
(pretty-printed, `indent=1`), each byte offset is damaged in each of a few ways (deleted,
replaced by a structural character, a newline inserted before it) and the file read again
with `builders.json_stream.RecordStream`. Each byte belongs to one record's region (the
whitespace before the record, the record, the `,` after it) or to the file's opening or
closing bracket. Every record whose region the damage leaves alone must come out whole, no
record may come out other than as released unless it is the one touched, and the items
read add up: records + damaged regions.

Damage in the first record is swept again with the third record damaged too (a stray quote,
a bad token): the second record, whole, must come out, though no record has been read whole
before it and the one after it is damaged, and the third must be named in a damaged region.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter

import pytest

from builders.json_stream import Damage, RecordStream


def replace_with(char: str):
    return lambda text, k: text[:k] + char + text[k + 1 :]


def insert(char: str):
    return lambda text, k: text[:k] + char + text[k:]


KINDS = {
    "delete": replace_with(""),
    **{f"replace with {c!r}": replace_with(c) for c in '{}]",'},
    "insert a newline": insert("\n"),
    "insert ']'": insert("]"),
}


def llava_records() -> list[dict]:
    def record(k: int, q_type: str, human: str, answer: str) -> dict:
        return {
            "conversations": [
                {"from": "human", "value": f"<image>\n{human}"},
                {
                    "from": "gpt",
                    "value": f"<answer> {answer} <reason> Seen at {k}. <location> [[{k}, 10, {k + 40}, 90]]",
                },
            ],
            "row_id": k,
            "q_type": q_type,
            "type_prompt": "Input a question.",
            "image": f"p10/p1000{k}/s5000{k}/d{k}.jpg",
        }

    return [
        record(0, "open_ended_questions", "Where is the opacity?", "Left lung."),
        record(1, "closed_ended_questions", "Is there an effusion?", "Yes."),
        record(2, "single_choice_questions", "Which side? <choices>: [A: Left, B: Right]", "B"),
        record(3, "multi_choice_questions", "Which zones? <choices>: [A: Upper, B: Lower]", "['A', 'B']"),
    ]


def rexvqa_records() -> dict[str, dict]:
    def record(k: int) -> dict:
        return {
            "question": f"Is there a finding {k}?",
            "options": ["A. Yes", "B. No", "C. Maybe", "D. Unsure"],
            "correct_answer": "AB"[k % 2],
            "task_name": "Presence Assessment",
            "study_id": f"study_{k}",
            "ImagePath": [f"../deid_png/p{k}/a{k}/studies/s{k}/series/x/instances/i{k}.png"],
            "ImageViewPosition": ["PA"],
            "PatientAge": "058Y",
            "Findings": math.nan,
            "validation_code": k % 2,
            "nested": {"a": {"b": k}, "c": [{"d": 1}]},
        }

    return {f"{k:04d}_{k * 7919 % 1000:03d}": record(k) for k in range(4)}


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


def regions(text: str) -> list[int]:
    """For each character of `text`, the index of the record whose region holds it, or -1 for the brackets.

    Record k's region runs from the character after the `,` before it (or after the opening bracket)
    to its own `,` (the last record's: to its closing bracket).
    """
    commas, depth, in_string, escaped = [], 0, False, False
    for k, char in enumerate(text):
        if in_string:
            escaped, in_string = char == "\\" and not escaped, char != '"' or escaped
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == "," and depth == 1:
            commas.append(k)
    ends = [*commas, len(text.rstrip()) - 2]
    owner, record = [-1] * len(text), 0
    for k in range(1, ends[-1] + 1):
        owner[k] = record
        record += k == ends[record]
    return owner


def record_text(text: str, record: int) -> tuple[int, int]:
    """Where record `record`'s region starts and ends in `text` (`regions`)."""
    owner = regions(text)
    return owner.index(record), len(owner) - owner[::-1].index(record)


THIRD_RECORD_DAMAGE = {"a stray quote": (': "', ': "x" '), "a bad token": (': "', ": oops")}


def sweep_first_record(text: str, kind: str, originals: list[str], labels: list[str], third: str) -> tuple[int, int]:
    """Damage every offset of the first record every way, with the third damaged by `third`; returns
    (records kept, records not touched) over the sweep."""
    old, new = THIRD_RECORD_DAMAGE[third]
    at = text.index(old, record_text(text, 2)[0])
    text = text[:at] + new + text[at + len(old) :]
    kept = untouched_total = 0
    for name, damage in KINDS.items():
        for k in range(*record_text(text, 0)):
            items = list(RecordStream(io.StringIO(damage(text, k)), kind, block=512))
            read = [canonical(item[1]) if not isinstance(item, Damage) else None for item in items]
            untouched = [r for j, r in enumerate(originals) if j not in (0, 2)]
            missing = Counter(untouched) - Counter(read)
            assert not missing, (
                f"{name} at offset {k} of the first record, {third} in the third, lost {len(missing)} intact records"
            )
            between = items[read.index(originals[1]) + 1 : read.index(originals[3])]
            assert [d for d in between if isinstance(d, Damage) and (kind == "array" or d.record == labels[2])], (
                f"{name} at offset {k} of the first record: the third, damaged, is in no damaged region"
            )
            unknown = [r for r in read if r is not None and r not in originals]
            assert len(unknown) <= 1, f"{name} at offset {k} accepted {unknown}"
            kept += sum(r in originals for r in read)
            untouched_total += len(untouched)
    return kept, untouched_total


def sweep(text: str, kind: str, originals: list[str]) -> tuple[int, int]:
    """Damage every offset every way; returns (records kept, records not touched) over the sweep."""
    owner = regions(text)
    kept = untouched_total = 0
    for name, damage in KINDS.items():
        for k in range(len(text)):
            touched = owner[k]
            items = list(RecordStream(io.StringIO(damage(text, k)), kind, block=512))
            read = [canonical(value) for item in items if not isinstance(item, Damage) for value in [item[1]]]
            untouched = [r for j, r in enumerate(originals) if j != touched]
            missing = Counter(untouched) - Counter(read)
            assert not missing, f"{name} at offset {k} (record {touched}) lost {len(missing)} intact records"
            unknown = [r for r in read if r not in originals]
            assert not unknown or (touched >= 0 and len(unknown) == 1), f"{name} at offset {k} accepted {unknown}"
            kept += len(read) - len(unknown)
            untouched_total += len(untouched)
    return kept, untouched_total


@pytest.mark.parametrize("kind", ["array", "object"])
def test_every_intact_record_survives_every_single_byte_damage(kind):
    text, originals, _ = release(kind)
    kept, untouched = sweep(text, kind, originals)
    assert kept >= untouched
    print(
        f"{kind}: {kept} records kept over the sweep, {untouched} untouched ({len(text)} offsets x {len(KINDS)} kinds)"
    )


@pytest.mark.parametrize("third", list(THIRD_RECORD_DAMAGE))
@pytest.mark.parametrize("kind", ["array", "object"])
def test_damage_in_the_first_record_costs_only_it_with_the_third_damaged_too(kind, third):
    text, originals, labels = release(kind)
    kept, untouched = sweep_first_record(text, kind, originals, labels, third)
    assert kept >= untouched
    print(
        f"{kind}, {third} in the third record: {kept} records kept over the first record's sweep, {untouched} untouched"
    )


def release(kind: str) -> tuple[str, list[str], list[str]]:
    """A small release file as released (`indent=1`), its records as `canonical` text, and their labels."""
    if kind == "array":
        records = llava_records()
        originals, labels = [canonical(r) for r in records], [f"index {k}" for k in range(len(records))]
    else:
        records = rexvqa_records()
        originals, labels = [canonical(r) for r in records.values()], list(records)
    return json.dumps(records, indent=1, allow_nan=True), originals, labels
