"""A split's validated rows (text only) held on disk, then read back sorted by an external merge sort."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.stop_points import stop_point


@dataclass
class Run:
    """`rows` staged rows, from the split's `first`th in release order, written to `path` sorted by the key (stable)."""

    path: Path
    first: int
    rows: int
    source: pa.OSFile | None = None
    reader: pa.ipc.RecordBatchFileReader | None = None
    keys: pa.DictionaryArray | None = None
    """Its rows' keys in release order, dictionary-encoded (an image's path once, not once per question):
    kept so the sort need not read the runs for them."""
    cached: tuple[int, pa.RecordBatch] | None = None
    """The run's batch read last, by number: where one chunk's rows end the next one's begin."""

    def rows_between(self, start: int, stop: int, batch_rows: int) -> list[pa.RecordBatch]:
        """Its sorted rows `start` to `stop`, read from the batches (of `batch_rows`) that hold them."""
        if self.reader is None:
            self.source = pa.OSFile(str(self.path))
            self.reader = pa.ipc.open_file(self.source)
        pieces = []
        for number in range(start // batch_rows, (stop - 1) // batch_rows + 1):
            if self.cached is None or self.cached[0] != number:
                self.cached = number, self.reader.get_batch(number)
            first = number * batch_rows
            begin, end = max(start, first) - first, min(stop, first + batch_rows) - first
            pieces.append(self.cached[1].slice(begin, end - begin))
        return pieces

    def close(self) -> None:
        self.cached = self.reader = None
        if self.source is not None:
            self.source.close()
        self.path.unlink(missing_ok=True)


@dataclass
class SplitStage:
    pending: list[dict] = field(default_factory=list)
    """Rows added one at a time, not yet a batch."""
    tables: list[pa.Table] = field(default_factory=list)
    """Rows not yet in a run, in release order."""
    table_rows: int = 0
    runs: list[Run] = field(default_factory=list)
    rows: int = 0
    writing: Future | None = None
    """The run being sorted and written in the background."""


class Staging:
    """Validated rows (text only), spilled to Arrow IPC files per split, then read back sorted.

    Rows are read in release order but written sorted by image; holding them on disk
    rather than in memory keeps a build's memory flat whatever the release's size.
    """

    BATCH = 2048
    """Rows of a sorted chunk by default: few enough images in flight for a build that loads them."""
    SPILL = 512
    """Rows added one at a time gathered into a table."""
    BUCKET_ROWS = 16_384
    """Rows of a sorted chunk for the builds that read no image bytes: about 15 MB of GEMeX text."""
    RUN_ROWS = 32_768
    """Staged rows sorted in memory and written as one run: about 35 MB of GEMeX text."""
    RUN_BATCH = 128
    """Rows of a run's record batches, the merge's unit of reading: it holds one or two per run."""

    def __init__(self, folder: Path, schema: pa.Schema, key: str):
        self.folder, self.schema, self.key = folder, schema, key
        folder.mkdir(parents=True, exist_ok=True)
        self.stages: dict[str, SplitStage] = {}
        # Sorts and writes a run while the next is read, reads the next sorted chunk while one is written:
        # Arrow lets go of the GIL for both.
        self.background = ThreadPoolExecutor(1, thread_name_prefix="staging")

    def close(self) -> None:
        """Stop the background work (a build that failed leaves runs queued)."""
        self.background.shutdown(cancel_futures=True)

    def add(self, split: str, row: dict) -> None:
        stage = self._stage(split)
        stage.pending.append(row)
        if len(stage.pending) >= self.SPILL:
            self._spill(split, stage)

    def add_table(self, split: str, table: pa.Table) -> None:
        """Stage many rows at once, after the rows added before them (release order is kept)."""
        stage = self._stage(split)
        if stage.pending:
            self._spill(split, stage)
        self._hold(split, stage, table.select(self.schema.names).cast(self.schema))

    def _stage(self, split: str) -> SplitStage:
        if not self.stages:
            stop_point("reading")
        return self.stages.setdefault(split, SplitStage())

    def _spill(self, split: str, stage: SplitStage) -> None:
        self._hold(split, stage, pa.Table.from_pylist(stage.pending, schema=self.schema))
        stage.pending = []

    def _hold(self, split: str, stage: SplitStage, table: pa.Table) -> None:
        stage.tables.append(table)
        stage.table_rows += table.num_rows
        if stage.table_rows >= self.RUN_ROWS:
            self._write_run(split, stage)

    def _write_run(self, split: str, stage: SplitStage) -> None:
        """Hand the held rows to the background, to be written as a run once the run before is."""
        table = pa.concat_tables(stage.tables)
        stage.tables, stage.table_rows = [], 0
        run = Run(self.folder / f"{split}.run-{len(stage.runs)}.arrow", stage.rows, table.num_rows)
        self._written(stage)
        stage.writing = self.background.submit(self._sort_into, run, table)
        stage.runs.append(run)
        stage.rows += table.num_rows

    @staticmethod
    def _written(stage: SplitStage) -> None:
        """Wait for the run being written (its failure raised here)."""
        if stage.writing is not None:
            stage.writing.result()
            stage.writing = None

    def _sort_into(self, run: Run, table: pa.Table) -> None:
        """The rows sorted by the key (stable) into the run's file of `RUN_BATCH`-row batches; their keys kept."""
        run.keys = pc.dictionary_encode(table.column(self.key).combine_chunks())
        table = table.take(pc.sort_indices(table.column(self.key)))
        with pa.ipc.new_file(run.path, self.schema) as writer:
            writer.write_table(table, max_chunksize=self.RUN_BATCH)

    def splits(self) -> list[str]:
        order = {"train": 0, "validation": 1, "test": 2}
        return sorted(self.stages, key=lambda s: (order.get(s, 3), s))

    def sorted_batches(self, split: str, chunk_rows: int | None = None) -> Iterator[pa.Table]:
        """The split's rows sorted by the key (stable), in chunks of about `chunk_rows` (`BATCH`) that never cut a run of equal keys.

        An external merge sort, so memory grows with `RUN_ROWS` and the number of runs, not with
        the split's bytes: only the key column and each row's place are held. Staging wrote the
        rows in runs of `RUN_ROWS`, each sorted; a row's place in the split's sorted order is
        known from the keys alone, so each chunk's rows lie in one stretch of every run, read
        front to back, and are put in order by where each belongs.
        """
        chunk_rows = chunk_rows or self.BATCH
        stage = self.stages[split]
        if stage.pending:
            self._spill(split, stage)
        if stage.tables:
            self._write_run(split, stage)
        self._written(stage)
        codes = self._key_ranks(stage.runs)
        order = np.argsort(codes, kind="stable").astype(np.int32)  # int32: a split of up to 2**31 rows, half the memory
        codes = codes[order]
        bounds = np.append(self._chunk_starts(codes, chunk_rows), len(codes))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order), dtype=np.int32)
        del order, codes
        # Each run's rows' places in the split's order, as the run holds them: increasing, each run sorted stably.
        placed = [np.sort(rank[run.first : run.first + run.rows]) for run in stage.runs]
        del rank
        cuts = np.array([np.searchsorted(places, bounds) for places in placed]).reshape(len(placed), len(bounds))
        chunks = len(bounds) - 1
        ahead = self.background.submit(self._chunk, stage.runs, placed, cuts, bounds, 0) if chunks else None
        try:
            for c in range(chunks):
                table = ahead.result()
                ahead = (
                    self.background.submit(self._chunk, stage.runs, placed, cuts, bounds, c + 1)
                    if c + 1 < chunks
                    else None
                )
                yield table
        finally:
            if ahead is not None and not ahead.cancel():
                wait([ahead])
            for run in stage.runs:
                run.close()

    def _chunk(
        self, runs: list[Run], placed: list[np.ndarray], cuts: np.ndarray, bounds: np.ndarray, c: int
    ) -> pa.Table:
        """The `c`th sorted chunk: rows `bounds[c]` to `bounds[c + 1]` of the split's order, each run's stretch of them put in place."""
        begin, end = int(bounds[c]), int(bounds[c + 1])
        batches, places = [], []
        for run, run_places, (start, stop) in zip(runs, placed, cuts[:, c : c + 2].tolist()):
            if stop > start:
                batches.extend(run.rows_between(start, stop, self.RUN_BATCH))
                places.append(run_places[start:stop])
        where = np.empty(end - begin, dtype=np.int64)
        where[np.concatenate(places) - begin] = np.arange(end - begin)
        return pa.Table.from_batches(batches, self.schema).take(pa.array(where))

    def _key_ranks(self, runs: list[Run]) -> np.ndarray:
        """Each staged row's key as its rank among the split's distinct keys (nulls last), in release order."""
        value_type = self.schema.field(self.key).type
        keys = pa.chunked_array([run.keys for run in runs], pa.dictionary(pa.int32(), value_type)).unify_dictionaries()
        for run in runs:
            run.keys = None
        values = keys.chunks[0].dictionary if keys.num_chunks else pa.array([], value_type)
        rank = np.empty(len(values) + 1, dtype=np.int32)
        rank[pc.sort_indices(values).to_numpy()] = np.arange(len(values), dtype=np.int32)
        rank[-1] = len(values)
        return np.concatenate(
            [np.empty(0, np.int32)]
            + [rank[pc.fill_null(chunk.indices, -1).to_numpy(zero_copy_only=False)] for chunk in keys.chunks]
        )

    @staticmethod
    def _chunk_starts(codes: np.ndarray, chunk_rows: int) -> np.ndarray:
        """Where each chunk of about `chunk_rows` sorted rows starts, a run of equal keys never cut."""
        run_starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
        starts, start = [], 0
        while start < len(codes):
            starts.append(start)
            end = min(start + chunk_rows, len(codes))
            if end < len(codes) and codes[end] == codes[end - 1]:
                after = np.searchsorted(run_starts, end, side="right")
                end = int(run_starts[after]) if after < len(run_starts) else len(codes)
            start = end
        return np.array(starts, dtype=np.int64)
