"""The rows a learning-signal probe trains and is scored on, cut from a built folder (its images untouched:
`benchmarks/probe_arms.py` makes those).

- `balanced`: a config's train rows cut to as many of each answer as the rarest has, so no answer prior is
  worth learning;
- `asked_both_ways`: cut image by image, so every image is asked "Yes." as often as "No." and only reading the
  finding and region a question names beats 50;
- `conversations_of`: the per-image conversations cut to the turns of one config's rows, so both layouts train on
  the same questions.

Each copies the build to a folder of its own, once, and drops the card's recorded split sizes, which no longer
hold; `cxr-vqa evaluate` and `datasets.load_dataset` read the copy as they read the build.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import DatasetCard

from benchmarks.probe_arms import replaced


def balanced(build: Path, config: str, out: Path, seed: int) -> Path:
    """`build` copied to `out` with its train split's `config` rows cut to as many of each answer as the rarest
    has (a fixed random choice by `seed`), so no answer prior is worth learning; other files copied as they are."""
    return _train_rows_cut(build, config, out, lambda table: as_many_of_each(table, [range(table.num_rows)], seed))


def asked_both_ways(build: Path, config: str, out: Path, seed: int) -> Path:
    """`build` copied to `out` with its train split's `config` rows cut image by image to as many of each answer
    as that image's rarest has (an image asked one way only goes). Every image is then asked "Yes." as often as
    "No.", so what an image says of the answer whatever the question (how much is drawn on it) scores 50, and a
    probe scores above that only by reading the finding and region its question names."""

    def per_image(table: pa.Table) -> list[int]:
        by_image: dict[str, list[int]] = {}
        for index, image in enumerate(table["dicom_id"].to_pylist()):
            by_image.setdefault(image, []).append(index)
        return as_many_of_each(table, list(by_image.values()), seed)

    return _train_rows_cut(build, config, out, per_image)


def as_many_of_each(table: pa.Table, groups: list[Sequence[int]], seed: int) -> list[int]:
    """Row indices of `table`: from each group of indices, as many rows of each of the table's answers as the
    group's rarest answer has (none where the group lacks one), chosen at random by `seed`; in table order."""
    answers = table["answer"].to_pylist()
    every_answer = dict.fromkeys(answers)
    rng = random.Random(seed)
    chosen = []
    for group in groups:
        by_answer: dict[str, list[int]] = {}
        for index in group:
            by_answer.setdefault(answers[index], []).append(index)
        keep = min(len(by_answer.get(answer, [])) for answer in every_answer)
        chosen += [i for rows in by_answer.values() for i in rng.sample(rows, keep)]
    return sorted(chosen)


def _train_rows_cut(build: Path, config: str, out: Path, chosen: Callable[[pa.Table], list[int]]) -> Path:
    """`build` copied to `out` with its train split's `config` rows cut to those `chosen` picks; made once."""
    if out.is_dir():
        return out
    shutil.copytree(build, out)
    path = next((out / "data" / "train").glob(f"{config}-*.parquet"))
    table = pq.read_table(path)
    pq.write_table(table.take(chosen(table)), path)
    _forget_split_sizes(out)
    return out


def _forget_split_sizes(build: Path) -> None:
    """The card's recorded split sizes, dropped once rows are cut (`datasets` checks them against the files)."""
    card = DatasetCard.load(build / "README.md")
    for info in card.data.get("dataset_info") or []:
        for key in ("splits", "download_size", "dataset_size"):
            info.pop(key, None)
    card.save(build / "README.md")


def conversations_of(build: Path, config: str, out: Path) -> Path:
    """`build` copied to `out` with each train per-image conversation cut to the turns of `config`'s train rows, so
    both layouts train on the same questions (conversations left with none go). Other files copied as they are;
    the stored `messages` keep the build's text, since the recipes write each row's messages from its typed columns."""
    if out.is_dir():
        return out
    shutil.copytree(build, out)
    train = out / "data" / "train"
    kept = set(
        pq.read_table(next(train.glob(f"{config}-*.parquet")), columns=["question_id"])["question_id"].to_pylist()
    )
    for path in sorted(train.glob("sft_per_image-*.parquet")):
        rows = pq.read_table(path)
        ids, turns = rows["question_ids"].to_pylist(), rows["turns"].to_pylist()
        keep = [[i for i, question in enumerate(row_ids) if question in kept] for row_ids in ids]
        rows = replaced(rows, "question_ids", [[row_ids[i] for i in k] for row_ids, k in zip(ids, keep)])
        rows = replaced(rows, "turns", [[row[i] for i in k] for row, k in zip(turns, keep)])
        pq.write_table(rows.filter(pa.array([bool(k) for k in keep])), path)
    _forget_split_sizes(out)
    return out
