"""The per-type layout read a column at a time: Arrow's JSON reader, then the checks as whole-column operations.

A per-type file's question type is its name, so each block of lines is parsed by Arrow
against one explicit schema (`release_schema`). `clean_rows` asks of every row what the
schema and `gemex_dataset.rows.question_row` ask, and `staged_rows` turns the rows that
pass into the staged columns `question_row` would give them. Both are deliberately
stricter than the record path: a row they cannot vouch for (and every line of a block
Arrow refuses) goes through `records.per_type_question` and `question_row` instead, which
keep or reject it with the file, line and field. Rows come out in release order either way.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.assembly.report import Reject
from builders.columns import empty_lists, offsets, positions, rows_with, true, valid
from builders.json_blocks import BLOCK_BYTES, LineBlock, line_blocks, read_block
from builders.json_stream import name_not_utf8
from gemex_dataset.features import QUESTION_TYPES
from gemex_dataset.records import (
    PATH_PATTERN,
    PER_TYPE_FILES,
    RawQuestion,
    SourceFile,
    json_line,
    per_type_question,
    read_file,
)
from gemex_dataset.rows import FAR_OUTSIDE
from schemas import schema

CHOICE_TYPES = ("single_choice", "multi_choice")
LETTERS = pa.array([chr(65 + k) for k in range(26)])
CHOICE_PREFIXES = pa.array([f"{chr(65 + k)}: " for k in range(26)])
REQUIRED = tuple(schema("gemex_per_type")["required"])
"""The fields every per-type record must hold, as its JSON Schema says."""


def release_schema(question_type: str) -> pa.Schema:
    """The per-type record's fields as Arrow parses them from a file of `question_type`."""
    return pa.schema(
        [
            ("question", pa.string()),
            ("choices", pa.list_(pa.string())),
            ("type", pa.string()),
            ("answer", pa.list_(pa.string()) if question_type == "multi_choice" else pa.string()),
            ("reason", pa.string()),
            ("visual_regions", pa.list_(pa.string())),
            ("visual_locations", pa.list_(pa.list_(pa.float64()))),
            ("image_path", pa.string()),
            ("ori_report", pa.string()),
            ("q_id", pa.int64()),
            ("row_id", pa.string()),
        ]
    )


def read(
    src: SourceFile, block_bytes: int = BLOCK_BYTES, digest: hmac.HMAC | None = None
) -> Iterator[pa.Table | RawQuestion | Reject]:
    """Every question of one annotation file: per-type files through Arrow, the other layouts a record at a time.

    Tables hold staged rows (`staged_rows`); the questions and rejects between them are those
    the record path read, in release order. `digest` (`builders.provenance.keyed_digest`) is
    given the file's bytes: as Arrow's blocks are read, or for the other layouts read once more.
    """
    if src.layout != "per_type" or src.split is None or name_not_utf8(src.path) or src.path.stat().st_size == 0:
        yield from read_file(src)
        if digest is not None:
            for _ in line_blocks(src.path, block_bytes, digest.update):
                pass
        return
    qtype = PER_TYPE_FILES[src.path.name]
    for block, table in _parsed_blocks(src, qtype, block_bytes, digest):
        if table is None:
            yield from _by_record(src, block.lines())
            continue
        batch = pa.record_batch([column.combine_chunks() for column in table.columns], schema=table.schema)
        clean = clean_rows(batch, qtype)
        kept = batch if clean.all() else batch.filter(pa.array(clean))
        staged = staged_rows(kept, src, block.first_line + np.flatnonzero(clean))
        yield from _in_release_order(src, block, staged, clean)


def _parsed_blocks(
    src: SourceFile, qtype: str, block_bytes: int, digest: hmac.HMAC | None
) -> Iterator[tuple[LineBlock, pa.Table | None]]:
    """The file's blocks, each with its rows as Arrow parsed them (None: to be read a record at a time).

    The next block is read and parsed in the background while the caller checks this one: Arrow's
    reader lets go of the GIL, so the parse overlaps the checks rather than waiting for them.
    """
    schema = release_schema(qtype)
    blocks = line_blocks(src.path, block_bytes, digest.update if digest is not None else None)

    def next_parsed() -> tuple[LineBlock, pa.Table | None] | None:
        block = next(blocks, None)
        if block is None:
            return None
        # An open or closed question with a `choices` key is rejected by the record path; Arrow cannot tell it from one without.
        maybe_choices = qtype not in CHOICE_TYPES and b'"choices"' in block.data
        return block, None if maybe_choices else read_block(block, schema)

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="json-blocks") as pool:
            ahead = pool.submit(next_parsed)
            while (parsed := ahead.result()) is not None:
                ahead = pool.submit(next_parsed)
                yield parsed
    finally:
        blocks.close()


