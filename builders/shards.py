"""The Parquet shard writer: `data/<split>/<config>-NNNNN-of-MMMMM.parquet`.

Rows arrive grouped by image and a row group never splits an image's rows, so each
image's bytes sit in one row group's dictionary page: the questions that share an
image share one copy of it (dictionary encoding on `image.bytes`, with a dictionary
page limit large enough never to fall back to plain). Row groups stay small for the
Hub's dataset viewer.

A build writes one shard set per config (question type or task), and an image with
questions of several types is stored in each of their files. `RowGroupPlan` cuts the
row groups of all of a split's writers at the same images, so those files carry
byte-identical dictionary pages; with content-defined chunking (`use_content_defined_chunking`)
the Hub's Xet storage keeps such repeated pages once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features

IMAGES_PER_GROUP = 64
BYTES_PER_GROUP = 64 << 20
BYTES_PER_SHARD = 512 << 20
"""Under the viewer's ~286 MiB per row group read and the Hub's advice for file sizes."""


def _binary_columns(schema: pa.Schema) -> list[str]:
    """Dotted paths of image byte columns: `image.bytes`, `images.list.element.bytes`."""
    paths = []

    def walk(prefix: str, type_: pa.DataType) -> None:
        if pa.types.is_struct(type_):
            for child in type_:
                walk(f"{prefix}.{child.name}", child.type)
        elif pa.types.is_list(type_) or pa.types.is_large_list(type_):
            walk(f"{prefix}.list.element", type_.value_type)
        elif pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
            paths.append(prefix)

    for field in schema:
        walk(field.name, field.type)
    return paths


class ShardWriter:
    """Writes one config's rows of one split into numbered shards under `folder`."""

    def __init__(self, folder: Path, config: str, features: Features):
        self.folder, self.config = folder, config
        self.schema = features.arrow_schema
        self.image_columns = _binary_columns(self.schema)
        self.pending: list[dict] = []
        self.pending_bytes = 0
        self.shard_bytes = 0
        self.writer: pq.ParquetWriter | None = None
        self.paths: list[Path] = []
        self.rows = 0

    def _open(self) -> pq.ParquetWriter:
        path = self.folder / f"{self.config}-{len(self.paths):05d}.parquet.partial"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.paths.append(path)
        self.shard_bytes = 0
        return pq.ParquetWriter(
            path, self.schema, compression="zstd", use_dictionary=True, dictionary_pagesize_limit=1 << 30,
            write_statistics=[c.name for c in self.schema if c.name not in ("image", "images")],
            write_page_index=True, use_content_defined_chunking=True,
        )

    def add_image_rows(self, rows: list[dict], image_bytes: int = 0) -> None:
        """Add the rows of one image (or study); they stay together until the next `flush`."""
        self.pending.extend(rows)
        self.pending_bytes += image_bytes

    def flush(self) -> None:
        """Write what is pending as one row group."""
        if not self.pending:
            return
        if self.writer is None or self.shard_bytes >= BYTES_PER_SHARD:
            if self.writer is not None:
                self.writer.close()
            self.writer = self._open()
        table = pa.Table.from_pylist(self.pending, schema=self.schema)
        self.writer.write_table(table, row_group_size=len(self.pending))
        self.rows += len(self.pending)
        self.shard_bytes += self.pending_bytes + table.nbytes // 4
        self.pending, self.pending_bytes = [], 0

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its final `-NNNNN-of-MMMMM` name."""
        self.flush()
        if self.writer is not None:
            self.writer.close()
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
    """Decides, image by image, when every writer of a split closes its row group together."""

    def __init__(self, writers: list[ShardWriter]):
        self.writers = writers
        self.images = 0
        self.bytes = 0

    def before_image(self, image_bytes: int) -> None:
        if self.images and (self.images >= IMAGES_PER_GROUP or self.bytes + image_bytes > BYTES_PER_GROUP):
            for writer in self.writers:
                writer.flush()
            self.images, self.bytes = 0, 0
        self.images += 1
        self.bytes += image_bytes
