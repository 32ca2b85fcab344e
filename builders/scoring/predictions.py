"""Predictions files: reading, writing and checking them against a split.

One format for both datasets, JSON Lines, one object per line::

    {"question_id": "...", "prediction": "<raw model text>"}

Extra keys are allowed and ignored. For ReXVQA the ReXrank submission layout is read and
written too: one JSON object keyed by question id whose values are the raw records with the
model's reply added as ``model_prediction``.

Checking against a split (`match_to_split`): a question of the split with no prediction is
*missing* and scored as wrong; a question id that is not in the split is *unknown* and
ignored; a question id given twice is a *duplicate* and its first prediction is the one
scored. All three are listed with file and line so that the evaluation report can name them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builders.files import write_text


class PredictionsError(ValueError):
    """A predictions file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Prediction:
    question_id: str
    prediction: str
    line: int
    """1-based line of a JSON Lines file; 0 for the ReXrank layout (one JSON document)."""


@dataclass
class PredictionsCheck:
    """Predictions joined to the questions of a split, with everything that did not fit."""

    source: str
    predictions: dict[str, str]
    missing: list[str] = field(default_factory=list)
    unknown: list[Prediction] = field(default_factory=list)
    duplicates: list[Prediction] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unknown or self.duplicates)

    def problems(self, limit: int = 5) -> list[str]:
        """One readable line per kind of problem, naming the file, ids and lines."""
        lines = []
        if self.missing:
            ids = ", ".join(self.missing[:limit]) + (", ..." if len(self.missing) > limit else "")
            lines.append(
                f"{self.source}: {len(self.missing)} question(s) of the split have no prediction and count as wrong: {ids}"
            )
        if self.unknown:
            shown = ", ".join(f"{p.question_id!r} (line {p.line})" for p in self.unknown[:limit])
            lines.append(
                f"{self.source}: {len(self.unknown)} prediction(s) name a question_id not in the split and are ignored: {shown}"
            )
        if self.duplicates:
            shown = ", ".join(f"{p.question_id!r} (line {p.line})" for p in self.duplicates[:limit])
            lines.append(
                f"{self.source}: {len(self.duplicates)} repeated prediction(s); the first of each is scored, these are ignored: {shown}"
            )
        return lines

    def summary(self) -> dict:
        return {
            "file": self.source,
            "scored": len(self.predictions),
            "missing": self.missing,
            "unknown": [{"question_id": p.question_id, "line": p.line} for p in self.unknown],
            "duplicates": [{"question_id": p.question_id, "line": p.line} for p in self.duplicates],
        }


def _decoded(path: str | Path, data: bytes, first_line: int = 1) -> str:
    """`data` as text (a leading UTF-8 BOM dropped, as the build does); a bad byte is an error naming file and line."""
    try:
        return data.decode("utf-8-sig" if first_line == 1 else "utf-8")
    except UnicodeDecodeError as error:
        line = first_line + data.count(b"\n", 0, error.start)
        raise PredictionsError(f"{path}:{line}: not UTF-8 (byte 0x{data[error.start]:02x}: {error.reason})") from None