def _by_record(src: SourceFile, lines: Iterator[tuple[int, bytes]]) -> Iterator[RawQuestion | Reject]:
    for number, raw in lines:
        value = json_line(str(src.path), number, raw)
        if value is not None:
            yield per_type_question(src, number, value)


def _in_release_order(
    src: SourceFile, block: LineBlock, staged: pa.Table, clean: np.ndarray
) -> Iterator[pa.Table | RawQuestion | Reject]:
    """The staged runs of clean rows, and between them the other lines read a record at a time."""
    dirty = np.flatnonzero(~clean)
    if not len(dirty):
        yield staged
        return
    numbers = set((block.first_line + dirty).tolist())
    lines = [(number, raw) for number, raw in block.lines() if number in numbers]
    start = 0
    for k, (row, line) in enumerate(zip(dirty.tolist(), lines)):
        if row > start:
            yield staged.slice(start - k, row - start)
        yield from _by_record(src, iter([line]))
        start = row + 1
    if start < len(clean):
        yield staged.slice(start - len(dirty))


def clean_rows(table: pa.RecordBatch, question_type: str) -> np.ndarray:
    """Whether each row certainly passes the schema and `question_row`, with no note beyond unknown regions."""
    ok = np.ones(table.num_rows, dtype=bool)
    for name in REQUIRED:
        ok &= valid(table[name])
    ok &= true(pc.greater(pc.binary_length(table["question"]), 0))
    ok &= true(pc.match_substring_regex(table["row_id"], "^row_[0-9]+$"))
    ok &= _image_paths_ok(table["image_path"])
    ok &= _choices_and_answers_ok(table, question_type)
    boxes_ok, box_counts = _boxes_ok(table["visual_locations"])
    ok &= boxes_ok
    regions = table["visual_regions"]
    ok &= ~rows_with(regions, ~valid(pc.list_flatten(regions)))
    ok &= pc.list_value_length(regions).fill_null(-1).to_numpy() == box_counts
    return ok


def _image_paths_ok(paths: pa.Array) -> np.ndarray:
    """Non-empty, ASCII and one line: where Python's `re` and Arrow's RE2 read `PATH_PATTERN` alike."""
    return (
        true(pc.greater(pc.binary_length(paths), 0))
        & true(pc.string_is_ascii(paths))
        & ~true(pc.match_substring(paths, "\n"))
    )


def _choices_and_answers_ok(table: pa.RecordBatch, question_type: str) -> np.ndarray:
    choices, answer = table["choices"], table["answer"]
    if question_type not in CHOICE_TYPES:
        ok = ~valid(choices)
        return ok & (
            true(pc.is_in(answer, pa.array(["Yes.", "No."]))) if question_type == "closed_ended" else valid(answer)
        )
    count = pc.list_value_length(choices).fill_null(0).to_numpy()
    ok = (count >= 2) & (count <= len(LETTERS))
    items = pc.list_flatten(choices)
    expected = CHOICE_PREFIXES.take(pa.array(np.minimum(positions(choices), len(LETTERS) - 1)))
    ok &= ~rows_with(choices, ~true(pc.equal(pc.utf8_slice_codeunits(items, 0, 3), expected)))
    if question_type == "single_choice":
        letter = pc.index_in(answer, LETTERS)
        return ok & valid(letter) & (pc.fill_null(letter, 99).to_numpy() < count)
    letters = pc.list_flatten(answer)
    parents = pc.list_parent_indices(answer).to_numpy()
    index = pc.fill_null(pc.index_in(letters, LETTERS), 99).to_numpy().astype(np.int64)
    ok &= ~rows_with(answer, (index >= count[parents]))
    seen = np.zeros(table.num_rows, dtype=np.int64)
    np.bitwise_or.at(seen, parents, np.left_shift(1, np.minimum(index, 62)))
    length = pc.list_value_length(answer).fill_null(0).to_numpy()
    return ok & (length > 0) & (np.bitwise_count(seen) == length)


