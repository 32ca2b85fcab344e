"""The Parquet shard writer: `data/<split>/<prefix>-NNNNN-of-MMMMM.parquet`.

Rows arrive grouped by image and a row group never splits an image's rows, so each
image's bytes sit in one row group's dictionary page: the questions that share an
image share one copy of it. The image column is handed to Parquet already
dictionary-encoded (`image_array`), so no image is copied per question or hashed by
the writer; readers get plain `binary` back, as the `Image` feature expects, because
the file carries the features' own Arrow schema (`ARROW:schema`, written by hand with
`store_schema=False`) rather than the dictionary-typed one it was written from. Row groups stay small for the Hub's
dataset viewer.

Pages are cut by content (`use_content_defined_chunking`): identical image bytes make identical
pages even when the rows around them differ, so the Hub's Xet storage, which deduplicates
content-defined chunks across files, keeps one copy of an image that several files hold.

Two layouts (`SHARD_LAYOUTS`), both read by the same configs (`default`, one per
question type or task):

- `by-config` (`auto`, the default): one shard set per config (`<config>-*.parquet`), each
  config a glob over its own files, so the Hub's dataset viewer (which reads a config's files
  as they are, without `filters`) shows exactly the rows `load_dataset` returns. An image with
  questions of k types is in k files; the Hub's Xet storage keeps one copy of the identical
  bytes (see `benchmarks/hub_benchmark.py`).
- `shared`: one shard set per split (`questions-*.parquet`); each config is the same glob
  with a Parquet filter on its class column, which `datasets` applies when loading.
  Every image is stored once in them, but the viewer shows every row under every config,
  so `cxr-vqa validate` refuses it for the Hub (`viewer-rows`).

The one-conversation-per-image config (`conversations`) has its own shard set in both layouts: its
rows are not a filter of the question rows, so an embedded build holds each image there once more,
unless it is left out (`BuildSettings.no_conversations`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features

from builders.assembly.conversations import ConversationLayout
from builders.provenance import ContentHash, shard_stamp

SHARD_LAYOUTS = ("auto", "by-config", "shared")
SHARED_PREFIX = "questions"
IMAGES_PER_GROUP = 256
BYTES_PER_GROUP = 32 << 20
ROWS_PER_TEXT_GROUP = 10_000
"""Rows of a row group without image bytes (`none`, `reference`): about 10-20 MB of text. Few large
groups write faster and keep the writer's per-group metadata (held until the file closes) small."""
BYTES_PER_SHARD = 512 << 20
"""Under the viewer's ~286 MiB per row group read and the Hub's advice for file sizes."""


def _leaf_columns(schema: pa.Schema) -> dict[str, pa.DataType]:
    """Every leaf column by its dotted Parquet path (`image.bytes`, `images.list.element.bytes`)."""
    leaves: dict[str, pa.DataType] = {}

    def walk(prefix: str, type_: pa.DataType) -> None:
        if pa.types.is_struct(type_):
            for child in type_:
                walk(f"{prefix}.{child.name}", child.type)
        elif pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
            walk(f"{prefix}.list.element", type_.value_type)
        else:
            leaves[prefix] = type_

    for field in schema:
        walk(field.name, field.type)
    return leaves


def _binary_columns(schema: pa.Schema) -> list[str]:
    """The image byte columns: the only binary leaves of a dataset's schema."""
    return [
        path
        for path, type_ in _leaf_columns(schema).items()
        if pa.types.is_binary(type_) or pa.types.is_large_binary(type_)
    ]


def image_array(values: list, type_: pa.DataType) -> pa.Array:
    """Image values (`{"bytes", "path"}` dicts, or lists of them) as Arrow, `bytes` dictionary-encoded.

    The rows of one image share its one `bytes` object, so entries are keyed by object rather
    than by content: a row group's dictionary is then its distinct images, found without
    hashing megabytes of image per row group.
    """
    if pa.types.is_list(type_):
        offsets, flat = [0], []
        for images in values:
            flat.extend(images or [])
            offsets.append(len(flat))
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()),
            image_array(flat, type_.value_type),
            mask=pa.array([images is None for images in values]),
        )
    distinct: dict[int, int] = {}
    images: list[bytes] = []
    indices = []
    for value in values:
        image = value.get("bytes") if value else None
        if image is None:
            indices.append(None)
            continue
        if id(image) not in distinct:
            distinct[id(image)] = len(images)
            images.append(image)
        indices.append(distinct[id(image)])
    encoded = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(images, type_.field("bytes").type))
    paths = pa.array([value.get("path") if value else None for value in values], type_.field("path").type)
    return pa.StructArray.from_arrays(
        [encoded, paths], names=["bytes", "path"], mask=pa.array([not value for value in values])
    )


