"""From a released question to a typed row, and back.

`question_row` checks what the schema cannot (answers against choices, box geometry,
regions against boxes) and returns the row's text columns; the build adds the image
columns. `raw_record` writes a row back in the layout it came from, with the same
content, which is what the round-trip test holds the build to.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from builders.assembly.report import RecordError
from gemex_dataset.anatomy import REGIONS
from gemex_dataset.features import LLAVA_Q_TYPES, QUESTION_TYPES
from gemex_dataset.prompts import TYPE_PROMPTS
from gemex_dataset.records import RawQuestion, path_ids

FAR_OUTSIDE = 22
"""Pixels (10% of the 224 frame) a box may reach past the frame before it is rejected rather than clipped."""

_CHOICE = re.compile(r"^(?P<letter>[A-Z]): (?P<text>[\s\S]*)$")
_KNOWN_REGIONS = frozenset(REGIONS)


@dataclass
class RowNotes:
    """What a row's conversion noticed without rejecting it, for the build report."""

    unknown_regions: list[str]
    boxes_out_of_frame: int


def choice_texts(choices: list[str]) -> list[str]:
    """['A: Left lung', 'B: Spine'] -> ['Left lung', 'Spine'], checking the letters run A, B, C..."""
    texts = []
    for k, choice in enumerate(choices):
        match = _CHOICE.match(choice)
        if not match or match["letter"] != chr(65 + k):
            raise RecordError(f"choices[{k}]", f"expected '{chr(65 + k)}: <text>', got {choice!r}")
        texts.append(match["text"])
    return texts


def answer_letters(question_type: str, answer: object, choices: list[str]) -> list[str]:
    letters = [chr(65 + k) for k in range(len(choices))]
    if question_type == "closed_ended":
        if answer not in ("Yes.", "No."):
            raise RecordError("answer", f"closed-ended answer must be 'Yes.' or 'No.', got {answer!r}")
        return []
    if question_type == "open_ended":
        if not isinstance(answer, str):
            raise RecordError("answer", f"open-ended answer must be text, got {type(answer).__name__}")
        return []
    if not choices:
        raise RecordError("choices", f"a {question_type.replace('_', '-')} question needs choices")
    if question_type == "single_choice":
        if not isinstance(answer, str) or answer not in letters:
            raise RecordError("answer", f"answer {answer!r} is not one of the choices' letters {''.join(letters)}")
        return [answer]
    if not isinstance(answer, list) or not answer:
        raise RecordError("answer", f"multi-choice answer must be a non-empty list of letters, got {answer!r}")
    unknown = [a for a in answer if a not in letters]
    if unknown or len(set(answer)) != len(answer):
        raise RecordError(
            "answer", f"answer {answer!r} has letters not among the choices {''.join(letters)} or repeats one"
        )
    return list(answer)


def checked_boxes(boxes: list[list[float]]) -> tuple[list[list[int]], int]:
    """The released boxes as ints, and how many reach outside the 224 frame (to be clipped later)."""
    out, outside = [], 0
    for k, box in enumerate(boxes):
        x1, y1, x2, y2 = box
        if not all(math.isfinite(v) for v in box):
            raise RecordError(f"visual_locations[{k}]", f"box {box} has a coordinate that is not a finite number")
        if x2 <= x1 or y2 <= y1:
            raise RecordError(f"visual_locations[{k}]", f"box {box} has x2 <= x1 or y2 <= y1")
        if min(x1, y1) < -FAR_OUTSIDE or max(x2, y2) > 224 + FAR_OUTSIDE:
            raise RecordError(f"visual_locations[{k}]", f"box {box} lies far outside the 224 x 224 frame")
        outside += min(x1, y1) < 0 or max(x2, y2) > 224
        out.append([round(v) for v in box])
    return out, outside


def question_row(raw: RawQuestion, ordinal: int) -> tuple[dict, RowNotes]:
    """The row's columns other than the image ones (`image`, `image_width`, `image_height`, `boxes`)."""
    data, qtype = raw.data, raw.question_type
    choices = choice_texts(data.get("choices") or [])
    if qtype in ("open_ended", "closed_ended") and choices:
        raise RecordError("choices", f"a {qtype.replace('_', '-')} question has no choices")
    letters = answer_letters(qtype, data["answer"], choices)
    boxes, outside = checked_boxes(data["visual_locations"])
    regions = data["visual_regions"]
    if regions is not None and len(regions) != len(boxes):
        raise RecordError("visual_regions", f"{len(regions)} regions for {len(boxes)} boxes; they must be parallel")
    image_path = data["image_path"].removeprefix("files/").lstrip("/")
    subject, study, dicom = path_ids(image_path)
    key = dicom or image_path.rsplit(".", 1)[0]
    row = {
        "question_id": f"{raw.split}/{key}/{qtype}/{ordinal}",
        "image_path": image_path,
        "subject_id": subject,
        "study_id": study,
        "dicom_id": dicom,
        "split": raw.split,
        "question_type": QUESTION_TYPES.index(qtype),
        "content_type": data["type"],
        "question": data["question"],
        "choices": choices,
        "answer": json.dumps(data["answer"]) if qtype == "multi_choice" else data["answer"],
        "answer_letters": letters,
        "reason": data["reason"],
        "regions": regions or [],
        "boxes_224": boxes,
        "report": data["ori_report"],
        "source_layout": raw.layout,
        "row_id": data["row_id"],
        "q_id": data["q_id"],
    }
    return row, RowNotes([r for r in regions or [] if r not in _KNOWN_REGIONS], outside)


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