def _boxes_ok(boxes: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(rows whose boxes are all four finite numbers, x2 > x1, y2 > y1, not far outside the 224 frame; boxes per row)."""
    counts = pc.list_value_length(boxes).fill_null(-2).to_numpy()
    inner = pc.list_flatten(boxes)
    four = true(pc.equal(pc.list_value_length(inner), 4))
    ok = ~rows_with(boxes, ~four)
    corners = pc.list_flatten(inner.filter(pa.array(four))).to_numpy(zero_copy_only=False).reshape(-1, 4)
    x1, y1, x2, y2 = corners.T
    with np.errstate(invalid="ignore"):
        good = (
            np.isfinite(corners).all(axis=1)
            & (x2 > x1)
            & (y2 > y1)
            & (np.minimum(x1, y1) >= -FAR_OUTSIDE)
            & (np.maximum(x2, y2) <= 224 + FAR_OUTSIDE)
        )
    bad = np.zeros(len(inner), dtype=bool)
    bad[np.flatnonzero(four)[~good]] = True
    return ok & ~rows_with(boxes, bad), counts


def _path_ids(paths: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The subject, study and dicom ids `PATH_PATTERN` names in each path (null where it does not match).

    Matched, then cut at its slashes and last dot: several times faster than extracting the
    pattern's groups, and the same for the paths `_image_paths_ok` lets through.
    """
    matched = pc.match_substring_regex(paths, PATH_PATTERN, ignore_case=True)
    parts = pc.split_pattern(paths.filter(matched), "/")
    found = (
        pc.utf8_slice_codeunits(pc.list_element(parts, 1), 1),
        pc.utf8_slice_codeunits(pc.list_element(parts, 2), 1),
        pc.list_element(pc.split_pattern(pc.list_element(parts, 3), ".", max_splits=1, reverse=True), 0),
    )
    if len(found[0]) == len(paths):
        return found
    nulls = pa.nulls(len(paths), pa.string())
    return tuple(pc.replace_with_mask(nulls, matched, ids) for ids in found)


def staged_rows(table: pa.RecordBatch, src: SourceFile, lines: np.ndarray) -> pa.Table:
    """The staged columns of rows that passed `clean_rows`, as `question_row` makes them."""
    qtype = PER_TYPE_FILES[src.path.name]
    n = table.num_rows
    # an image's questions sit on consecutive lines: its path is cleaned and cut once, then spread to its rows
    encoded = table["image_path"].dictionary_encode()
    image_paths = pc.replace_substring_regex(encoded.dictionary, "^(?:files/)?/*", "")
    paths, subject, study, dicom = (column.take(encoded.indices) for column in (image_paths, *_path_ids(image_paths)))
    choices, answer = table["choices"], table["answer"]
    if qtype in CHOICE_TYPES:
        choice_texts = pa.ListArray.from_arrays(
            offsets(pc.list_value_length(choices).to_numpy()), pc.utf8_slice_codeunits(pc.list_flatten(choices), 3)
        )
    else:
        choice_texts = empty_lists(n)
    if qtype == "multi_choice":
        letters = answer
        answer = pc.binary_join_element_wise('["', pc.binary_join(answer, '", "'), '"]', "")
    elif qtype == "single_choice":
        letters = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), answer)
    else:
        letters = empty_lists(n)
    boxes = table["visual_locations"]
    corners = np.rint(pc.list_flatten(pc.list_flatten(boxes)).to_numpy()).astype(np.int32)
    boxes_224 = pa.ListArray.from_arrays(
        offsets(pc.list_value_length(boxes).to_numpy()), pa.FixedSizeListArray.from_arrays(pa.array(corners), 4)
    )

    return pa.table(
        {
            "image_path": paths,
            "subject_id": subject,
            "study_id": study,
            "dicom_id": dicom,
            "split": pa.repeat(src.split, n),
            "question_type": pa.array(np.full(n, QUESTION_TYPES.index(qtype), dtype=np.int64)),
            "content_type": table["type"],
            "question": table["question"],
            "choices": choice_texts,
            "answer": answer,
            "answer_letters": letters,
            "reason": table["reason"],
            "regions": table["visual_regions"],
            "boxes_224": boxes_224,
            "report": table["ori_report"],
            "source_layout": pa.repeat("per_type", n),
            "row_id": table["row_id"],
            "q_id": table["q_id"],
            "_file": pa.repeat(str(src.path), n),
            "_record": pc.binary_join_element_wise("line ", pc.cast(pa.array(lines), pa.string()), ""),
        }
    )
