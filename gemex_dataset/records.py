"""Readers for the three GEMeX layouts (formats.md), auto-detected file by file.

Every reader turns a file into `RawQuestion`s, one per question that passes its layout's
schema, or `Reject`s for what cannot be read; the row rules come after
(`record_columns.checked`). Each question keeps where it came from, so a rejection names
the file and the record.
"""

from __future__ import annotations

import ast
import codecs
import csv
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from builders.assembly.lifecycle import release_files
from builders.assembly.report import Reject
from builders.json_stream import NAME_NOT_UTF8, Damage, LineError, RecordStream, loads_line, name_not_utf8, open_text
from gemex_dataset.features import LLAVA_Q_TYPES, QUESTION_TYPES
from schemas import first_error

PER_TYPE_FILES = {f"{t}_question.jsonl": t for t in QUESTION_TYPES}
QUESTION_TYPE_OF_LLAVA = {q_type: t for t, q_type in LLAVA_Q_TYPES.items()}
"""The question type named by a LLaVA record's `q_type` (or a grouped record's key)."""
PATH_PATTERN = r"^p(?P<group>[0-9]{2})/p(?P<subject>[0-9]+)/s(?P<study>[0-9]+)/(?P<dicom>[^/]+)\.(?:jpg|jpeg|png|dcm)$"
"""A MIMIC-CXR-JPG image path, case aside; written for both Python's `re` and Arrow's RE2 (`record_columns`)."""
_PATH = re.compile(PATH_PATTERN, re.I)
GROUPED_FIELDS = ("question", "choices", "answer", "reason", "visual_regions", "visual_locations")
"""The per-type fields a question of the grouped layout holds (its schema lets others pass, which are not read)."""
_DECODER = json.JSONDecoder()
SPLIT_FOLDERS = {
    "train": "train",
    "valid": "validation",
    "validation": "validation",
    "val": "validation",
    "test": "test",
}


@dataclass
class RawQuestion:
    """One released question, in the fields of the per-type layout whatever its own layout."""

    file: str
    record: str
    question_type: str
    data: dict


@dataclass
class SourceFile:
    path: Path
    layout: str
    split: str | None
    csv: Path | None = None
    problems: list[str] = field(default_factory=list)


def split_of(path: Path) -> str | None:
    """The split named by the nearest `train`/`valid`/`validation`/`test` folder above `path`."""
    for part in reversed(path.parent.parts):
        if part.lower() in SPLIT_FOLDERS:
            return SPLIT_FOLDERS[part.lower()]
    return None


def path_ids(image_path: str) -> tuple[str | None, str | None, str | None]:
    """(subject_id, study_id, dicom_id) from 'p10/p10046166/s50051329/<dicom_id>.jpg'; None where the path differs."""
    match = _PATH.match(image_path)
    if not match:
        return None, None, None
    return match["subject"], match["study"], match["dicom"]


def _grouped_csv(path: Path) -> Path | None:
    stem_match = [c for c in path.parent.glob("*.csv") if c.stem.split("_")[0] == path.stem.split("_")[0]]
    candidates = stem_match or list(path.parent.glob("*.csv"))
    return candidates[0] if len(candidates) == 1 else None


def find_source_files(source: Path, split: str | None = None) -> list[SourceFile]:
    """The annotation files under `source` (a folder or one file), with their layout and split."""
    paths = [source] if source.is_file() else release_files(source)
    found = []
    for path in paths:
        if path.name in PER_TYPE_FILES:
            layout = "per_type"
        elif path.suffix == ".json":
            layout = "llava"
        elif path.suffix == ".jsonl":
            layout = "grouped"
        else:
            continue
        found.append(SourceFile(path, layout, SPLIT_FOLDERS.get(split.lower(), split) if split else split_of(path)))
        if layout == "grouped":
            found[-1].csv = _grouped_csv(path)
    return found


def json_line(file: str, number: int, raw: bytes) -> dict | Reject | None:
    """The object on one line, or a reject saying why there is none; None for a blank line."""
    if not raw.removeprefix(codecs.BOM_UTF8).strip():
        return None
    try:
        value = loads_line(raw)
    except LineError as err:
        return Reject(file, f"line {number}", err.field, str(err))
    if not isinstance(value, dict):
        return Reject(file, f"line {number}", None, f"expected a JSON object, got {type(value).__name__}")
    return value


def _schema_error(name: str, record: object) -> tuple[str | None, str] | None:
    try:
        return first_error(name, record)
    except RecursionError:
        return None, "JSON nested too deeply to check"


def per_type_question(src: SourceFile, number: int, value: dict | Reject) -> RawQuestion | Reject:
    """One line of a per-type file as a question, once its object passes the schema."""
    if isinstance(value, Reject):
        return value
    error = _schema_error("gemex_per_type", value)
    if error:
        return Reject(str(src.path), f"line {number}", error[0], error[1])
    return RawQuestion(str(src.path), f"line {number}", PER_TYPE_FILES[src.path.name], value)


