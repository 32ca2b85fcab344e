"""What every dataset build shares: settings, staging, the steps of a build (images: `builders.assembly.image_source`).

A build writes into a hidden `.<name>.partial-<pid>` folder beside the output, under the
output's lock, and renames it into place only when everything (shards, card, report) is
written (`builders.assembly.lifecycle`): a failed, interrupted or killed build leaves nothing
that looks like a dataset, and an existing output is replaced only with `overwrite`.
"""

from __future__ import annotations

import errno
import gc
import itertools
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.assembly.card import declared_configs
from builders.assembly.conversations import CHARS_PER_TOKEN, TEXT_TOKENS, TURN_SEED, ConversationLayout
from builders.assembly.image_source import ImageSource, Loaded
from builders.assembly.lifecycle import staged_output, stop_point
from builders.assembly.report import BuildError, BuildReport, Reject
from builders.assembly.shards import SHARD_LAYOUTS, SplitShards, sha256
from builders.provenance import Provenance

IMAGE_MODES = ("reference", "embed", "none")


@dataclass
class BuildSettings:
    source: Path
    out: Path
    images: Path | None = None
    image_mode: str = "reference"
    image_size: int | None = None
    split: str | None = None
    strict: bool = False
    overwrite: bool = False
    num_proc: int = 1
    image_ext: str | None = None
    keep_16bit: bool = False
    shard_layout: str = "auto"
    turn_seed: int = TURN_SEED
    conversation_tokens: int = TEXT_TOKENS

    @property
    def shared_shards(self) -> bool:
        """Whether every config reads one shared shard set per split (see `builders.assembly.shards`): only when asked for."""
        return self.shard_layout == "shared"

    def check(self) -> None:
        if self.image_mode not in IMAGE_MODES:
            raise BuildError(f"--image-mode must be one of {', '.join(IMAGE_MODES)}, got {self.image_mode!r}")
        if not Path(self.source).exists():
            raise BuildError(f"--source {self.source}: no such file or folder")
        out = Path(self.out).resolve()
        for name, given in (("--source", self.source), ("--images", self.images)):
            if given is not None and out in (Path(given).resolve(), *Path(given).resolve().parents):
                raise BuildError(f"--out {self.out} holds {name} {given}: writing it would replace the raw release; "
                                 "choose an --out outside it")
        if self.image_mode != "none" and self.images is None:
            raise BuildError(f"--images is needed with --image-mode {self.image_mode} (or use --image-mode none)")
        if self.images is not None and not Path(self.images).is_dir():
            raise BuildError(f"--images {self.images}: no such folder")
        if self.image_size is not None and self.image_mode != "embed":
            raise BuildError("--image-size resizes embedded images: use it with --image-mode embed")
        if self.image_size is not None and self.image_size < 16:
            raise BuildError(f"--image-size {self.image_size}: the long side must be at least 16 pixels")
        if self.image_mode == "reference" and (self.image_ext or "").lstrip(".").lower() == "dcm":
            raise BuildError("--image-ext dcm needs --image-mode embed: DICOM files cannot be decoded from a path when rows are read")
        if self.shard_layout not in SHARD_LAYOUTS:
            raise BuildError(f"--shard-layout must be one of {', '.join(SHARD_LAYOUTS)}, got {self.shard_layout!r}")
        if self.conversation_tokens < 1:
            raise BuildError(f"--conversation-tokens must be at least 1, got {self.conversation_tokens}")
        if self.num_proc < 1:
            raise BuildError(f"--num-proc must be at least 1, got {self.num_proc}")

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


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

    def __init__(self, folder: Path, schema: pa.Schema):
        self.folder, self.schema = folder, schema
        folder.mkdir(parents=True, exist_ok=True)
        self.buffers: dict[str, list[dict]] = {}
        self.writers: dict[str, pa.ipc.RecordBatchFileWriter] = {}

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
        self._writer(split).write_table(table.select(self.schema.names).cast(self.schema))

    def _writer(self, split: str) -> pa.ipc.RecordBatchFileWriter:
        if split not in self.writers:
            self.writers[split] = pa.ipc.new_file(self.folder / f"{split}.arrow", self.schema)
        return self.writers[split]

    def _spill(self, split: str) -> None:
        self._writer(split).write_batch(pa.RecordBatch.from_pylist(self.buffers[split], schema=self.schema))
        self.buffers[split] = []

    def splits(self) -> list[str]:
        order = {"train": 0, "validation": 1, "test": 2}
        return sorted(self.buffers, key=lambda s: (order.get(s, 3), s))

    def sorted_batches(self, split: str, key: str, chunk_rows: int | None = None) -> Iterator[pa.Table]:
        """The split's rows sorted by `key` (stable), in chunks of about `chunk_rows` (`BATCH`) that never cut a run of equal keys.

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
        keys = self._key_column(path, key)
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
                mine = bucket_of_row[start:start + group.num_rows]
                order = np.argsort(mine, kind="stable")
                group = group.take(pa.array(order))
                found, firsts, counts = np.unique(mine[order], return_index=True, return_counts=True)
                for bucket, first, count in zip(found.tolist(), firsts.tolist(), counts.tolist()):
                    if bucket not in buckets:
                        buckets[bucket] = pa.ipc.new_file(self.folder / f"{split}.bucket-{bucket}.arrow", self.schema)
                    buckets[bucket].write_table(group.slice(first, count))
                    ranks.setdefault(bucket, []).append(rank[start + order[first:first + count]])
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
            bounds = chunk_ends[bucket * chunks_per_bucket:(bucket + 1) * chunks_per_bucket + 1]
            for begin, end in itertools.pairwise(bounds):
                yield table.slice(int(begin - bounds[0]), int(end - begin))
            del table
            bucket_path.unlink()

    def _batch_groups(self, reader: pa.ipc.RecordBatchFileReader) -> Iterator[pa.Table]:
        """The staged batches, in order, joined into tables of at least `GROUP_ROWS` rows."""
        batches, rows = [], 0
        for b in range(reader.num_record_batches):
            batches.append(reader.get_batch(b))
            rows += batches[-1].num_rows
            if rows >= self.GROUP_ROWS:
                yield pa.Table.from_batches(batches, self.schema).combine_chunks()
                batches, rows = [], 0
        if batches:
            yield pa.Table.from_batches(batches, self.schema).combine_chunks()

    def _key_column(self, path: Path, key: str, group: int = 16) -> pa.ChunkedArray:
        """The staged file's `key` column, copied out `group` batches at a time.

        Arrow's IPC reader reads a batch's whole body even for one field, and the field's
        slices keep it alive (a memory map is touched whole the same way): copying each
        group lets the bodies go, so memory holds the key column, not the file.
        """
        pieces = []
        with pa.OSFile(str(path)) as source:
            reader = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=[self.schema.get_field_index(key)]))
            count = reader.num_record_batches
            for first in range(0, count, group):
                pieces.append(pa.concat_arrays([reader.get_batch(b).column(0) for b in range(first, min(first + group, count))]))
        return pa.chunked_array(pieces, self.schema.field(key).type)

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


@contextmanager
def rare_collections(first_generation: int = 100_000) -> Iterator[None]:
    """Python's cycle collector run every `first_generation` allocations (not 700), objects made before frozen.

    A build makes millions of short-lived dicts and lists (a record, its row) and few cycles;
    at the default threshold the collector's passes over every live object cost as much as
    the build's own work, more as the heap grows.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(first_generation, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class DatasetBuild(ABC):
    """The steps every dataset's build takes, in order; each dataset fills in its own.

    `stage` reads and checks the raw records into a `Staging`, `write_split` writes one
    split's shards, `write_card` the card; `run` wraps them in the atomic output folder
    and saves the report, which must account for every record read. Every annotation file
    and image read goes through `provenance`, which decides whether the build is synthetic.
    """

    def __init__(self, settings: BuildSettings, report: BuildReport):
        self.settings, self.report = settings, report
        self.provenance = Provenance()
        self.images: ImageSource | None = None
        self.checksums: dict[str, Future[str]] = {}
        self.hasher: ThreadPoolExecutor | None = None

    def reject(self, item: Reject) -> None:
        self.report.reject(item)
        if self.settings.strict:
            raise BuildError(f"--strict: rejected {item.line()}")

    @abstractmethod
    def staging_schema(self) -> pa.Schema: ...

    @abstractmethod
    def image_source(self) -> ImageSource | None: ...

    @abstractmethod
    def stage(self, staging: Staging) -> None: ...

    @abstractmethod
    def write_split(self, staging: Staging, split: str, out: Path) -> None: ...

    @abstractmethod
    def write_card(self, out: Path) -> None: ...

    def conversation_layout(self) -> ConversationLayout | None:
        """The build's one-conversation-per-image config (`builders.assembly.conversations`), or None (a build without images)."""
        return None

    def conversation_card(self, configs: dict[str, dict]) -> dict | None:
        """What the card says of the conversation config: its name, rows per split, length limit, seed and columns."""
        layout = self.conversation_layout()
        if layout is None or layout.config not in configs:
            return None
        rows = {split: self.report.conversation_rows.get(f"{split}/{layout.config}", 0) for split in self.report.images}
        return {"config": layout.config, "rows": rows, "text_tokens": layout.text_tokens, "seed": layout.seed,
                "chars_per_token": CHARS_PER_TOKEN, "columns": list(layout.features), "turn_columns": layout.turn_columns}

    def split_shards(self, out: Path, split: str, configs: list[str], features, config_of) -> SplitShards:
        return SplitShards(out / "data" / split, configs, features, self.settings.shared_shards, config_of,
                           synthetic=lambda: self.provenance.synthetic, conversations=self.conversation_layout())

    def chunks_with_images(self, chunks: Iterable[pa.Table], paths_of: Callable[[pa.Table], list[str]]
                           ) -> Iterator[tuple[pa.Table, list[Loaded] | None]]:
        """Each sorted chunk with the images of its `paths_of` (read ahead: `ImageSource.chunks_with_images`),
        or with None when the build reads no image."""
        if self.images is None:
            yield from ((chunk, None) for chunk in chunks)
        else:
            yield from self.images.chunks_with_images(chunks, paths_of)

    def finish_split(self, shards: SplitShards, split: str, out: Path) -> None:
        """Close a split's shards and account for them: checksums (taken in the background while
        the next split is written), rows per config."""
        stop_point("shards")
        for path in shards.close():
            self.checksums[str(path.relative_to(out))] = self.hasher.submit(sha256, path)
        for config, rows in shards.rows.items():
            if rows:
                counts = self.report.rows if config in shards.configs else self.report.conversation_rows
                counts[f"{split}/{config}"] = rows
        self.report.rows_written += sum(shards.rows[config] for config in shards.configs)

    def run(self) -> BuildReport:
        self.settings.check()
        try:
            with rare_collections():
                return self._run()
        except OSError as err:
            raise BuildError(write_failure(err, Path(self.settings.out))) from err

    def _run(self) -> BuildReport:
        self.images = self.image_source()
        with staged_output(Path(self.settings.out), self.settings.overwrite) as (out, cleaned):
            for line in cleaned:
                self.report.notices[line] += 1
            staging = Staging(out / ".staging", self.staging_schema())
            self.hasher = ThreadPoolExecutor(1, thread_name_prefix="checksum")
            try:
                self.stage(staging)
                for split in staging.splits():
                    self.write_split(staging, split, out)
                self.report.shards.update({path: checksum.result() for path, checksum in self.checksums.items()})
            finally:
                if self.images:
                    self.images.close()
                    if self.images.workers_failed:
                        self.report.notices[self.images.workers_failed] += 1
                self.hasher.shutdown(cancel_futures=True)
                shutil.rmtree(out / ".staging", ignore_errors=True)
            if self.report.rows_written == 0:
                first = self.report.rejects[0].line() if self.report.rejects else "no records"
                raise BuildError(f"no row written from {self.settings.source}: {self.report.summary()}; first: {first}")
            stop_point("card")
            self.report.provenance = self.provenance.summary()
            self.write_card(out)
            self.report.configs = declared_configs(out)
            self.report.save(out / "build_report.json")
        return self.report


DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
"""What the kernel answers a write when the disk (or the process's file size limit, or quota) is full."""


def write_failure(err: OSError, out: Path) -> str:
    """One line for a build stopped by the file system, a full disk named as such.

    Arrow's writers raise `OSError` without `errno`, the error's name only in their text.
    """
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    full = err.errno in DISK_FULL or any(os.strerror(code) in text for code in DISK_FULL)
    if full:
        return f"{out}: the disk is full (or the file size limit reached) while building; nothing was written and any previous {out.name} is untouched ({text})"
    return f"{out}: the build stopped on a file error; nothing was written and any previous {out.name} is untouched ({text})"
