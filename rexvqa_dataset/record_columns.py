"""ReXVQA records checked and converted a batch at a time: one Arrow array per raw key, then whole-column checks.

The release is one pretty-printed JSON object keyed by question id, which Arrow's JSON
reader cannot split, so records are still parsed one at a time (`builders.json_stream`).
What follows the parse is columnar: each raw key of a batch becomes one typed Arrow array
(`raw_columns`), and a record that passes `rows.ROW_RULES` and what the schema asks
(`clean_rows`) with nothing for `extra` or the report to note is staged by `staged_rows`.
Every other record goes through the schema (`records.checked_record`) and then the same
rules (`checked`): one that fails a rule is rejected with its file, question id and field,
one that passes is converted by `rows.question_row`. Rows come out in file order either way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.assembly.report import Reject
from builders.columns import rows_with, true, valid
from builders.json_stream import RecordStream, name_not_utf8, open_text
from builders.row_rules import batches, first_broken, holding, in_order, typed_column
from rexvqa_dataset.features import LETTERS, TASKS
from rexvqa_dataset.records import RawRecord, checked_record, read_file, stream_reject
from rexvqa_dataset.rows import NAMED_KEYS, REPORT_FIELDS, ROW_RULES, TEXT_FIELDS, YEARS_PER_UNIT, aligned_views
from schemas import schema

BATCH_RECORDS = 8192
LIST_KEYS = ("options", "ImagePath", "ImageViewPosition", "ImageModality")
RAW_TYPES: dict[str, pa.DataType] = {
    key: pa.string() for key in (*TEXT_FIELDS, *REPORT_FIELDS, "correct_answer", "task_name")
}
RAW_TYPES |= {key: pa.list_(pa.string()) for key in LIST_KEYS} | {"validation_code": pa.int64()}
REQUIRED = tuple(schema("rexvqa_record")["required"])
"""The keys every record must hold, as its JSON Schema says."""
VIEWS_KEPT = "_views_kept_in_extra"
"""A column of the yielded tables (not staged): rows whose views went to `extra`, for the build report's notice."""
RULE_KEYS = ("options", *REPORT_FIELDS)
"""The raw keys `ROW_RULES` read."""
_RAW_VALUES = itemgetter(*RAW_TYPES)
_EXTRA_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=True)
"""What `json.dumps(..., ensure_ascii=False, allow_nan=True)` writes (`rows.question_row`), without a new encoder per row."""
_AGE_RE2 = r"^(?P<number>\d{3})(?P<unit>[DWMY])$"


def read(
    path: Path, split: str, batch_records: int = BATCH_RECORDS, seen: set[str] | None = None
) -> Iterator[pa.Table | RawRecord | Reject]:
    """The questions of one `*_vqa_data.json` file in file order: staged rows as tables, the rest as `records.read_file` gives them.

    `seen` (empty) is filled with the file's question ids, for the caller to find them in later files.
    """
    if name_not_utf8(path):
        yield from read_file(path, split)
        return
    file, seen = str(path), set() if seen is None else seen
    pending: list[tuple[str, dict] | RawRecord | Reject] = []
    with open_text(path) as f:
        for item in RecordStream(f, "object"):
            reject = stream_reject(file, item, seen)
            pending.append(reject or (item if _plain(item[1]) else checked_record(file, *item, split)))
            if len(pending) >= batch_records:
                yield from _in_file_order(file, split, pending)
                pending = []
    yield from _in_file_order(file, split, pending)


def _plain(record: dict) -> bool:
    """Whether a record may be converted a column at a time: every named key present, lists and the code of their JSON type.

    Arrow would read a string as a list of its characters, and a float as a truncated integer.
    """
    return (
        record.keys() >= NAMED_KEYS
        and all(type(record[key]) is list for key in LIST_KEYS)
        and (record["validation_code"] is None or type(record["validation_code"]) is int)
    )