def read_per_type(src: SourceFile, lines: Iterable[tuple[int, bytes]] | None = None) -> Iterator[RawQuestion | Reject]:
    """The questions on `lines` (number, bytes) of a per-type file, every line by default, a record at a time: each
    line stands alone, so a bad one costs only itself (`gemex_dataset.record_columns` reads whole blocks of lines
    through Arrow, and falls back on this for the lines it cannot vouch for)."""
    if lines is None:
        with open(src.path, "rb") as f:
            yield from read_per_type(src, enumerate(f, start=1))
        return
    for number, raw in lines:
        value = json_line(str(src.path), number, raw)
        if value is not None:
            yield per_type_question(src, number, value)


_HUMAN = re.compile(r"^<image>\n(?P<question>[\s\S]*?)(?: <choices>: \[(?P<choices>[\s\S]*)\])?$")
_GPT = re.compile(r"^<answer> (?P<answer>[\s\S]*?) <reason> (?P<reason>[\s\S]*) <location> (?P<boxes>\[[\s\S]*\])\s*$")


def split_llava_choices(text: str) -> list[str]:
    """'A: x, B: y, C: z' -> ['A: x', 'B: y', 'C: z'], cutting only before the next expected letter."""
    choices, start, letter = [], 0, "B"
    while (cut := text.find(f", {letter}: ", start)) != -1:
        choices.append(text[start:cut])
        start, letter = cut + 2, chr(ord(letter) + 1)
    return choices + [text[start:]]


def parse_llava(record: dict) -> dict:
    """The per-type fields carried by one LLaVA conversation record (it has no region names, content type, report
    or q_id); raises ValueError naming the part that does not parse."""
    human = _HUMAN.match(record["conversations"][0]["value"])
    gpt = _GPT.match(record["conversations"][1]["value"])
    if not human:
        raise ValueError("conversations[0].value", "human turn is not '<image>\\n{question}[ <choices>: [...]]'")
    if not gpt:
        raise ValueError("conversations[1].value", "gpt turn is not '<answer> ... <reason> ... <location> [[...]]'")
    answer = gpt["answer"]
    if record["q_type"] == "multi_choice_questions":
        try:
            answer = ast.literal_eval(answer)
        except (ValueError, SyntaxError):
            raise ValueError(
                "conversations[1].value", f"multi-choice answer {answer!r} is not a list of letters"
            ) from None
    try:
        boxes = json.loads(gpt["boxes"])
    except json.JSONDecodeError:
        raise ValueError("conversations[1].value", f"location {gpt['boxes']!r} is not a JSON list of boxes") from None
    data = {"question": human["question"], "answer": answer, "reason": gpt["reason"], "visual_locations": boxes}
    if human["choices"] is not None:
        data["choices"] = split_llava_choices(human["choices"])
    return data | {"image_path": record["image"], "row_id": f"row_{record['row_id']}"}


def read_llava(src: SourceFile) -> Iterator[RawQuestion | Reject]:
    """The conversation records of one LLaVA JSON array, read one at a time (`builders.json_stream`):
    a damaged region or a cut costs only the records it touches."""
    file = str(src.path)
    with open_text(src.path) as f:
        for item in RecordStream(f, "array"):
            if isinstance(item, Damage):
                yield Reject(file, item.record, item.field, item.reason)
                continue
            where, record = item
            error = _schema_error("gemex_llava", record)
            if error:
                yield Reject(file, where, error[0], error[1])
                continue
            try:
                data = parse_llava(record)
            except ValueError as err:
                yield Reject(file, where, err.args[0], err.args[1])
                continue
            yield RawQuestion(file, where, QUESTION_TYPE_OF_LLAVA[record["q_type"]], data)


