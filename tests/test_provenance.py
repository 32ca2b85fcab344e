"""Synthetic is proven by content (manifest hashes, image tags, shard stamps), never by location."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard
from PIL import Image

from builders.assembly.settings import BuildSettings
from builders.hub.publish import PublishRefused, inspect_build, plan_publish
from builders.provenance import (
    MANIFEST_NAME,
    STAMP_KEY,
    file_hash,
    folder_synthetic,
    keyed_digest,
    verify_shard,
)
from cxr_vqa.cli import main
from gemex_dataset import record_columns
from gemex_dataset.build import build_gemex
from gemex_dataset.records import find_source_files
from gemex_dataset.synthetic.release import generate
from rexvqa_dataset.build import build_rexvqa
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa


def placeholder_images(records: list[dict], root: Path) -> None:
    for path in {record["image"] for record in records}:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.new("L", (64, 80), 90).save(target)


def edit_card_to_synthetic(folder: Path) -> None:
    card = DatasetCard.load(folder / "README.md")
    card.data["license"], card.data["tags"] = "cc-by-4.0", ["synthetic"]
    card.data["license_name"] = card.data["license_link"] = None
    card.data["pretty_name"] = "GEMeX (synthetic demo)"
    card.save(folder / "README.md")


def test_real_records_under_a_synthetic_folder_build_as_real_and_stay_private(samples_dir, tmp_path, capsys):
    """The public GEMeX training records with placeholder images, kept under a folder that
    holds an (empty) SYNTHETIC.md and even a synthetic release's manifest, built with embedded images."""
    work = tmp_path / "X"
    generate(work, num_images=4, images=False)  # the user once ran `synthesize` here: a manifest and SYNTHETIC.md
    (work / "SYNTHETIC.md").write_text("")
    real = work / "lab" / "real"
    (real / "train").mkdir(parents=True)
    shutil.copy(samples_dir / "gemex-public" / "sub_training_data.json", real / "train")
    placeholder_images(json.loads((real / "train" / "sub_training_data.json").read_text()), real / "files")

    out = tmp_path / "gemex"
    report = build_gemex(BuildSettings(source=real / "train", out=out, images=real / "files", image_mode="embed"))
    assert report.rows_written > 0 and report.provenance["synthetic"] is False
    assert "not listed in" in report.provenance["real_because"]
    card = DatasetCard.load(out / "README.md")
    assert "synthetic" not in (card.data.get("tags") or []) and card.data["license"] != "cc-by-4.0"
    assert not folder_synthetic(out)

    assert main(["publish", str(out), "--repo", "org/gemex", "--public", "--confirm-public", "--dry-run"]) == 1
    assert "--public takes only" in capsys.readouterr().err
    edit_card_to_synthetic(out)  # the card is never trusted
    assert not inspect_build(out).synthetic
    assert main(["publish", str(out), "--repo", "org/gemex", "--public", "--confirm-public", "--dry-run"]) == 1
    assert "--public takes only" in capsys.readouterr().err


def test_genuine_synthetic_build_is_synthetic_and_may_go_public(tmp_path, capsys):
    release = generate(tmp_path / "release", num_images=6)
    out = tmp_path / "gemex"
    report = build_gemex(
        BuildSettings(source=release.root / "per_type", out=out, images=release.image_root, image_mode="embed")
    )
    assert report.provenance == {"synthetic": True, "annotation_files": 12, "images": 6, "real_because": None}
    assert "synthetic" in DatasetCard.load(out / "README.md").data["tags"]
    assert all(verify_shard(p) == (True, None) for p in (out / "data").rglob("*.parquet"))
    assert main(["publish", str(out), "--repo", "org/demo", "--public", "--confirm-public", "--dry-run"]) == 0
    assert "synthetic" in capsys.readouterr().out


def build_none(release: Path, out: Path):
    return build_gemex(BuildSettings(source=release / "per_type", out=out, image_mode="none", images=release / "files"))


