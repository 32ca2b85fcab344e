"""The control arms of a learning-signal probe, made from a built folder by rewriting its images.

- `images`: the build as it is;
- `blank`: every image replaced by one constant grey image of the same size (no pixel carries anything);
- `shuffled`: each image (GEMeX) or study's images (ReXVQA) replaced by another's, one fixed permutation
  over the whole folder (the pixels are real but say nothing about the question).

Only the Parquet image columns change: rows, questions, answers, card and report are copied as they
are, so `cxr-vqa evaluate ARM_FOLDER` scores the same questions against the same answers.
"""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ARMS = ("images", "blank", "shuffled")
GREY = 128


def image_key(dataset: str, row: dict) -> str:
    """What one permutation moves as a whole: an image (GEMeX) or a study's images (ReXVQA)."""
    return row["dicom_id"] if dataset == "gemex" else row["study_id"]


def image_column(dataset: str) -> str:
    return "image" if dataset == "gemex" else "images"


def blank_like(encoded: dict) -> dict:
    """A constant grey image of the encoded image's size and mode, encoded the same way."""
    with Image.open(io.BytesIO(encoded["bytes"])) as image:
        size, mode, fmt = image.size, image.mode, image.format or "PNG"
    out = io.BytesIO()
    Image.new(mode, size, GREY if mode in ("L", "RGB") else 0).save(out, format=fmt)
    return {"bytes": out.getvalue(), "path": encoded["path"]}


def blanked(dataset: str, value):
    return [blank_like(v) for v in value] if dataset == "rexvqa" else blank_like(value)


def parquet_files(folder: Path) -> list[Path]:
    return sorted((folder / "data").rglob("*.parquet"))


def images_by_key(dataset: str, folder: Path) -> dict[str, object]:
    """Every image value of the folder, by the key a permutation moves (the same key has the same images
    in every file of the build)."""
    found: dict[str, object] = {}
    column = image_column(dataset)
    key_column = "dicom_id" if dataset == "gemex" else "study_id"
    for path in parquet_files(folder):
        table = pq.read_table(path, columns=[key_column, column])
        for key, value in zip(table[key_column].to_pylist(), table[column].to_pylist(), strict=True):
            found.setdefault(key, value)
    return found


def permutation(keys: list[str], seed: int) -> dict[str, str]:
    """A derangement of `keys` (no key keeps its own images), fixed by `seed`."""
    order = sorted(keys)
    if len(order) < 2:
        raise ValueError("a shuffled arm needs at least two images or studies")
    shifted = order[:]
    random.Random(seed).shuffle(shifted)
    return {key: shifted[(i + 1) % len(shifted)] for i, key in enumerate(shifted)}


def make_arm(dataset: str, build: Path, arm: str, out: Path, seed: int = 0) -> Path:
    """`build` copied to `out` with its images rewritten for `arm` (the `images` arm is `build` itself)."""
    if arm == "images":
        return build
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: one of {', '.join(ARMS)}")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(build, out, ignore=shutil.ignore_patterns("*.parquet"))
    column = image_column(dataset)
    key_column = "dicom_id" if dataset == "gemex" else "study_id"
    if arm == "shuffled":
        originals = images_by_key(dataset, build)
        moved = permutation(list(originals), seed)
    for path in parquet_files(build):
        table = pq.read_table(path)
        values = table[column].to_pylist()
        if arm == "blank":
            new = [blanked(dataset, v) for v in values]
        else:
            new = [originals[moved[k]] for k in table[key_column].to_pylist()]
        index = table.schema.get_field_index(column)
        table = table.set_column(index, table.schema.field(index), pa.array(new, type=table.schema.field(index).type))
        target = out / path.relative_to(build)
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target)
    return out
