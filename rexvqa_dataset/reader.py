"""Reader for the ReXVQA release: `metadata/{train,valid,test}_vqa_data.json`.

Each file is one JSON object mapping a question id to its record. Python's json reads
the bare `NaN` tokens the release may hold (strict JSON parsers do not). The reader
yields one `RawRecord` per question that passes the schema (`schemas/rexvqa_record.json`)
and a `Reject` for everything else; a file that cannot be parsed at all is one reject.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builders.report import Reject
from rexvqa_dataset.features import SPLIT_FILES
from schemas import first_error


@dataclass
class RawRecord:
    """One released question: the file it came from, its id (the object key), its split and its raw value."""

    file: str
    question_id: str
    split: str
    data: dict


def metadata_folder(source: Path) -> Path:
    """The folder holding the `*_vqa_data.json` files: `source` itself, its `metadata/`, or a file's folder."""
    source = Path(source)
    if source.is_file():
        return source.parent
    if not any((source / name).exists() for name in SPLIT_FILES) and (source / "metadata").is_dir():
        return source / "metadata"
    return source


def find_source_files(source: Path, split: str | None = None) -> list[tuple[Path, str]]:
    """(file, split) for each ReXVQA file under `source`, in train, validation, test order."""
    source = Path(source)
    if source.is_file():
        return [(source, split or SPLIT_FILES.get(source.name, "train"))]
    folder = metadata_folder(source)
    return [(folder / name, split or named) for name, named in SPLIT_FILES.items() if (folder / name).is_file()]


def _load(path: Path) -> object | Reject:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError as err:
        return Reject(str(path), None, None, f"file is not valid UTF-8 (byte {err.start}); none of its records can be read")
    except json.JSONDecodeError as err:
        return Reject(str(path), None, None, f"malformed JSON at line {err.lineno} column {err.colno}: {err.msg}; none of its records can be read")


def read_file(path: Path, split: str) -> Iterator[RawRecord | Reject]:
    """The questions of one `*_vqa_data.json` file, in file order, each checked against the schema."""
    value = _load(path)
    if isinstance(value, Reject):
        yield value
        return
    if not isinstance(value, dict):
        yield Reject(str(path), None, None, f"expected a JSON object keyed by question id, got {type(value).__name__}")
        return
    for question_id, record in value.items():
        if not isinstance(record, dict):
            yield Reject(str(path), question_id, None, f"expected a JSON object, got {type(record).__name__}")
            continue
        error = first_error("rexvqa_record", record)
        if error:
            yield Reject(str(path), question_id, error[0], error[1])
        else:
            yield RawRecord(str(path), question_id, split, record)
