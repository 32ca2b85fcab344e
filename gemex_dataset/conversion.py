"""A built GEMeX dataset written back in the authors' LLaVA conversation layout (what LLaVA-Med trains on)."""

from __future__ import annotations

import json
from pathlib import Path

from datasets import load_dataset

from builders.files import write_text
from gemex_dataset.rows import raw_record

COLUMNS = ["question_type", "question", "choices", "answer", "reason", "boxes_224", "image_path", "row_id"]


def write_llava(dataset: Path, out: Path, split: str = "train") -> int:
    """Write `split` of the built folder `dataset` as a LLaVA JSON array; returns the record count."""
    rows = load_dataset(str(dataset), split=split, columns=COLUMNS)
    records = [raw_record(row, "llava") for row in rows]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(records, indent=1, ensure_ascii=False))
    return len(records)
