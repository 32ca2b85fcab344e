"""From a released question to a typed row, and back.

`row_rules` are the checks the schema cannot make (choice letters, answers against choices,
box geometry, regions against boxes), each stated once over a batch of records in the
per-type fields (`record_columns.release_schema`) with the reject of a row that fails it;
`record_columns` applies them to every record read, whatever its layout. `raw_record`
writes a row back in the layout it came from, with the same content, which is what the
round-trip test holds the build to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.columns import in_lettered_order, rows_with, true, valid
from builders.row_rules import RowRule
from gemex_dataset.features import LLAVA_Q_TYPES, QUESTION_TYPES
from gemex_dataset.prompts import TYPE_PROMPTS

FAR_OUTSIDE = 22
"""Pixels (10% of the 224 frame) a box may reach past the frame before it is rejected rather than clipped."""
CHOICE_TYPES = ("single_choice", "multi_choice")
LETTERS = pa.array([chr(65 + k) for k in range(26)])
CHOICE_PREFIXES = pa.array([f"{chr(65 + k)}: " for k in range(26)])


def _letters(record: dict) -> str:
    """The letters of a record's choices: 'ABCD' for four."""
    return "".join(chr(65 + k) for k in range(len(record.get("choices") or [])))


def _choice_count(batch: pa.RecordBatch) -> np.ndarray:
    return pc.list_value_length(batch["choices"]).fill_null(0).to_numpy()


def _answer_letter_in_range(batch: pa.RecordBatch) -> np.ndarray:
    letter = pc.index_in(batch["answer"], LETTERS)
    return valid(letter) & (pc.fill_null(letter, 99).to_numpy() < _choice_count(batch))


def _letters_known_once(batch: pa.RecordBatch) -> np.ndarray:
    """Every letter of a multi-choice answer is one of the choices', and none comes twice."""
    answer = batch["answer"]
    parents = pc.list_parent_indices(answer).to_numpy()
    index = pc.fill_null(pc.index_in(pc.list_flatten(answer), LETTERS), 99).to_numpy().astype(np.int64)
    known = np.ones(batch.num_rows, dtype=bool)
    known[parents[index >= _choice_count(batch)[parents]]] = False
    seen = np.zeros(batch.num_rows, dtype=np.int64)
    np.bitwise_or.at(seen, parents, np.left_shift(1, np.minimum(index, 62)))
    return known & (np.bitwise_count(seen) == pc.list_value_length(answer).fill_null(0).to_numpy())


