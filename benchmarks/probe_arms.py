"""The arms of a learning-signal probe, made from a built folder by rewriting its images (and, for `marked`, its words).

- `images`: the build as it is;
- `blank`: every image replaced by one constant grey image of the same size (no pixel carries anything);
- `shuffled`: each image (GEMeX) or study's images (ReXVQA) replaced by another's, one fixed permutation
  over the whole folder (the pixels are real but say nothing about the question);
- `marked` (asked for by name, not a default control): blank images, and the answer in the words: ReXVQA's
  correct option ends in " (seen)", a GEMeX question in its answer. What a probe learns here is what the loop
  teaches when nothing must be read from the pixels (a ReXVQA probe must still find the marked option and
  answer its letter); the images arm against it is what reading the pixels costs.

Only the Parquet image columns change (and, for `marked`, the question or options of the per-question configs,
from which the recipes write their prompts; a conversation config and the stored `messages` keep the build's
words): rows, answers, card and report are copied as they are, so `cxr-vqa evaluate ARM_FOLDER` scores the
same questions against the same answers.
"""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ARMS = ("images", "blank", "shuffled", "marked")
CONTROLS = ARMS[:3]
"""The arms a learning-signal run trains unless told."""
GREY = 128
SEEN = " (seen)"


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


def replaced(table: pa.Table, column: str, values: list) -> pa.Table:
    """`table` with `column`'s values replaced, its type kept."""
    index = table.schema.get_field_index(column)
    field = table.schema.field(index)
    return table.set_column(index, field, pa.array(values, type=field.type))


def answer_in_words(dataset: str, table: pa.Table) -> pa.Table:
    """The `marked` arm's words: ReXVQA's correct option ends in `SEEN`, a GEMeX question in its answer
    (tables without those columns, the conversation configs, as they are)."""
    if dataset == "rexvqa" and "options" in table.column_names:
        options = [
            [text + SEEN if k == correct else text for k, text in enumerate(row)]
            for row, correct in zip(table["options"].to_pylist(), table["answer_index"].to_pylist(), strict=True)
        ]
        return replaced(table, "options", options)
    if dataset == "gemex" and "question" in table.column_names:
        questions = [
            f"{question} ({answer})"
            for question, answer in zip(table["question"].to_pylist(), table["answer"].to_pylist(), strict=True)
        ]
        return replaced(table, "question", questions)
    return table


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
        if arm == "shuffled":
            table = replaced(table, column, [originals[moved[k]] for k in table[key_column].to_pylist()])
        else:
            table = replaced(table, column, [blanked(dataset, v) for v in table[column].to_pylist()])
        if arm == "marked":
            table = answer_in_words(dataset, table)
        target = out / path.relative_to(build)
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target)
    return out