def _in_file_order(file: str, split: str, pending: list) -> Iterator[pa.Table | RawRecord | Reject]:
    """The batch's candidates converted; runs of clean rows as tables, and between them the other items checked."""
    at = [k for k, item in enumerate(pending) if type(item) is tuple]
    if not at:
        yield from _ruled(pending)
        return
    candidates = [pending[k] for k in at]
    columns = raw_columns([record for _, record in candidates])
    ids, bad_ids = typed_column([question_id for question_id, _ in candidates], pa.string())
    clean = clean_rows(columns) & ~columns.unconvertible & ~bad_ids
    views_kept = views_not_one_per_image(columns)
    extra, bad_extra = typed_column(
        [
            _extra(record, keep_views) if ok else None
            for (_, record), ok, keep_views in zip(candidates, clean.tolist(), views_kept.tolist())
        ],
        pa.string(),
    )
    clean &= ~bad_extra & valid(extra)
    keep = pa.array(clean)
    staged = staged_rows(
        {key: column.filter(keep) for key, column in columns.arrays.items()},
        ids.filter(keep),
        extra.filter(keep),
        split,
        file,
    )
    staged = staged.append_column(VIEWS_KEPT, pa.array(views_kept[clean]))
    for k, ok in zip(at, clean.tolist()):
        pending[k] = None if ok else checked_record(file, *pending[k], split)
    yield from in_order(staged, _ruled(pending))


def checked(items: Iterable[RawRecord | Reject]) -> Iterator[RawRecord | Reject]:
    """Records read one at a time (`records.read_file`) given `ROW_RULES`: one that fails a rule rejected, naming its field."""
    for batch in batches(items, BATCH_RECORDS):
        yield from _ruled(batch)


def _ruled(items: list) -> list:
    """`items` with each `RawRecord` that fails one of `ROW_RULES` replaced by its reject."""
    at = [k for k, item in enumerate(items) if isinstance(item, RawRecord)]
    if not at:
        return items
    records = [items[k].data for k in at]
    _, broken = first_broken(ROW_RULES, raw_columns(records, RULE_KEYS), records)
    for row, (field, reason) in broken.items():
        items[at[row]] = Reject(items[at[row]].file, items[at[row]].question_id, field, reason)
    return items


@dataclass
class RawColumns:
    """A batch of records as one Arrow array per raw key; per key the values that do not fit it (null in the array),
    and the rows holding any such value or a JSON null in a report field (which is not the NaN the row gives back)."""

    arrays: dict[str, pa.Array]
    misfit: dict[str, np.ndarray]
    unconvertible: np.ndarray

    def __getitem__(self, key: str) -> pa.Array:
        return self.arrays[key]


def raw_columns(records: list[dict], keys: tuple[str, ...] = tuple(RAW_TYPES)) -> RawColumns:
    """The records' values of `keys` (a missing key read as null unless all are asked, which every record must hold),
    report NaN read as null."""
    values = (
        zip(*map(_RAW_VALUES, records)) if len(keys) == len(RAW_TYPES) else ([r.get(k) for r in records] for k in keys)
    )
    arrays, misfit, unconvertible = {}, {}, np.zeros(len(records), dtype=bool)
    for key, column in zip(keys, values):
        arrays[key], misfit[key] = typed_column(column, RAW_TYPES[key], from_pandas=key in REPORT_FIELDS)
        unconvertible |= misfit[key]
        if key in REPORT_FIELDS and None in column:
            unconvertible |= np.array([value is None for value in column], dtype=bool)
    return RawColumns(arrays, misfit, unconvertible)


def views_not_one_per_image(columns: dict[str, pa.Array]) -> np.ndarray:
    """Rows whose `ImageViewPosition` is not one view per `ImagePath`: stored aligned, and kept as released in `extra`."""
    return ~true(
        pc.equal(pc.list_value_length(columns["ImageViewPosition"]), pc.list_value_length(columns["ImagePath"]))
    )


def _extra(record: dict, keep_views: bool) -> str | None:
    """`extra` of a clean row: the keys the schema does not name, in release order (`rows.record_differences`); None if too deep."""
    try:
        return _EXTRA_JSON.encode({key: record[key] for key in _extra_keys(tuple(record), keep_views)})
    except RecursionError:
        return None


