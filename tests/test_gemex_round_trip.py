"""Every row converts back to its raw record, in each layout it came from, with the same content."""

import csv
import json
from collections import Counter

import pytest
from datasets import load_dataset

from builders.assembly.settings import BuildSettings
from cxr_vqa.cli import main
from gemex_dataset.build import build_gemex
from gemex_dataset.features import LLAVA_Q_TYPES
from gemex_dataset.rows import raw_record


def built_rows(source, out, split=None):
    build_gemex(BuildSettings(source=source, out=out, image_mode="none", split=split))
    return [row for ds in load_dataset(str(out)).values() for row in ds]


def per_type_records(folder):
    records = []
    for path in sorted(folder.rglob("*_question.jsonl")):
        records += [
            json.dumps(json.loads(line)) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()
        ]
    return Counter(records)


def test_per_type_round_trip_keeps_content_and_key_order(gemex_release, tmp_path):
    rows = built_rows(gemex_release.root / "per_type", tmp_path / "out")
    assert Counter(json.dumps(raw_record(row, "per_type")) for row in rows) == per_type_records(
        gemex_release.root / "per_type"
    )


def test_llava_round_trip(gemex_release, tmp_path):
    rows = built_rows(gemex_release.root / "llava", tmp_path / "out")
    original = Counter()
    for path in (gemex_release.root / "llava").rglob("*.json"):
        original.update(json.dumps(r, sort_keys=True) for r in json.loads(path.read_text()))
    assert Counter(json.dumps(raw_record(row, "llava"), sort_keys=True) for row in rows) == original


def test_grouped_round_trip(gemex_release, tmp_path):
    rows = built_rows(gemex_release.root / "grouped", tmp_path / "out")
    original = Counter()
    for path in (gemex_release.root / "grouped").rglob("*.jsonl"):
        with open(path.with_name(path.name.replace("_questions.jsonl", "_images.csv")), newline="") as f:
            images = [r["mimic_image_file_path"].removeprefix("files/") for r in csv.DictReader(f)]
        for image, line in zip(images, path.read_text().splitlines()):
            for group, items in json.loads(line).items():
                original.update(json.dumps([image, group, qa], sort_keys=True) for qa in items)
    rebuilt = Counter(
        json.dumps(
            [
                row["image_path"],
                LLAVA_Q_TYPES[["open_ended", "closed_ended", "single_choice", "multi_choice"][row["question_type"]]],
                raw_record(row, "grouped"),
            ],
            sort_keys=True,
        )
        for row in rows
    )
    assert rebuilt == original


def test_convert_command_writes_the_llava_layout(gemex_release, gemex_embed, tmp_path):
    out = tmp_path / "llava.json"
    assert main(["convert", str(gemex_embed[0]), "--split", "test", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    released = json.loads((gemex_release.root / "llava" / "test" / "test_conversations.json").read_text())
    assert Counter(json.dumps(r, sort_keys=True) for r in written) == Counter(
        json.dumps(r, sort_keys=True) for r in released
    )


@pytest.mark.conformance
def test_public_sample_arrives_intact(samples_dir, tmp_path):
    """The real public GEMeX sample (images absent): every record builds and converts back unchanged."""
    sample = samples_dir / "gemex-public"
    rows = built_rows(sample / "test", tmp_path / "test")
    assert Counter(json.dumps(raw_record(row, "per_type")) for row in rows) == per_type_records(sample / "test")
    rows = built_rows(sample / "sub_training_data.json", tmp_path / "train", split="train")
    original = Counter(
        json.dumps(r, sort_keys=True) for r in json.loads((sample / "sub_training_data.json").read_text())
    )
    assert Counter(json.dumps(raw_record(row, "llava"), sort_keys=True) for row in rows) == original