def test_an_edited_annotation_file_makes_the_build_real(tmp_path):
    release = generate(tmp_path / "release", num_images=4).root
    target = release / "per_type" / "test" / "closed_ended_question.jsonl"
    text = target.read_text()
    target.write_text(text.replace("?", "??"))  # every question ends in one, whatever its wording
    assert target.read_text() != text
    report = build_none(release, tmp_path / "gemex")
    assert not report.provenance["synthetic"] and "differs from the hash" in report.provenance["real_because"]


def test_annotation_files_are_hashed_as_they_are_read_in_every_layout(tmp_path):
    """The per-type files are hashed from Arrow's blocks, the other layouts read once more: the same keyed hash."""
    release = generate(tmp_path / "release", num_images=4).root
    files = find_source_files(release, None)
    assert {src.layout for src in files} == {"per_type", "grouped", "llava"}
    for src in files:
        digest = keyed_digest()
        list(record_columns.read(src, block_bytes=700, digest=digest))
        assert digest.hexdigest() == file_hash(src.path), src.path


def test_an_edited_grouped_file_makes_its_build_real(tmp_path):
    release = generate(tmp_path / "release", num_images=4).root
    target = next(src.path for src in find_source_files(release, None) if src.layout == "grouped")
    target.write_text(target.read_text().replace("?", "??"))
    report = build_gemex(BuildSettings(source=target.parent, out=tmp_path / "gemex", image_mode="none"))
    assert not report.provenance["synthetic"] and "differs from the hash" in report.provenance["real_because"]


def test_an_untagged_image_makes_the_build_real(tmp_path):
    release = generate(tmp_path / "release", num_images=4).root
    image = next((release / "files").rglob("*.jpg"))
    with Image.open(image) as original:
        pixels = original.copy()
    pixels.info.clear()
    pixels.save(image)  # the same picture without its tag, as a real JPEG would be
    report = build_none(release, tmp_path / "gemex")
    assert not report.provenance["synthetic"] and "carries no synthetic tag" in report.provenance["real_because"]
    assert not folder_synthetic(tmp_path / "gemex")


def test_a_copied_tag_does_not_count(tmp_path):
    release = generate(tmp_path / "release", num_images=4).root
    first, second = sorted((release / "files").rglob("*.jpg"))[:2]
    shutil.copy(first, second)  # the tag is keyed on the file's name
    assert not build_none(release, tmp_path / "gemex").provenance["synthetic"]


def test_real_text_under_a_synthetic_stamp_is_caught(tmp_path):
    """Shards whose text was changed after the build (or real shards given a synthetic one's footer) are real."""
    release = generate(tmp_path / "release", num_images=4).root
    out = tmp_path / "gemex"
    build_none(release, out)
    assert folder_synthetic(out)
    shard = next((out / "data").rglob("*.parquet"))
    table = pq.read_table(shard)
    stamp = pq.read_metadata(shard).metadata[STAMP_KEY.encode()]
    column = table.schema.get_field_index("report")
    table = table.set_column(column, "report", pa.array(["a real MIMIC-CXR report"] * table.num_rows))
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, STAMP_KEY.encode(): stamp}), shard)
    assert verify_shard(shard) == (False, f"{shard}: its rows or text differ from what the build stamped")
    assert not inspect_build(out).synthetic


def test_rexvqa_without_its_manifest_is_real(tmp_path):
    release = generate_rexvqa(tmp_path / "release", num_studies=6)
    assert build_rexvqa(BuildSettings(source=release.root, out=tmp_path / "synthetic", image_mode="embed")).provenance[
        "synthetic"
    ]
    (release.root / MANIFEST_NAME).unlink()
    report = build_rexvqa(BuildSettings(source=release.root, out=tmp_path / "real", image_mode="embed"))
    assert not report.provenance["synthetic"] and f"no {MANIFEST_NAME}" in report.provenance["real_because"]
    with pytest.raises(PublishRefused):
        plan_publish(tmp_path / "real", "org/rexvqa", "public", confirm_public=True)