def _csv_paths(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if rows and "mimic_image_file_path" not in rows[0]:
        raise ValueError(f"{path}: no column 'mimic_image_file_path'")
    return [row["mimic_image_file_path"] for row in rows]


def _image_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(line number, CSV row, bytes) of each line that is not blank: the k-th such line is the k-th row's image."""
    with open(path, "rb") as f:
        lines = (line for line in enumerate(f, start=1) if line[1].removeprefix(codecs.BOM_UTF8).strip())
        for row, (number, raw) in enumerate(lines):
            yield number, row, raw


def _grouped_line(file: str, number: int, raw: bytes) -> dict | Reject:
    value = json_line(file, number, raw)
    if isinstance(value, Reject):
        return value
    error = _schema_error("gemex_grouped", value)
    return Reject(file, f"line {number}", error[0], error[1]) if error else value


def _first_misaligned(src: SourceFile, paths: list[str]) -> int:
    """The first line from which lines and CSV rows may part, when their counts differ: the first line that is
    not one image's questions (a line cut in two, two run together) or whose CSV row is not one image path;
    line 1 where none is (a row lost from the CSV leaves no trace)."""

    for number, row, raw in _image_lines(src.path):
        if row >= len(paths):
            break
        if path_ids(paths[row].removeprefix("files/").lstrip("/"))[0] is None or isinstance(
            _grouped_line(str(src.path), number, raw), Reject
        ):
            return number
    return 1


@dataclass
class RunTogether:
    """One line that holds two lines run together (a newline lost): its number and its two lines' bytes."""

    number: int
    halves: tuple[bytes, bytes]


def _run_together(src: SourceFile, lines: int, rows: int) -> RunTogether | None:
    """The line holding two lines run together, where that alone makes the file one line short of the CSV's rows.

    It is so only where the file has one line fewer than the CSV rows, exactly one of its lines
    is not JSON, and that line is two whole JSON values one after the other: then every line
    before it is its CSV row's, its values the next two rows', and every line after it the row after
    its own. Python's json finds where the first value ends (`raw_decode`), so the cut is the only one.
    """
    if lines != rows - 1:
        return None
    found = None
    for number, _, raw in _image_lines(src.path):
        try:
            loads_line(raw)
        except LineError:
            if found is not None:
                return None
            found = RunTogether(number, _two_values(raw))
    return found if found is not None and found.halves[0] else None


def _two_values(raw: bytes) -> tuple[bytes, bytes]:
    """`raw` cut after its first whole JSON value where what follows is one whole JSON value too; else (b"", raw)."""
    try:
        text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8")
        lead = len(text) - len(text.lstrip(" \t"))
        _, end = _DECODER.raw_decode(text, lead)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
        return b"", raw
    first, second = text[:end].encode(), text[end:].encode()
    try:
        loads_line(first), loads_line(second)
    except LineError:
        return b"", raw
    return first, second


def read_grouped(src: SourceFile) -> Iterator[RawQuestion | Reject]:
    """The questions of a grouped JSON Lines file: the k-th line that is not blank is the image of the CSV's k-th row.

    The lines name no image, so a line and its image are tied by position alone. Where the file has
    another number of lines than the CSV has rows (a newline lost, or one added inside a line), the
    lines from the first one where they may part (`_first_misaligned`) are rejected, each naming its
    line: their images cannot be told, and a question is never put on another image. Where one line
    holds two lines run together and that alone accounts for the count (`_run_together`), its two
    values are read as the two rows they stand for and every line after it as the row after its own.
    """
    file = str(src.path)
    if src.csv is None:
        yield Reject(
            file, None, None, "no single CSV with column 'mimic_image_file_path' beside this grouped JSON Lines file"
        )
        return
    try:
        paths = _csv_paths(src.csv)
    except (ValueError, UnicodeDecodeError) as err:
        yield Reject(str(src.csv), None, None, str(err))
        return
    lines = sum(1 for _ in _image_lines(src.path))
    run_together = None if lines == len(paths) else _run_together(src, lines, len(paths))
    parted = sys.maxsize if lines == len(paths) or run_together else _first_misaligned(src, paths)
    for number, row, raw in _image_lines(src.path):
        if number >= parted:
            yield Reject(
                file,
                f"line {number}",
                "mimic_image_file_path",
                f"{lines} lines for the {len(paths)} rows of {src.csv.name}, which may part from line {parted} on: "
                "the image of this line's questions cannot be told",
            )
            continue
        if run_together is None or number < run_together.number:
            yield from _grouped_row(src, f"line {number}", number, row, raw, paths)
        elif number == run_together.number:
            for half, which in zip(run_together.halves, ("first", "second"), strict=True):
                yield from _grouped_row(
                    src, f"line {number} ({which} of two lines run together)", number, row, half, paths
                )
                row += 1
        else:
            yield from _grouped_row(src, f"line {number}", number, row + 1, raw, paths)


def _grouped_row(
    src: SourceFile, where: str, number: int, row: int, raw: bytes, paths: list[str]
) -> Iterator[RawQuestion | Reject]:
    """The questions of one line (`where` names it), the image of the CSV's row `row`."""
    value = _grouped_line(str(src.path), number, raw)
    if isinstance(value, Reject):
        yield replace(value, record=where)
        return
    yield from _grouped_questions(src, where, row, value, paths[row].removeprefix("files/").lstrip("/"))


def _grouped_questions(src: SourceFile, where: str, row: int, value: dict, image_path: str) -> Iterator[RawQuestion]:
    """The questions of one line, in the per-type fields it has (no content type, report or q_id)."""
    for group, items in value.items():
        for k, qa in enumerate(items):
            data = {key: qa[key] for key in GROUPED_FIELDS if key in qa} | {
                "image_path": image_path,
                "row_id": f"row_{row}",
            }
            yield RawQuestion(str(src.path), f"{where}, {group}[{k}]", QUESTION_TYPE_OF_LLAVA[group], data)


READERS = {"per_type": read_per_type, "llava": read_llava, "grouped": read_grouped}


def read_file(src: SourceFile) -> Iterator[RawQuestion | Reject]:
    """Every question of one annotation file, or the reasons it could not be read."""
    if shown := name_not_utf8(src.path):
        yield Reject(shown, None, None, NAME_NOT_UTF8)
        return
    if src.split is None:
        yield Reject(
            str(src.path),
            None,
            None,
            "cannot tell the split: put the file in a train/valid/test folder or pass --split",
        )
        return
    if src.path.stat().st_size == 0:
        yield Reject(str(src.path), None, None, "empty file: no records")
        return
    yield from READERS[src.layout](src)
