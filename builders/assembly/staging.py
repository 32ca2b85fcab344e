"""A split's validated rows (text only) held on disk, then read back sorted by an external sort."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.files import stop_point


class Staging:
    """Validated rows (text only), spilled to Arrow IPC files per split, then read back sorted.

    Rows are read in release order but written sorted by image; holding them on disk
    rather than in memory keeps a build's memory flat whatever the release's size.
    """

    BATCH = 2048
    """Rows of a sorted chunk by default: few enough images in flight for a build that loads them."""
    SPILL = 512
    """Rows per staged batch."""
    BUCKET_ROWS = 16_384
    """Rows of one sort bucket, read whole: about 15 MB of GEMeX text."""
    GROUP_ROWS = 32_768
    """Staged rows handed out to the buckets at a time. Release order and image order are unrelated,
    so every group sends rows to every bucket: one write per bucket and group, where a staged
    batch at a time made (rows / SPILL) x buckets tiny writes, a cost growing with the square of the split."""

    def __init__(self, folder: Path, schema: pa.Schema, key: str):
        self.folder, self.schema, self.key = folder, schema, key
        folder.mkdir(parents=True, exist_ok=True)
        self.buffers: dict[str, list[dict]] = {}
        self.writers: dict[str, pa.ipc.RecordBatchFileWriter] = {}
        self.keys: dict[str, list[pa.Array]] = {}
        """Each split's `key` column as staged, kept so the sort need not read the staged file for it."""

    def add(self, split: str, row: dict) -> None:
        if not self.buffers:
            stop_point("reading")
        buffer = self.buffers.setdefault(split, [])
        buffer.append(row)
        if len(buffer) >= self.SPILL:
            self._spill(split)

    def add_table(self, split: str, table: pa.Table) -> None:
        """Stage many rows at once, after the rows added before them (release order is kept)."""
        if not self.buffers:
            stop_point("reading")
        if self.buffers.setdefault(split, []):
            self._spill(split)
        self._write(split, table.select(self.schema.names).cast(self.schema))

    def _write(self, split: str, table: pa.Table | pa.RecordBatch) -> None:
        self._writer(split).write(table)
        column = table.column(self.key)
        self.keys.setdefault(split, []).extend(column.chunks if isinstance(column, pa.ChunkedArray) else [column])

    def _writer(self, split: str) -> pa.ipc.RecordBatchFileWriter:
        if split not in self.writers:
            self.writers[split] = pa.ipc.new_file(self.folder / f"{split}.arrow", self.schema)
        return self.writers[split]

    def _spill(self, split: str) -> None:
        self._write(split, pa.RecordBatch.from_pylist(self.buffers[split], schema=self.schema))
        self.buffers[split] = []

    def splits(self) -> list[str]:
        order = {"train": 0, "validation": 1, "test": 2}
        return sorted(self.buffers, key=lambda s: (order.get(s, 3), s))

    def sorted_batches(self, split: str, chunk_rows: int | None = None) -> Iterator[pa.Table]:
        """The split's rows sorted by the key (stable), in chunks of about `chunk_rows` (`BATCH`) that never cut a run of equal keys.

        An external sort in two sequential passes, so memory grows with `BUCKET_ROWS` and
        `GROUP_ROWS`, not with the split, whatever its order: only the key column and the sort
        order are held. Each staged row is read once and sent, `GROUP_ROWS` at a time, to the
        bucket of consecutive chunks it belongs to (an Arrow file each); then each bucket is read
        whole, put in order and cut into its chunks.
        """
        chunk_rows = chunk_rows or self.BATCH
        if self.buffers[split]:
            self._spill(split)
        self.writers.pop(split).close()
        path = self.folder / f"{split}.arrow"
        keys = pa.chunked_array(self.keys.pop(split), self.schema.field(self.key).type)
        order = pc.sort_indices(keys).to_numpy().astype(np.int32)  # int32: a split of up to 2**31 rows, half the memory
        codes = pc.dictionary_encode(keys).combine_chunks().indices.to_numpy(zero_copy_only=False)[order]
        del keys
        chunk_starts = self._chunk_starts(codes, chunk_rows)
        chunk_ends = np.append(chunk_starts, len(codes))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order), dtype=np.int32)
        del order, codes
        chunks_per_bucket = max(1, self.BUCKET_ROWS // chunk_rows)
        bucket_of_row = ((np.searchsorted(chunk_starts, rank, side="right") - 1) // chunks_per_bucket).astype(np.int32)
        buckets: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        ranks: dict[int, list[np.ndarray]] = {}
        with pa.OSFile(str(path)) as source:
            start = 0
            for group in self._batch_groups(pa.ipc.open_file(source)):
                mine = bucket_of_row[start : start + group.num_rows]
                order = np.argsort(mine, kind="stable")
                group = group.take(pa.array(order))
                found, firsts, counts = np.unique(mine[order], return_index=True, return_counts=True)
                for bucket, first, count in zip(found.tolist(), firsts.tolist(), counts.tolist()):
                    if bucket not in buckets:
                        buckets[bucket] = pa.ipc.new_file(self.folder / f"{split}.bucket-{bucket}.arrow", self.schema)
                    buckets[bucket].write_table(group.slice(first, count))
                    ranks.setdefault(bucket, []).append(rank[start + order[first : first + count]])
                start += group.num_rows
                del group
        path.unlink()
        del rank, bucket_of_row
        for writer in buckets.values():
            writer.close()
        for bucket in sorted(buckets):
            bucket_path = self.folder / f"{split}.bucket-{bucket}.arrow"
            with pa.OSFile(str(bucket_path)) as source:
                table = pa.ipc.open_file(source).read_all().combine_chunks()
            bucket_rank = np.concatenate(ranks.pop(bucket))
            table = table.take(pa.array(np.argsort(bucket_rank, kind="stable")))
            bounds = chunk_ends[bucket * chunks_per_bucket : (bucket + 1) * chunks_per_bucket + 1]
            for begin, end in itertools.pairwise(bounds):
                yield table.slice(int(begin - bounds[0]), int(end - begin))
            del table
            bucket_path.unlink()

    def _batch_groups(self, reader: pa.ipc.RecordBatchFileReader) -> Iterator[pa.Table]:
        """The staged batches, in order, gathered into tables of at least `GROUP_ROWS` rows (not copied: `take` reads across batches)."""
        batches, rows = [], 0
        for b in range(reader.num_record_batches):
            batches.append(reader.get_batch(b))
            rows += batches[-1].num_rows
            if rows >= self.GROUP_ROWS:
                yield pa.Table.from_batches(batches, self.schema)
                batches, rows = [], 0
        if batches:
            yield pa.Table.from_batches(batches, self.schema)

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