def _parsed(path: str | Path, line: int, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise PredictionsError(f"{path}:{line + error.lineno - 1}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise PredictionsError(f"{path}:{line}: JSON nested deeper than the parser reads") from None


def _text(path: str | Path, line: int, name: str, value: str) -> str:
    """`value` checked to be storable text: a lone surrogate (a `\\ud800` escape alone) names file, line and field."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PredictionsError(
            f"{path}{f':{line}' if line else ''}: {name} holds a lone surrogate {value[error.start]!r}, which is not text"
        ) from None
    return value


def read_jsonl(path: str | Path) -> list[Prediction]:
    """Read a predictions JSON Lines file; blank lines are skipped."""
    records = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = _decoded(path, raw, number)
            if not line.strip():
                continue
            record = _parsed(path, number, line)
            if not isinstance(record, dict) or "question_id" not in record or "prediction" not in record:
                raise PredictionsError(
                    f"{path}:{number}: expected an object with 'question_id' and 'prediction'; {_found(record)}"
                )
            records.append(
                Prediction(
                    _text(path, number, "question_id", str(record["question_id"])),
                    _text(path, number, "prediction", _reply_text(record["prediction"])),
                    number,
                )
            )
    return records


def _found(record: object) -> str:
    """What a record that lacks a needed key holds instead, for the error that names it."""
    if not isinstance(record, dict):
        return f"found a JSON {type(record).__name__}"
    keys = ", ".join(repr(key) for key in list(record)[:10]) + (", ..." if len(record) > 10 else "")
    return f"its keys: {keys or 'none'}"


def _reply_text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def read_rexrank(path: str | Path) -> list[Prediction]:
    """Read a ReXrank submission: ``{question_id: {..., "model_prediction": text}}``."""
    document = _parsed(path, 1, _decoded(path, Path(path).read_bytes()))
    if not isinstance(document, dict):
        raise PredictionsError(f"{path}: expected a JSON object keyed by question id (ReXrank layout)")
    records = []
    for question_id, record in document.items():
        if not isinstance(record, dict) or "model_prediction" not in record:
            raise PredictionsError(f"{path}: record {question_id!r} has no 'model_prediction'; {_found(record)}")
        records.append(
            Prediction(
                _text(path, 0, "question_id", str(question_id)),
                _text(path, 0, f"record {question_id!r} model_prediction", _reply_text(record["model_prediction"])),
                0,
            )
        )
    return records


def write_rexrank(path: str | Path, records: Mapping[str, Mapping], predictions: Mapping[str, str]) -> None:
    """Write the ReXrank layout: each raw record (see `rexrank_record`) with its ``model_prediction``
    (an empty string for a question without a prediction)."""
    document = {qid: {**record, "model_prediction": predictions.get(qid, "")} for qid, record in records.items()}
    write_text(path, json.dumps(document, ensure_ascii=False, indent=2))


def rexrank_record(row: Mapping) -> dict:
    """A built ReXVQA row back in the raw record's field names (``options`` with "A. " prefixes,
    ``correct_answer``), plus every key kept in ``extra``; images and ids are left out."""
    record = {
        "question": row.get("question"),
        "options": [f"{chr(65 + i)}. {text}" for i, text in enumerate(row.get("options") or [])],
        "correct_answer": row.get("answer"),
        "task_name": row.get("task_name_raw") or row.get("task_name"),
        "category": row.get("category"),
        "subcategory": row.get("subcategory"),
    }
    for key in ("study_id", "split", "correct_answer_explanation"):
        if row.get(key) is not None:
            record[key] = row[key]
    if row.get("explanation") is not None:
        record["correct_answer_explanation"] = row["explanation"]
    extra = row.get("extra")
    if isinstance(extra, str) and extra:
        record.update({k: v for k, v in json.loads(extra).items() if k not in record})
    return record


def detect_layout(path: str | Path) -> str:
    """``rexrank`` when the file is one JSON object of records with ``model_prediction``, else ``jsonl``."""
    try:
        document = json.loads(Path(path).read_bytes().decode("utf-8-sig"))
    except (
        ValueError,
        RecursionError,
    ):  # not one JSON document (bad bytes included): read by line, which names the line
        return "jsonl"
    if isinstance(document, dict) and "question_id" not in document:
        values = list(document.values())
        if values and all(isinstance(v, dict) for v in values):
            return "rexrank"
    return "jsonl"


def read_predictions(path: str | Path, layout: str = "auto") -> list[Prediction]:
    """Read predictions in `layout` (``jsonl``, ``rexrank`` or ``auto``)."""
    if not Path(path).is_file():
        raise PredictionsError(f"{path}: no such predictions file")
    layout = detect_layout(path) if layout == "auto" else layout
    if layout == "rexrank":
        return read_rexrank(path)
    if layout == "jsonl":
        return read_jsonl(path)
    raise ValueError(f"unknown predictions layout {layout!r}; expected jsonl, rexrank or auto")


def match_to_split(
    records: Sequence[Prediction], question_ids: Sequence[str], source: str = "<predictions>"
) -> PredictionsCheck:
    """Join predictions to a split's questions (missing / unknown / duplicate rules in the module doc)."""
    wanted = set(question_ids)
    check = PredictionsCheck(source=str(source), predictions={})
    for record in records:
        if record.question_id not in wanted:
            check.unknown.append(record)
        elif record.question_id in check.predictions:
            check.duplicates.append(record)
        else:
            check.predictions[record.question_id] = record.prediction
    check.missing = [qid for qid in question_ids if qid not in check.predictions]
    return check
