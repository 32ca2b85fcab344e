"""A raw record's checks, each stated once: a column-wise test over a batch, and the reject of a row that fails it.

A dataset declares its rules as a sequence of `RowRule`s. The column readers ask a whole batch
at once (`holding`); a row that fails is rejected with the first rule it fails, its field and
reason written from that row's own raw values (`first_broken`), so one statement serves the
fast path and the precise reject alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.assembly.report import Reject
from builders.columns import positions, rows_with


@dataclass(frozen=True)
class RowRule:
    """One check: `holds(batch)` says per row whether it passes; `reason(record)` why a row fails it.

    A rule `per_item` checks the items of the list in raw key `field`: `holds(batch)` gives that
    list column and whether each of its flattened items passes, `reason(item, k)` why item `k`
    fails, and the reject names `field[k]`, the row's first failing item.
    """

    field: str
    holds: Callable[[Any], Any]
    reason: Callable[..., str]
    per_item: bool = False

    def rows(self, batch: Any) -> np.ndarray:
        """Whether each row of the batch passes."""
        if not self.per_item:
            return self.holds(batch)
        lists, items = self.holds(batch)
        return ~rows_with(lists, ~items)

    def broken(self, batch: Any, rows: np.ndarray, records: Sequence[dict]) -> Iterator[tuple[str, str]]:
        """(field, reason) for each of `rows` (which fail this rule), from its raw record."""
        if not self.per_item:
            for row in rows.tolist():
                yield self.field, self.reason(records[row])
            return
        lists, items = self.holds(batch)
        bad = np.flatnonzero(~items)
        parents = pc.list_parent_indices(lists).to_numpy()[bad]
        first = dict(zip(parents[::-1].tolist(), positions(lists)[bad][::-1].tolist()))
        for row in rows.tolist():
            k = first[row]
            yield f"{self.field}[{k}]", self.reason(records[row][self.field][k], k)


def holding(rules: Sequence[RowRule], batch: Any, rows: int) -> np.ndarray:
    """Whether each of the batch's `rows` passes every rule."""
    ok = np.ones(rows, dtype=bool)
    for rule in rules:
        ok &= rule.rows(batch)
    return ok


def first_broken(rules: Sequence[RowRule], batch: Any, records: Sequence[dict]) -> tuple[np.ndarray, dict[int, tuple]]:
    """Whether each row passes every rule; and for each row that does not, (field, reason) of the first it fails."""
    first = np.full(len(records), -1)
    for k, rule in enumerate(rules):
        first[(first < 0) & ~rule.rows(batch)] = k
    broken = {}
    for k in np.unique(first[first >= 0]).tolist():
        rows = np.flatnonzero(first == k)
        broken.update(zip(rows.tolist(), rules[k].broken(batch, rows, records)))
    return first < 0, broken


def typed_column(values: Sequence, type_: pa.DataType, from_pandas: bool = False) -> tuple[pa.Array, np.ndarray]:
    """`values` as one Arrow array of `type_`, and which of them do not fit it (null in the array).

    A value fits a list type only as a list: Arrow would read a string as a list of its characters.
    """
    misfit = np.zeros(len(values), dtype=bool)
    if pa.types.is_list(type_):
        misfit = np.fromiter((v is not None and type(v) is not list for v in values), bool, len(values))
    try:
        if not misfit.any():
            return pa.array(values, type_, from_pandas=from_pandas), misfit
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    misfit |= np.array([not b and not _fits(v, type_, from_pandas) for v, b in zip(values, misfit)], dtype=bool)
    return pa.array([None if b else v for v, b in zip(values, misfit)], type_, from_pandas=from_pandas), misfit


def _fits(value: object, type_: pa.DataType, from_pandas: bool) -> bool:
    try:
        pa.array([value], type_, from_pandas=from_pandas)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True


def batches(items: Iterable, size: int) -> Iterator[list]:
    """`items` in lists of `size` (the last may be shorter, none is empty)."""
    items = iter(items)
    while batch := list(islice(items, size)):
        yield batch


def in_order(staged: pa.Table, outcomes: Sequence[Reject | None]) -> Iterator[pa.Table | Reject]:
    """Rows and rejects in release order: `outcomes` holds a reject, or None for the next row of `staged`."""
    start = taken = 0
    for k, outcome in enumerate(outcomes):
        if outcome is None:
            continue
        if k > start:
            yield staged.slice(taken, k - start)
            taken += k - start
        yield outcome
        start = k + 1
    if taken < staged.num_rows:
        yield staged.slice(taken)
