"""Whether a build is synthetic, proven by the content it read, never by where it lies.

The synthetic generators mark everything they write:

- every annotation file is listed in the release's `SYNTHETIC_MANIFEST.json` with a keyed
  hash (HMAC-SHA256) of its bytes;
- every image carries a tag in its own metadata (JPEG COM segment, PNG tEXt chunk, DICOM
  ImageComments), keyed on the file's name.

A build is synthetic only when every annotation file it read is in a manifest (in its folder
or one above) with a matching hash, and every image it read carries its tag; anything else is
real. The build then stamps each Parquet shard's key-value metadata with a keyed hash over the
shard's row count and text columns (`shard_stamp`); `publish` re-reads the shards and checks
the stamp (`verify_shard`), so neither a hand-edited card nor a marker file beside the source
can make real data look synthetic.

`PROVENANCE_KEY` is a constant in this public code: the marks guard against accidents (a real
release kept under a synthetic one's folder, a card edited by hand, shards swapped), not
against someone forging them on purpose.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from builders.images import metadata_tag

PROVENANCE_KEY = b"cxr-vqa synthetic provenance v1"
"""Public by design: a mark against accidents, not a secret (see the module docstring)."""
MANIFEST_NAME = "SYNTHETIC_MANIFEST.json"
STAMP_KEY = "cxr_vqa.provenance"
"""The Parquet key-value metadata key of a shard's stamp."""
_TAG_PREFIX = "cxr-vqa synthetic image "


def keyed_hash(data: bytes) -> str:
    return hmac.new(PROVENANCE_KEY, data, hashlib.sha256).hexdigest()


def keyed_digest() -> hmac.HMAC:
    """An empty keyed hash, to be fed a file's bytes as they are read (`file_hash` reads them itself)."""
    return hmac.new(PROVENANCE_KEY, digestmod=hashlib.sha256)


def file_hash(path: Path) -> str:
    """The keyed hash of a file's bytes, read in blocks."""
    digest = keyed_digest()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_tag(file_name: str) -> str:
    """The tag the generators write into the image called `file_name` (keyed on the name, so
    a tag copied onto another file does not count)."""
    return _TAG_PREFIX + keyed_hash(b"image:" + file_name.encode())[:32]


class ManifestWriter:
    """The manifest of a synthetic release: each annotation file's keyed hash, by path under `root`."""

    def __init__(self, root: Path, generator: str):
        self.root, self.generator = Path(root), generator
        self.files: dict[str, str] = {}

    def add(self, path: Path) -> None:
        self.files[Path(path).relative_to(self.root).as_posix()] = file_hash(path)

    def save(self) -> Path:
        path = self.root / MANIFEST_NAME
        document = {
            "generator": self.generator,
            "note": "HMAC-SHA256 of each annotation file with cxr-vqa's public provenance key: a mark against accidents, not a secret",
            "files": dict(sorted(self.files.items())),
        }
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        return path


def _manifests_above(path: Path) -> list[Path]:
    return [folder / MANIFEST_NAME for folder in Path(path).absolute().parents if (folder / MANIFEST_NAME).is_file()]


def read_image_tag(path: str | os.PathLike[str]) -> str | None:
    """The synthetic tag in an image file's metadata, or None (also for a file that cannot be parsed)."""
    from PIL import Image

    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(132)
        if head[128:132] == b"DICM":
            import pydicom

            comments = pydicom.dcmread(path, stop_before_pixels=True).get("ImageComments")
            return str(comments) if comments else None
        with Image.open(path) as image:
            return metadata_tag(image.info)
    except Exception:  # noqa: BLE001 - a file no reader can parse carries no tag; the build reports its own problems
        return None


