"""Reader for the ReXVQA release: `metadata/{train,valid,test}_vqa_data.json`.

Each file is one JSON object mapping a question id to its record, read one record at a
time (`builders.json_stream`; Python's json reads the bare `NaN` tokens the release may
hold). The reader yields one `RawRecord` per question that passes the schema
(`schemas/rexvqa_record.json`) and a `Reject` for everything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builders.assembly.report import Reject
from builders.json_stream import NAME_NOT_UTF8, Damage, RecordStream, name_not_utf8, open_text
from rexvqa_dataset.features import SPLIT_FILES
from schemas import first_error


@dataclass
class RawRecord:
    """One released question: the file it came from, its id (the object key), its split and its raw value."""

    file: str
    question_id: str
    split: str
    data: dict

    @property
    def record(self) -> str:
        """Where the record is in its file, as a reject names it: its question id."""
        return self.question_id


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


def read_file(path: Path, split: str) -> Iterator[RawRecord | Reject]:
    """The questions of one `*_vqa_data.json` file, in file order, each checked against the schema.

    The file is read record by record (`builders.json_stream.RecordStream`): a damaged region
    (bad JSON, bad UTF-8, nesting too deep) is one reject naming the record it touches, and
    reading goes on at the next question id.
    """
    if shown := name_not_utf8(path):
        yield Reject(shown, None, None, NAME_NOT_UTF8)
        return
    file, seen = str(path), set()
    with open_text(path) as f:
        for item in RecordStream(f, "object"):
            yield stream_reject(file, item, seen) or checked_record(file, *item, split)


def stream_reject(file: str, item: Damage | tuple[str, object], seen: set[str]) -> Reject | None:
    """The reject of a stream item that is no record to check (damage, not an object, an id the file already had), else None.

    A question id is remembered in `seen` once it names an object.
    """
    if isinstance(item, Damage):
        return Reject(file, item.record, item.field, item.reason)
    question_id, record = item
    if not isinstance(record, dict):
        return Reject(file, str(question_id), None, f"expected a JSON object, got {type(record).__name__}")
    if question_id in seen:
        return Reject(file, str(question_id), None, "the same question id twice in one file (first kept)")
    seen.add(question_id)
    return None


def checked_record(file: str, question_id: str, record: dict, split: str) -> RawRecord | Reject:
    """The record checked against the schema: a `RawRecord`, or a reject naming the first field that fails."""
    try:
        error = first_error("rexvqa_record", record)
    except RecursionError:
        return Reject(file, question_id, None, "JSON nested too deeply to check")
    if error:
        return Reject(file, question_id, error[0], error[1])
    return RawRecord(file, question_id, split, record)
