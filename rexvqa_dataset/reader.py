"""Reader for the ReXVQA release: `metadata/{train,valid,test}_vqa_data.json`.

Each file is one JSON object mapping a question id to its record, read one record at a
time. Python's json reads the bare `NaN` tokens the release may hold (strict JSON
parsers do not). The reader
yields one `RawRecord` per question that passes the schema (`schemas/rexvqa_record.json`)
and a `Reject` for everything else; a file that cannot be parsed at all is one reject.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from builders.build.report import Reject
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


class _ObjectStream:
    """Reads a JSON object's members one at a time, holding one member's text in memory at most.

    A release file is one object of up to hundreds of thousands of records; `json.load`
    would hold all of them as Python objects at once. `json.JSONDecoder` (which, like the
    release, allows bare `NaN`) decodes each member from a buffer refilled as needed.
    """

    _SPACE = re.compile(r"\s*")

    def __init__(self, file: TextIO, block: int = 1 << 20):
        self.file, self.block = file, block
        self.decoder = json.JSONDecoder()
        self.text, self.pos, self.consumed, self.eof = "", 0, 0, False

    def _more(self) -> bool:
        data = self.file.read(self.block)
        if not data:
            self.eof = True
            return False
        self.consumed += self.pos
        self.text, self.pos = self.text[self.pos:] + data, 0
        return True

    def peek(self) -> str:
        while True:
            self.pos = self._SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self._more():
                return self.text[self.pos:self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise json.JSONDecodeError(f"expected {char!r}", self.text, self.pos)
        self.pos += 1

    def value(self) -> object:
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError:
                if self._more():
                    continue
                raise
            if end == len(self.text) and self._more():  # a number may go on in the next block
                continue
            self.pos = end
            return value

    def offset(self) -> int:
        return self.consumed + self.pos

    def members(self) -> Iterator[tuple[object, object]]:
        self.expect("{")
        if self.peek() == "}":
            return
        while True:
            key = self.value()
            self.expect(":")
            yield key, self.value()
            if self.peek() == "}":
                return
            self.expect(",")


def read_file(path: Path, split: str) -> Iterator[RawRecord | Reject]:
    """The questions of one `*_vqa_data.json` file, in file order, each checked against the schema.

    The file is read member by member; where it stops parsing (bad JSON, bad UTF-8), the
    records read so far stand and the rest of the file is one reject.
    """
    file, seen = str(path), set()
    with open(path, encoding="utf-8") as f:
        stream = _ObjectStream(f)
        try:
            for question_id, record in stream.members():
                yield _checked(file, question_id, record, split, seen)
        except UnicodeDecodeError as err:
            yield Reject(file, None, None, f"file is not valid UTF-8 (byte {err.start} of a block read after character {stream.offset()}); "
                                           "the records after that point cannot be read")
        except json.JSONDecodeError as err:
            where = stream.consumed + err.pos
            what = "expected a JSON object keyed by question id" if where == 0 else f"malformed JSON at character {where}: {err.msg}"
            yield Reject(file, None, None, f"{what}; the records after that point cannot be read")


def _checked(file: str, question_id: object, record: object, split: str, seen: set[str]) -> RawRecord | Reject:
    if not isinstance(record, dict):
        return Reject(file, str(question_id), None, f"expected a JSON object, got {type(record).__name__}")
    if question_id in seen:
        return Reject(file, str(question_id), None, "the same question id twice in one file (first kept)")
    seen.add(question_id)
    error = first_error("rexvqa_record", record)
    if error:
        return Reject(file, question_id, error[0], error[1])
    return RawRecord(file, question_id, split, record)