def _box_corners(boxes: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per box: whether it is four numbers, and its corners (NaN for a box that is not)."""
    inner = pc.list_flatten(boxes)
    numbers = pc.list_flatten(inner)
    four = true(pc.equal(pc.list_value_length(inner), 4))
    if numbers.null_count:
        four &= ~rows_with(inner, ~valid(numbers))
    if four.all():
        return four, numbers.to_numpy(zero_copy_only=False).reshape(-1, 4)
    corners = np.full((len(inner), 4), np.nan)
    corners[four] = pc.list_flatten(inner.filter(pa.array(four))).to_numpy(zero_copy_only=False).reshape(-1, 4)
    return four, corners


def _box_rule(test: Callable[..., np.ndarray], fault: str) -> RowRule:
    """A rule on each box, `test(four, x1, y1, x2, y2)` over all boxes at once (`four`: the box is four numbers)."""

    def holds(batch: pa.RecordBatch) -> tuple[pa.Array, np.ndarray]:
        four, corners = _box_corners(batch["visual_locations"])
        with np.errstate(invalid="ignore"):
            return batch["visual_locations"], test(four, *corners.T)

    return RowRule("visual_locations", holds, lambda box, k: f"box {box} {fault}", per_item=True)


def _answer_rules(question_type: str) -> tuple[RowRule, ...]:
    name = question_type.replace("_", "-")
    if question_type == "closed_ended":
        return (
            RowRule(
                "answer",
                lambda b: true(pc.is_in(b["answer"], pa.array(["Yes.", "No."]))),
                lambda r: f"closed-ended answer must be 'Yes.' or 'No.', got {r['answer']!r}",
            ),
        )
    if question_type == "open_ended":
        return (
            RowRule(
                "answer",
                lambda b: valid(b["answer"]),
                lambda r: f"open-ended answer must be text, got {type(r['answer']).__name__}",
            ),
        )
    needs_choices = RowRule("choices", lambda b: _choice_count(b) > 0, lambda r: f"a {name} question needs choices")
    if question_type == "single_choice":
        return (
            needs_choices,
            RowRule(
                "answer",
                _answer_letter_in_range,
                lambda r: f"answer {r['answer']!r} is not one of the choices' letters {_letters(r)}",
            ),
        )
    return (
        needs_choices,
        RowRule(
            "answer",
            lambda b: pc.list_value_length(b["answer"]).fill_null(0).to_numpy() > 0,
            lambda r: f"multi-choice answer must be a non-empty list of letters, got {r['answer']!r}",
        ),
        RowRule(
            "answer",
            _letters_known_once,
            lambda r: f"answer {r['answer']!r} has letters not among the choices {_letters(r)} or repeats one",
        ),
    )


@cache
def row_rules(question_type: str) -> tuple[RowRule, ...]:
    """The checks of a record of `question_type`, in the order a reject names the first that fails."""
    name = question_type.replace("_", "-")
    no_choices = (
        ()
        if question_type in CHOICE_TYPES
        else (RowRule("choices", lambda b: _choice_count(b) == 0, lambda r: f"a {name} question has no choices"),)
    )
    return (
        RowRule(
            "choices",
            lambda b: (b["choices"], in_lettered_order(b["choices"], CHOICE_PREFIXES)),
            lambda choice, k: f"expected '{chr(65 + k)}: <text>', got {choice!r}",
            per_item=True,
        ),
        *no_choices,
        *_answer_rules(question_type),
        RowRule(
            "visual_locations",
            lambda b: valid(b["visual_locations"]),
            lambda r: f"expected a list of boxes [x1, y1, x2, y2], got {r['visual_locations']!r}",
        ),
        _box_rule(lambda four, *corners: four, "is not four numbers"),
        _box_rule(
            lambda four, *corners: np.isfinite(corners).all(axis=0), "has a coordinate that is not a finite number"
        ),
        _box_rule(lambda four, x1, y1, x2, y2: (x2 > x1) & (y2 > y1), "has x2 <= x1 or y2 <= y1"),
        _box_rule(
            lambda four, x1, y1, x2, y2: (
                (np.minimum(x1, y1) >= -FAR_OUTSIDE) & (np.maximum(x2, y2) <= 224 + FAR_OUTSIDE)
            ),
            "lies far outside the 224 x 224 frame",
        ),
        RowRule(
            "visual_regions",
            lambda b: (
                ~valid(b["visual_regions"])
                | (
                    pc.list_value_length(b["visual_regions"]).to_numpy(zero_copy_only=False)
                    == pc.list_value_length(b["visual_locations"]).fill_null(-1).to_numpy()
                )
            ),
            lambda r: (
                f"{len(r['visual_regions'])} regions for {len(r['visual_locations'])} boxes; they must be parallel"
            ),
        ),
    )


def _question_type(row: dict) -> str:
    qtype = row["question_type"]
    return QUESTION_TYPES[qtype] if isinstance(qtype, int) else qtype


def _answer(row: dict):
    return json.loads(row["answer"]) if _question_type(row) == "multi_choice" else row["answer"]


def _choices(row: dict) -> list[str]:
    return [f"{chr(65 + k)}: {text}" for k, text in enumerate(row["choices"])]


def raw_record(row: dict, layout: str) -> dict:
    """The row written back as a record of `layout` (`per_type`, `llava`, or one QA of `grouped`)."""
    qtype = _question_type(row)
    if layout == "per_type":
        record = {"question": row["question"]}
        if qtype in ("single_choice", "multi_choice"):
            record["choices"] = _choices(row)
        record.update(
            {
                "type": row["content_type"],
                "answer": _answer(row),
                "reason": row["reason"],
                "visual_regions": row["regions"],
                "visual_locations": row["boxes_224"],
                "image_path": row["image_path"],
                "ori_report": row["report"],
                "q_id": row["q_id"],
                "row_id": row["row_id"],
            }
        )
        return record
    if layout == "llava":
        human = f"<image>\n{row['question']}"
        if row["choices"]:
            human += " <choices>: [" + ", ".join(_choices(row)) + "]"
        answer = repr(_answer(row)) if qtype == "multi_choice" else row["answer"]
        gpt = f"<answer> {answer} <reason> {row['reason']} <location> {json.dumps(row['boxes_224'])}"
        return {
            "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
            "row_id": int(row["row_id"].removeprefix("row_")),
            "q_type": LLAVA_Q_TYPES[qtype],
            "type_prompt": TYPE_PROMPTS[qtype],
            "image": row["image_path"],
        }
    if layout == "grouped":
        record = {"question": row["question"]}
        if row["choices"]:
            record["choices"] = _choices(row)
        record.update({"answer": _answer(row), "reason": row["reason"], "visual_locations": row["boxes_224"]})
        if row["regions"]:
            record["visual_regions"] = row["regions"]
        return record
    raise ValueError(f"unknown layout {layout!r}; expected per_type, llava or grouped")
