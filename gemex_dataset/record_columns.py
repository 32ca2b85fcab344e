"""Every GEMeX record checked and staged a batch at a time, the per-type layout parsed by Arrow's JSON reader.

A per-type file's question type is its name, so each block of lines is parsed by Arrow
against one explicit schema (`release_schema`). A row that passes `rows.row_rules` and what
of the schema Arrow does not check itself (`_schema_holds`) is staged a column at a time
(`staged_rows`). Every other line (and every line of a block Arrow refuses), and every
record of the other layouts, is read a record at a time (`records.read_per_type`,
`records.read_file`, which check the schema), then put in the same columns and given the
same rules (`checked`): a record that fails one is rejected with its file, record and field,
the others are staged by the same `staged_rows`. Rows come out in release order either way.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.assembly.report import Reject
from builders.columns import empty_lists, offsets, rows_with, true, valid
from builders.json_blocks import BLOCK_BYTES, LineBlock, line_blocks, read_block
from builders.json_stream import name_not_utf8
from builders.row_rules import batches, first_broken, holding, in_order, typed_column
from gemex_dataset.features import QUESTION_TYPES
from gemex_dataset.records import (
    PATH_PATTERN,
    PER_TYPE_FILES,
    RawQuestion,
    SourceFile,
    path_ids,
    read_file,
    read_per_type,
)
from gemex_dataset.rows import CHOICE_TYPES, LETTERS, row_rules
from schemas import schema

BATCH_RECORDS = 8192
"""Records read a record at a time that are checked and staged together."""
REQUIRED = tuple(schema("gemex_per_type")["required"])
"""The fields every per-type record must hold, as its JSON Schema says."""


def release_schema(question_type: str) -> pa.Schema:
    """The per-type record's fields as Arrow holds them for a question of `question_type`."""
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
) -> Iterator[pa.Table | Reject]:
    """Every question of one annotation file as staged rows (tables) and rejects, in release order.

    Per-type files are read through Arrow, the other layouts a record at a time. `digest`
    (`builders.provenance.keyed_digest`) is given the file's bytes: as Arrow's blocks are read,
    or for the other layouts read once more.
    """
    if src.layout != "per_type" or src.split is None or name_not_utf8(src.path) or src.path.stat().st_size == 0:
        yield from checked(src, read_file(src))
        if digest is not None:
            for _ in line_blocks(src.path, block_bytes, digest.update):
                pass
        return
    qtype = PER_TYPE_FILES[src.path.name]
    for block, table in _parsed_blocks(src, qtype, block_bytes, digest):
        if table is None:
            yield from checked(src, read_per_type(src, block.lines()))
            continue
        batch = pa.record_batch([column.combine_chunks() for column in table.columns], schema=table.schema)
        clean = _schema_holds(batch, qtype) & holding(row_rules(qtype), batch, batch.num_rows)
        kept = batch if clean.all() else batch.filter(pa.array(clean))
        lines = pa.array(block.first_line + np.flatnonzero(clean))
        staged = staged_rows(kept, qtype, src, pc.binary_join_element_wise("line ", pc.cast(lines, pa.string()), ""))
        if clean.all():
            yield staged
            continue
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
        # An open or closed question with a `choices` key is rejected; Arrow cannot tell it from one without.
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


def _in_release_order(
    src: SourceFile, block: LineBlock, staged: pa.Table, clean: np.ndarray
) -> Iterator[pa.Table | Reject]:
    """The block's clean rows, and between them its other lines read a record at a time, all in line order."""
    dirty = np.flatnonzero(~clean)
    numbers = set((block.first_line + dirty).tolist())
    others, outcomes = _checked_batch(src, list(read_per_type(src, ((n, b) for n, b in block.lines() if n in numbers))))
    line_outcomes: list[Reject | None] = [None] * len(clean)
    for line, outcome in zip(dirty.tolist(), outcomes):
        line_outcomes[line] = outcome
    if others.num_rows:  # lines the columns could not vouch for that passed: their rows go among the clean ones
        from_clean = clean[[outcome is None for outcome in line_outcomes]]
        order = np.empty(len(from_clean), dtype=np.int64)
        order[from_clean], order[~from_clean] = np.arange(staged.num_rows), staged.num_rows + np.arange(others.num_rows)
        staged = pa.concat_tables([staged, others]).take(pa.array(order))
    yield from in_order(staged, line_outcomes)


