"""A built GEMeX dataset written back in the authors' LLaVA conversation layout (what LLaVA-Med trains on)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from datasets import load_dataset

from builders.built_folder import built_dataset, default_shards
from builders.files import write_text
from gemex_dataset.rows import raw_record

COLUMNS = ["question_type", "question", "choices", "answer", "reason", "boxes_224", "image_path", "row_id"]


def write_llava(dataset: Path, out: Path, split: str = "train") -> int:
    """Write `split` of the built folder `dataset` as a LLaVA JSON array; returns the record count.

    A folder that is no GEMeX build, or lacks the split, is refused in one line before anything is written."""
    kind = built_dataset(dataset)
    if kind not in (None, "gemex"):
        raise ValueError(
            f"{dataset}: a {kind} build; convert writes GEMeX builds in the authors' LLaVA layout, "
            "and ReXVQA has no such layout: use its Parquet files as they are"
        )
    shards = default_shards(Path(dataset))
    if split not in shards:
        raise ValueError(
            f"{dataset}: no {split!r} split (it has {', '.join(sorted(shards)) or 'none'}); pass --split with one of them"
        )
    lacking = [c for c in COLUMNS if c not in pq.read_schema(shards[split][0]).names]
    if lacking:
        raise ValueError(f"{shards[split][0]}: no {', '.join(lacking)} column(s): not a GEMeX build")
    rows = load_dataset(str(dataset), split=split, columns=COLUMNS)
    records = [raw_record(row, "llava") for row in rows]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(records, indent=1, ensure_ascii=False))
    return len(records)