class ShardWriter:
    """Writes one config's rows of one split into numbered shards under `folder`.

    Row groups are written on a thread of their own (Parquet writes run outside the GIL),
    at most `IN_FLIGHT` behind, so building the next rows overlaps writing the last ones.
    """

    IN_FLIGHT = 1
    CONTENT_DEFINED_CHUNKING = True
    """Off only to measure what it buys (`benchmarks/hub_benchmark.py`)."""

    def __init__(self, folder: Path, config: str, features: Features, synthetic: Callable[[], bool] = lambda: False):
        self.folder, self.config = folder, config
        self.schema = features.arrow_schema
        self.synthetic = synthetic
        self.content = ContentHash(self.schema)
        self.image_fields = {f.name for f in self.schema if _binary_columns(pa.schema([f]))}
        self.image_columns = _binary_columns(self.schema)
        self.text_schema = pa.schema([f for f in self.schema if f.name not in self.image_fields])
        # Encoded images do not compress: zstd on them costs time and saves nothing.
        self.compression = dict.fromkeys(_leaf_columns(self.schema), "zstd") | dict.fromkeys(self.image_columns, "none")
        self.pending: list[dict] = []
        self.pending_tables: list[pa.Table] = []
        self.pending_bytes = 0
        self.shard_bytes = 0
        self.writer: pq.ParquetWriter | None = None
        self.paths: list[Path] = []
        self.rows = 0
        self.writing = ThreadPoolExecutor(1, thread_name_prefix=f"parquet-{config}")
        self.in_flight: deque[Future] = deque()

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter:
        path = self.folder / f"{self.config}-{len(self.paths):05d}.parquet.partial"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.paths.append(path)
        self.shard_bytes = 0
        self.content = ContentHash(self.schema)
        writer = pq.ParquetWriter(
            path,
            schema,
            compression=self.compression,
            use_dictionary=True,
            dictionary_pagesize_limit=1 << 30,
            write_statistics=[c.name for c in self.schema if c.name not in self.image_fields],
            write_page_index=True,
            store_schema=False,
            use_content_defined_chunking=self.CONTENT_DEFINED_CHUNKING,
        )
        declared = base64.b64encode(self.schema.serialize().to_pybytes()).decode()
        writer.add_key_value_metadata(
            {"ARROW:schema": declared, **{k.decode(): v.decode() for k, v in (self.schema.metadata or {}).items()}}
        )
        return writer

    def _table(self, rows: list[dict]) -> pa.Table:
        """The rows as one table: text columns converted by Arrow in one pass, image columns dictionary-encoded."""
        table = pa.Table.from_pylist(rows, schema=self.text_schema)
        for k, f in enumerate(self.schema):
            if f.name in self.image_fields:
                table = table.add_column(k, f.name, image_array([row[f.name] for row in rows], f.type))
        return table

    def _submit(self, task: Callable, *args) -> None:
        """Queue a write behind the earlier ones, waiting while `IN_FLIGHT` are queued (a failed one raises here)."""
        while len(self.in_flight) >= self.IN_FLIGHT:
            self.in_flight.popleft().result()
        self.in_flight.append(self.writing.submit(task, *args))

    def add_image_rows(self, rows: list[dict], image_bytes: int = 0) -> None:
        """Add the rows of one image (or study); they stay together until the next `flush`."""
        self.pending.extend(rows)
        self.pending_bytes += image_bytes

    def add_table(self, table: pa.Table) -> None:
        """Add rows already in Arrow that hold no image bytes (`none` and `reference` builds, which add no rows as dicts)."""
        self.pending_tables.append(table.select(self.schema.names).cast(self.schema))

    def _close_shard(self) -> None:
        """Close the open shard, its footer stamped with its provenance (`builders.provenance`).

        The stamp is taken now, when the rows of every image the shard holds have been read.
        """
        writer, content, synthetic = self.writer, self.content, self.synthetic()

        def finish() -> None:
            writer.add_key_value_metadata(shard_stamp(content, synthetic))
            writer.close()

        self._submit(finish)

    def flush(self) -> None:
        """Write what is pending as one row group."""
        if not (self.pending or self.pending_tables):
            return
        pieces = self.pending_tables + ([self._table(self.pending)] if self.pending else [])
        table = pa.concat_tables(pieces).combine_chunks() if len(pieces) > 1 else pieces[0]
        if self.writer is None or self.shard_bytes >= BYTES_PER_SHARD:
            if self.writer is not None:
                self._close_shard()
            self.writer = self._open(table.schema)
        self._submit(self._write_group, self.writer, self.content, table)
        self.rows += table.num_rows
        self.shard_bytes += self.pending_bytes + table.nbytes // 4
        self.pending, self.pending_tables, self.pending_bytes = [], [], 0

    @staticmethod
    def _write_group(writer: pq.ParquetWriter, content: ContentHash, table: pa.Table) -> None:
        """On the writing thread: hash the rows for the shard's stamp (in order, as they are queued) and write them."""
        content.update(table)
        writer.write_table(table, row_group_size=table.num_rows)

    def abort(self) -> None:
        """Let go of the open shard after a failure elsewhere, quietly: its own close would fail
        again (a full disk) and, left to the finaliser, print a second traceback."""
        self.writing.shutdown(wait=True, cancel_futures=True)
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.close()
            self.writer.is_open = False

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its final `-NNNNN-of-MMMMM` name."""
        self.flush()
        if self.writer is not None:
            self._close_shard()
        try:
            while self.in_flight:
                self.in_flight.popleft().result()
        finally:
            self.writing.shutdown()
        final = []
        for k, path in enumerate(self.paths):
            target = path.with_name(f"{self.config}-{k:05d}-of-{len(self.paths):05d}.parquet")
            path.rename(target)
            final.append(target)
        return final


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class RowGroupPlan:
    """Decides, image by image, when every writer of a split closes its row group together (`cut`).

    A group holds at most `IMAGES_PER_GROUP` images and `BYTES_PER_GROUP` of image bytes, or,
    while it holds no image bytes, `ROWS_PER_TEXT_GROUP` rows.
    """

    def __init__(self, cut: Callable[[], None]):
        self.cut = cut
        self.images = 0
        self.bytes = 0
        self.rows = 0

    def before_image(self, image_bytes: int, rows: int) -> None:
        text_only = not (self.bytes or image_bytes)
        full = self.rows + rows > ROWS_PER_TEXT_GROUP if text_only else self.images >= IMAGES_PER_GROUP
        if self.images and (full or self.bytes + image_bytes > BYTES_PER_GROUP):
            self._cut()
        self.images += 1
        self.bytes += image_bytes
        self.rows += rows

    def after_text_rows(self, rows: int) -> None:
        """Rows with no image added at once (a build without images): cut once the group holds `ROWS_PER_TEXT_GROUP`."""
        self.rows += rows
        if self.rows >= ROWS_PER_TEXT_GROUP:
            self._cut()

    def _cut(self) -> None:
        self.cut()
        self.images, self.bytes, self.rows = 0, 0, 0


class SplitShards:
    """A split's shard writers under one layout, fed one image's (or study's) rows at a time.

    `config_of` names each row's config; with `shared`, every row goes to the one
    `questions` set and the config only counts it.

    With `by-config`, a row group's images are handed to the writers ordered by which configs
    they have questions in, the largest config first (a binary sort on "has rows in config c"):
    the images a config shares with an earlier-uploaded config then lie in one unbroken run in
    both files, which the Hub's Xet storage deduplicates in whole ~64 KiB chunks. Sorted by
    study alone, a file would hold every other study of its neighbour's, and images about the
    size of one chunk would dedup hardly at all (ReXVQA's: 1.7x stored instead of about 1x).
    """

    def __init__(
        self,
        folder: Path,
        configs: list[str],
        features: Features,
        shared: bool,
        config_of: Callable[[dict], str],
        synthetic: Callable[[], bool] = lambda: False,
        conversations: ConversationLayout | None = None,
    ):
        self.configs, self.shared, self.config_of = configs, shared, config_of
        self.conversations = conversations
        prefixes = [SHARED_PREFIX] if shared else configs
        self.writers = {prefix: ShardWriter(folder, prefix, features, synthetic) for prefix in prefixes}
        if conversations is not None:
            self.writers[conversations.config] = ShardWriter(
                folder, conversations.config, conversations.features, synthetic
            )
        self.plan = RowGroupPlan(self._cut)
        self.rows: Counter[str] = Counter()
        self.pending: list[tuple[dict[str, list[dict]], int]] = []

    def add_image_rows(self, rows: list[dict], image_bytes: int) -> None:
        self.plan.before_image(image_bytes, len(rows))
        by_config: dict[str, list[dict]] = {}
        for row in rows:
            by_config.setdefault(self.config_of(row), []).append(row)
        for config, config_rows in by_config.items():
            self.rows[config] += len(config_rows)
        if self.conversations is not None and rows:
            conversation_rows = self.conversations.rows(rows)
            self.rows[self.conversations.config] += len(conversation_rows)
        if self.shared:
            if rows:
                self.writers[SHARED_PREFIX].add_image_rows(rows, image_bytes)
                if self.conversations is not None:
                    self.writers[self.conversations.config].add_image_rows(conversation_rows, image_bytes)
            return
        if self.conversations is not None and rows:
            by_config[self.conversations.config] = conversation_rows
        self.pending.append((by_config, image_bytes))

    def add_table(self, table: pa.Table, config_index: np.ndarray) -> None:
        """Add rows that hold no image bytes (`none` and `reference` builds), all at once: each row's config
        is `configs[config_index[row]]`. A row group is cut at `ROWS_PER_TEXT_GROUP` rows."""
        counts = np.bincount(config_index, minlength=len(self.configs))
        for config, count in zip(self.configs, counts.tolist()):
            self.rows[config] += count
        if self.conversations is not None and table.num_rows:
            conversation_rows = self.conversations.table_rows(table)
            self.rows[self.conversations.config] += len(conversation_rows)
            self.writers[self.conversations.config].add_image_rows(conversation_rows)
        if self.shared:
            self.writers[SHARED_PREFIX].add_table(table)
        else:
            for k, config in enumerate(self.configs):
                if counts[k]:
                    self.writers[config].add_table(table.filter(pa.array(config_index == k)))
        self.plan.after_text_rows(table.num_rows)

    def _cut(self) -> None:
        """Hand the row group's images to the writers, ordered by the configs they have, and close it."""
        try:
            self._write_group()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()

    def _write_group(self) -> None:
        largest_first = sorted(self.rows, key=lambda c: -self.rows[c])
        self.pending.sort(key=lambda image: [config in image[0] for config in largest_first])
        for by_config, image_bytes in self.pending:
            for config, config_rows in by_config.items():
                self.writers[config].add_image_rows(config_rows, image_bytes)
        self.pending = []
        for writer in self.writers.values():
            writer.flush()

    def close(self) -> list[Path]:
        """Every shard written, under its final name."""
        self._cut()
        try:
            return [path for writer in self.writers.values() for path in writer.close()]
        except BaseException:
            self.abort()
            raise


def count_rows(paths: list[Path], filters: list | None = None) -> tuple[int, int]:
    """Rows of `paths` (those matching `filters`, a config's Parquet filter) and their uncompressed bytes.

    A filtered config's bytes are its share of each row group's, by rows.
    """
    rows = size = 0
    for path in paths:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        if filters is None:
            rows += meta.num_rows
            size += sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
            continue
        expression = pq.filters_to_expression(filters)
        columns = sorted({predicate[0] for predicate in filters})
        for g in range(meta.num_row_groups):
            matching = parquet.read_row_group(g, columns=columns).filter(expression).num_rows
            rows += matching
            size += meta.row_group(g).total_byte_size * matching // max(meta.row_group(g).num_rows, 1)
    return rows, size