def list_release_files(release: Path) -> None:
    """Add every file of a freshly generated release that its manifest does not list yet (the images)
    to it, by keyed hash: what `foreign_release_file` then recognises by its bytes."""
    release = Path(release)
    manifest_path = release / MANIFEST_NAME
    document = json.loads(manifest_path.read_text(encoding="utf-8"))
    listed = document.setdefault("files", {})
    for path in sorted(release.rglob("*")):
        rel = path.relative_to(release).as_posix()
        if path.is_file() and not path.is_symlink() and rel != MANIFEST_NAME and rel not in listed:
            listed[rel] = file_hash(path)
    document["files"] = dict(sorted(listed.items()))
    manifest_path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def foreign_release_file(release: Path, notes: dict[str, str]) -> str | None:
    """Why a synthetic release folder holds something its generator did not write (None when it does not).

    Each file must be listed in the release's manifest with the keyed hash of its bytes
    (`list_release_files` lists the images too), or be a note in `notes` ({name at the top: its
    text}). An image's tag is not enough: an image edited in place keeps it (Pillow writes a JPEG's
    comment back). A link (file or folder) is never the generator's. What `cxr-vqa demo` may replace.
    """
    release = Path(release)
    try:
        listed = json.loads((release / MANIFEST_NAME).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    listed = listed if isinstance(listed, dict) else {}
    for folder, subfolders, files in os.walk(release):
        for name in [*subfolders, *files]:
            path = Path(folder, name)
            rel = path.relative_to(release).as_posix()
            if path.is_symlink():
                return f"{rel} is a link"
            if name in subfolders or rel == MANIFEST_NAME or (rel in notes and _text_is(path, notes[rel])):
                continue
            if rel not in listed:
                return f"{rel} was not written by the synthetic generator (its manifest does not list it)"
            if not hmac.compare_digest(str(listed[rel]), file_hash(path)):
                return f"{rel} was not written by the synthetic generator (its bytes differ from what it wrote)"
    return None


def _text_is(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


class Provenance:
    """What a build read, and whether every piece of it carries the generators' marks.

    Checking stops at the first unmarked file (the build is real from then on), so a build of
    real data pays for one check. `image` is called from the image-reader threads.
    """

    def __init__(self) -> None:
        self.files = 0
        self.images = 0
        self.unmarked: str | None = None
        self._manifests: dict[Path, dict[str, str]] = {}
        self._lock = threading.Lock()

    @property
    def synthetic(self) -> bool:
        return self.unmarked is None and self.files > 0

    def _real(self, why: str) -> None:
        with self._lock:
            if self.unmarked is None:
                self.unmarked = why

    def annotation_file(self, path: Path, digest: hmac.HMAC | None = None) -> None:
        """Count an annotation file read, and check it against its manifest: `digest`, where given, holds
        its bytes as its reader read them (`keyed_digest`), so that they are not read a second time."""
        self.files += 1
        if self.unmarked is not None:
            return
        manifests = _manifests_above(path)
        if not manifests:
            return self._real(f"{path}: no {MANIFEST_NAME} in its folder or above")
        for manifest in manifests:
            listed = self._manifest(manifest).get(
                Path(path).absolute().relative_to(manifest.parent.absolute()).as_posix()
            )
            if listed is not None:
                if hmac.compare_digest(listed, digest.hexdigest() if digest else file_hash(path)):
                    return None
                return self._real(f"{path}: its content differs from the hash in {manifest}")
        return self._real(f"{path}: not listed in {manifests[0]}")

    def _manifest(self, path: Path) -> dict[str, str]:
        if path not in self._manifests:
            try:
                files = json.loads(path.read_text(encoding="utf-8")).get("files")
            except (OSError, ValueError, AttributeError):
                files = None
            self._manifests[path] = files if isinstance(files, dict) else {}
        return self._manifests[path]

    def image(self, path: str | os.PathLike[str], tag: str | None = None) -> None:
        """Count an image read, and check its mark: `tag` as its reader found it, or (None) read from the file."""
        with self._lock:
            self.images += 1
            if self.unmarked is not None:
                return
        if (tag or read_image_tag(path)) != image_tag(os.path.basename(path)):
            self._real(f"{path}: the image carries no synthetic tag")

    def summary(self) -> dict:
        """For the build report: the verdict and, for a real build, the first unmarked file."""
        return {
            "synthetic": self.synthetic,
            "annotation_files": self.files,
            "images": self.images,
            "real_because": None if self.synthetic else (self.unmarked or "no annotation file read"),
        }


class ContentHash:
    """A hash over a shard's rows and text (string) columns, the same however its rows were chunked."""

    def __init__(self, schema: pa.Schema):
        self.columns = sorted(f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
        self.rows = 0
        self.parts = {name: [hashlib.sha256() for _ in range(3)] for name in self.columns}

    def update(self, table: pa.Table | pa.RecordBatch) -> None:
        self.rows += table.num_rows
        for name in self.columns:
            column = table.column(name)
            for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
                self._update_column(name, chunk)

    def _update_column(self, name: str, array: pa.Array) -> None:
        if len(array) == 0:
            return
        lengths, data, nulls = self.parts[name]
        nulls.update(array.is_null().to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
        filled = pc.fill_null(array.cast(pa.large_string()), "")
        offsets = np.frombuffer(filled.buffers()[1], dtype=np.int64)[filled.offset : filled.offset + len(filled) + 1]
        lengths.update(np.diff(offsets).astype("<i8").tobytes())
        if filled.buffers()[2] is not None:
            data.update(memoryview(filled.buffers()[2])[int(offsets[0]) : int(offsets[-1])])

    def digest(self, synthetic: bool) -> str:
        document = {
            "rows": self.rows,
            "synthetic": synthetic,
            "columns": {name: [part.hexdigest() for part in parts] for name, parts in self.parts.items()},
        }
        return keyed_hash(json.dumps(document, sort_keys=True).encode())


def shard_stamp(content: ContentHash, synthetic: bool) -> dict[str, str]:
    """The key-value metadata a build writes into a shard's footer."""
    return {STAMP_KEY: json.dumps({"synthetic": synthetic, "rows": content.rows, "hmac": content.digest(synthetic)})}


def verify_shard(path: Path) -> tuple[bool, str | None]:
    """(synthetic, problem) for a shard: synthetic only when its stamp says so and matches its content."""
    parquet = pq.ParquetFile(path)
    raw = (parquet.metadata.metadata or {}).get(STAMP_KEY.encode())
    if raw is None:
        return False, f"{path}: no provenance stamp"
    try:
        stamp = json.loads(raw)
        claimed, rows, mark = bool(stamp["synthetic"]), int(stamp["rows"]), str(stamp["hmac"])
    except (ValueError, KeyError, TypeError):
        return False, f"{path}: unreadable provenance stamp"
    if not claimed:
        return False, None  # a claim of real data needs no proof
    content = ContentHash(parquet.schema_arrow)
    for group in range(parquet.num_row_groups):
        content.update(parquet.read_row_group(group, columns=content.columns))
    if rows != content.rows or not hmac.compare_digest(mark, content.digest(claimed)):
        return False, f"{path}: its rows or text differ from what the build stamped"
    return claimed, None


def stamp_table(table: pa.Table, synthetic: bool) -> pa.Table:
    """`table` with its stamp in the schema metadata, which Parquet writers store in the footer
    (for files written outside a build, such as `preview`'s rows taken from stamped shards)."""
    content = ContentHash(table.schema)
    content.update(table)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **shard_stamp(content, synthetic)})


def folder_synthetic(folder: Path, shards: list[Path] | None = None) -> bool:
    """Whether every shard (`shards`, by default every Parquet file under the folder's `data/`) proves, by its
    own stamp and content, that it is synthetic."""
    shards = sorted((Path(folder) / "data").rglob("*.parquet")) if shards is None else shards
    return bool(shards) and all(verify_shard(path)[0] for path in shards)
