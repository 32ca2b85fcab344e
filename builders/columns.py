"""Whole-column questions about Arrow arrays, answered as numpy masks: what the column readers
(`gemex_dataset.record_columns`, `rexvqa_dataset.record_columns`) and column-wise prompts ask."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def valid(array: pa.Array) -> np.ndarray:
    """Which values are not null."""
    return pc.is_valid(array).to_numpy(zero_copy_only=False)


def true(array: pa.Array) -> np.ndarray:
    """Which values of a boolean array are true (null counts as false)."""
    return pc.fill_null(array, False).to_numpy(zero_copy_only=False)


def rows_with(lists: pa.Array, bad_items: np.ndarray) -> np.ndarray:
    """Per row of `lists`, whether any of its items is flagged in `bad_items` (parallel to the flattened items)."""
    out = np.zeros(len(lists), dtype=bool)
    out[pc.list_parent_indices(lists).to_numpy()[bad_items]] = True
    return out


def positions(lists: pa.Array) -> np.ndarray:
    """Each flattened item's index within its own list."""
    parents = pc.list_parent_indices(lists).to_numpy()
    return np.arange(len(parents)) - np.searchsorted(parents, parents)


def in_lettered_order(lists: pa.Array, prefixes: pa.Array) -> np.ndarray:
    """Per flattened item of `lists`, whether it starts with the prefix of its position ('A: ', 'B: ', ...);
    none past the last prefix does. The prefixes are all of one length."""
    at = positions(lists)
    expected = prefixes.take(pa.array(np.minimum(at, len(prefixes) - 1)))
    starts = pc.utf8_slice_codeunits(pc.list_flatten(lists), 0, len(prefixes[0].as_py()))
    return true(pc.equal(starts, expected)) & (at < len(prefixes))


def offsets(lengths: np.ndarray) -> pa.Array:
    """The int32 offsets of lists of these lengths laid end to end, for `pa.ListArray.from_arrays`."""
    return pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))


def empty_lists(rows: int, type_: pa.DataType | None = None) -> pa.Array:
    """`rows` empty lists of `type_`."""
    return pa.ListArray.from_arrays(offsets(np.zeros(rows, dtype=np.int32)), pa.array([], type_ or pa.string()))