@lru_cache(maxsize=256)
def _extra_keys(keys: tuple[str, ...], keep_views: bool) -> tuple[str, ...]:
    """The keys of a record with these keys that go to `extra` (a release has few key layouts, so this is cached)."""
    return tuple(key for key in keys if key not in NAMED_KEYS or (keep_views and key == "ImageViewPosition"))


def clean_rows(columns: RawColumns) -> np.ndarray:
    """Whether each row certainly passes the schema and `ROW_RULES` with nothing for `extra` or the report to note.

    Stricter on purpose: an unknown task or an odd age sends the row to the record path, which
    notes them.
    """
    ok = holding(ROW_RULES, columns, len(columns["question"]))
    for key in REQUIRED:
        ok &= valid(columns[key])
    for key in ("question", "task_name", "study_id"):
        ok &= true(pc.greater(pc.binary_length(columns[key]), 0))
    ok &= true(pc.equal(pc.list_value_length(columns["options"]), len(LETTERS)))
    ok &= true(pc.is_in(columns["correct_answer"], pa.array(list(LETTERS))))
    ok &= true(pc.is_in(columns["task_name"], pa.array(TASKS)))
    paths = columns["ImagePath"]
    ok &= true(pc.greater(pc.list_value_length(paths), 0))
    ok &= ~rows_with(paths, ~true(pc.greater(pc.binary_length(pc.list_flatten(paths)), 0)))
    age = columns["PatientAge"]
    ok &= ~valid(age) | true(pc.match_substring_regex(age, _AGE_RE2))
    code = columns["validation_code"]
    ok &= ~valid(code) | true(pc.and_(pc.greater_equal(code, -(2**31)), pc.less(code, 2**31)))
    return ok


def _aligned_views(views: pa.Array, paths: pa.Array) -> pa.Array:
    """`rows.aligned_views` of each row: its views padded with null (or cut) to one per image."""
    counts = pc.list_value_length(paths).to_numpy()
    if np.array_equal(pc.list_value_length(views).to_numpy(), counts):
        return views
    return pa.array([aligned_views(v, n) for v, n in zip(views.to_pylist(), counts.tolist())], views.type)


def staged_rows(columns: dict[str, pa.Array], ids: pa.Array, extra: pa.Array, split: str, file: str) -> pa.Table:
    """The staged columns of rows that passed `clean_rows`, as `question_row` makes them."""
    n = len(ids)
    options = columns["options"]
    texts = pa.ListArray.from_arrays(
        pa.array(np.arange(n + 1, dtype=np.int32) * len(LETTERS)), pc.utf8_slice_codeunits(pc.list_flatten(options), 3)
    )
    age = pc.extract_regex(columns["PatientAge"], _AGE_RE2)
    years_per_unit = pc.index_in(pc.struct_field(age, "unit"), pa.array(list(YEARS_PER_UNIT)))
    factor = np.array(list(YEARS_PER_UNIT.values()))[pc.fill_null(years_per_unit, 0).to_numpy()]
    number = pc.cast(pc.struct_field(age, "number"), pa.int64()).to_numpy(zero_copy_only=False)
    years = pa.array(number * factor, mask=~valid(age))

    return pa.table(
        {
            "question_id": ids,
            "image_paths": columns["ImagePath"],
            "view_positions": _aligned_views(columns["ImageViewPosition"], columns["ImagePath"]),
            "options": texts,
            "answer": columns["correct_answer"],
            "answer_index": pc.index_in(columns["correct_answer"], pa.array(list(LETTERS))),
            "task_name": pc.index_in(columns["task_name"], pa.array(TASKS)),
            "task_name_raw": columns["task_name"],
            "patient_age_years": years,
            "image_modality": columns["ImageModality"],
            "validation_code": columns["validation_code"],
            "split": pa.repeat(split, n),
            **{column: columns[key] for key, column in (TEXT_FIELDS | REPORT_FIELDS).items()},
            "extra": extra,
            "_file": pa.repeat(file, n),
        }
    )