def checked(src: SourceFile, items: Iterable[RawQuestion | Reject]) -> Iterator[pa.Table | Reject]:
    """What a record-at-a-time reader gave, in order: its questions that pass the rules as staged rows, the rest rejected."""
    for batch in batches(items, BATCH_RECORDS):
        yield from in_order(*_checked_batch(src, batch))


def _checked_batch(src: SourceFile, items: list[RawQuestion | Reject]) -> tuple[pa.Table, list[Reject | None]]:
    """The staged rows of the questions among `items` that pass the rules, in order; and per item its reject,
    or None for a question staged."""
    outcomes: list[Reject | None] = [item if isinstance(item, Reject) else None for item in items]
    tables, at, of_types = [], [], {}
    for k, item in enumerate(items):
        if isinstance(item, RawQuestion):
            of_types.setdefault(item.question_type, []).append(k)
    for qtype, of_type in of_types.items():
        questions = [items[k] for k in of_type]
        records = [q.data for q in questions]
        batch = pa.RecordBatch.from_arrays(
            [typed_column([r.get(f.name) for r in records], f.type)[0] for f in release_schema(qtype)],
            schema=release_schema(qtype),
        )
        ok, broken = first_broken(row_rules(qtype), batch, records)
        for row, (field, reason) in broken.items():
            outcomes[of_type[row]] = Reject(questions[row].file, questions[row].record, field, reason)
        kept = pa.array(ok)
        where = pa.array([q.record for q in questions], pa.string()).filter(kept)
        tables.append(staged_rows(batch.filter(kept), qtype, src, where))
        at.extend(np.asarray(of_type)[ok].tolist())
    if not tables:  # rejects alone (the file's name may not even be text Arrow can hold)
        return pa.table({}), outcomes
    return pa.concat_tables(tables).take(pa.array(np.argsort(at, kind="stable"), pa.int64())), outcomes


def _schema_holds(batch: pa.RecordBatch, question_type: str) -> np.ndarray:
    """Whether each row Arrow parsed certainly passes what of the schema its parse does not check (nulls,
    lengths, patterns); a row that may not is read a record at a time, where the schema says why."""
    ok = np.ones(batch.num_rows, dtype=bool)
    for name in REQUIRED:
        ok &= valid(batch[name])
    for name in ("question", "image_path"):
        ok &= true(pc.greater(pc.binary_length(batch[name]), 0))
    ok &= true(pc.match_substring_regex(batch["row_id"], "^row_[0-9]+$"))
    regions = batch["visual_regions"]
    ok &= ~rows_with(regions, ~valid(pc.list_flatten(regions)))
    if question_type in CHOICE_TYPES:
        count = pc.list_value_length(batch["choices"]).fill_null(0).to_numpy()
        ok &= (count >= 2) & (count <= len(LETTERS))
    return ok


def _path_ids(paths: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The subject, study and dicom ids `PATH_PATTERN` names in each path (null where it does not match).

    Matched, then cut at its slashes and last dot: several times faster than extracting the
    pattern's groups. Where a path is not ASCII or holds a line break, Python's `re` and Arrow's
    RE2 may read the pattern apart, so such paths are matched by `records.path_ids` itself.
    """
    if not (true(pc.string_is_ascii(paths)) & ~true(pc.match_substring(paths, "\n"))).all():
        return tuple(pa.array(ids, pa.string()) for ids in zip(*map(path_ids, paths.to_pylist())))
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


def staged_rows(table: pa.RecordBatch, qtype: str, src: SourceFile, records: pa.Array) -> pa.Table:
    """The staged columns of questions of `qtype` from `src` that passed the rules; `records` names where each is."""
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
    regions = table["visual_regions"]
    if regions.null_count:
        regions = pc.if_else(valid(regions), regions, empty_lists(n))

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
            "regions": regions,
            "boxes_224": boxes_224,
            "report": table["ori_report"],
            "source_layout": pa.repeat(src.layout, n),
            "row_id": table["row_id"],
            "q_id": table["q_id"],
            "_file": pa.repeat(str(src.path), n),
            "_record": records,
        }
    )
