import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from datasets import load_dataset, load_dataset_builder
from huggingface_hub import DatasetCard
from PIL import Image

from builders.assembly.report import BuildError
from builders.assembly.settings import BuildSettings
from gemex_dataset.build import build_gemex
from gemex_dataset.features import PER_IMAGE_CONFIG, QUESTION_TYPES, features


def question_shards(folder: Path, pattern: str = "data/*/*.parquet") -> list[Path]:
    """The build's question shards: every Parquet file but `sft_per_image`'s."""
    return sorted(p for p in folder.glob(pattern) if not p.name.startswith(f"{PER_IMAGE_CONFIG}-"))


def build(release, out, **kw):
    kw.setdefault("images", release.image_root)
    return build_gemex(BuildSettings(source=kw.pop("source", release.root / "per_type"), out=out, **kw))


def test_folder_loads_offline_with_the_declared_features(gemex_embed):
    out, report = gemex_embed
    ds = load_dataset(str(out))
    assert set(ds) == {"train", "validation", "test"}
    assert ds["train"].features == features("embed")
    assert load_dataset_builder(str(out)).info.features == features("embed")
    assert sum(len(split) for split in ds.values()) == report.rows_written
    multi = load_dataset(str(out), "multi_choice")
    assert set(multi["test"]["question_type"]) == {QUESTION_TYPES.index("multi_choice")}
    assert multi["test"].features == features("embed")


def test_rows_are_typed_and_ids_unique(gemex_embed):
    out, _ = gemex_embed
    ds = load_dataset(str(out), split="train")
    assert len(set(ds["question_id"])) == len(ds)
    row = ds.filter(lambda r: r["question_type"] == 3)[0]
    assert json.loads(row["answer"]) == row["answer_letters"] and len(row["choices"]) >= 2
    assert isinstance(row["image"], Image.Image) and row["image"].size == (row["image_width"], row["image_height"])
    assert len(row["regions"]) == len(row["boxes"]) == len(row["boxes_224"])
    closed = ds.filter(lambda r: r["question_type"] == 1)[0]
    assert closed["choices"] == [] and closed["answer"] in ("Yes.", "No.")


def test_counts_add_up_and_card_counts_come_from_the_build(gemex_embed):
    out, report = gemex_embed
    saved = json.loads((out / "build_report.json").read_text())
    assert saved["records_read"] == saved["rows_written"] + saved["rejected"]
    assert sum(saved["rows"].values()) == saved["rows_written"]
    assert set(saved["shards"]) == {str(p.relative_to(out)) for p in out.glob("data/*/*.parquet")}
    card = (out / "README.md").read_text()
    assert f"{report.rows_written} rows written" in card and "synthetic" in card.lower()


def test_shards_are_sorted_by_image_with_one_image_copy_per_file(gemex_embed):
    out, _ = gemex_embed
    for path in out.glob("data/*/*.parquet"):
        assert path.name.endswith("-00000-of-00001.parquet")
        table = pq.read_table(path)
        paths = table.column("image_path").to_pylist()
        runs = [path for k, path in enumerate(paths) if k == 0 or paths[k - 1] != path]
        assert len(runs) == len(set(runs))  # an image's rows together
        per_row = [img["bytes"] for img in table.column("image").to_pylist()]
        distinct = sum(len(b) for b in dict(zip(paths, per_row)).values())
        text = sum(table.column(c).nbytes for c in table.column_names if c != "image")
        footer = pq.ParquetFile(path).metadata.serialized_size + 16_384  # schema, page indexes: fixed per file
        assert path.stat().st_size < 1.15 * (distinct + text) + footer
        assert len(set(paths)) == len(paths) or path.stat().st_size < 0.75 * sum(map(len, per_row))
        assert "RLE_DICTIONARY" in pq.ParquetFile(path).metadata.row_group(0).column(1).encodings


def test_embedded_images_default_to_a_shard_set_per_type(gemex_embed):
    """The default layout with embedded images is by-config: each type's files hold its rows, every
    image once per file (dictionary-encoded), each type's file of an image in the same row group."""
    out, _ = gemex_embed
    for split in ("train", "validation", "test"):
        paths = question_shards(out / "data" / split, "*.parquet")
        assert {p.name.split("-")[0] for p in paths} == set(QUESTION_TYPES)
        groups = []
        for path in paths:
            table = pq.read_table(path, columns=["image_path", "image", "question_type"])
            assert set(table.column("question_type").to_pylist()) == {QUESTION_TYPES.index(path.name.split("-")[0])}
            images = dict(
                zip(table.column("image_path").to_pylist(), (i["bytes"] for i in table.column("image").to_pylist()))
            )
            content = path.read_bytes()
            assert all(content.count(image) == 1 for image in images.values())
            groups.append(pq.ParquetFile(path).metadata.num_row_groups)
        assert len(set(groups)) == 1  # the writers of a split cut row groups at the same images


def test_shared_layout_reads_the_same_rows_through_filters(gemex_release, gemex_embed, tmp_path):
    by_config, _ = gemex_embed
    out = tmp_path / "shared"
    build(gemex_release, out, image_mode="embed", shard_layout="shared")
    assert {p.name.split("-")[0] for p in question_shards(out)} == {"questions"}
    card = DatasetCard.load(by_config / "README.md").data
    assert not any("filters" in c for c in card["configs"])
    shared_card = DatasetCard.load(out / "README.md").data
    multi = next(c for c in shared_card["configs"] if c["config_name"] == "multi_choice")
    assert multi["filters"] == [["question_type", "==", QUESTION_TYPES.index("multi_choice")]]
    for qtype in ("open_ended", "multi_choice"):
        mine = load_dataset(str(by_config), qtype, split="test")
        theirs = load_dataset(str(out), qtype, split="test")
        assert sorted(mine["question_id"]) == sorted(theirs["question_id"])
        assert mine.features == theirs.features
    local = sum(p.stat().st_size for p in question_shards(by_config))
    assert local > 2 * sum(p.stat().st_size for p in question_shards(out))


def test_reference_mode_points_at_the_users_files(gemex_release, tmp_path):
    out = tmp_path / "ref"
    build(gemex_release, out)
    ds = load_dataset(str(out), split="test")
    raw = ds.cast_column("image", ds.features["image"].__class__(decode=False))[0]["image"]
    assert raw["bytes"] is None and Path(raw["path"]).is_absolute() and Path(raw["path"]).exists()
    assert ds[0]["image"].size == (ds[0]["image_width"], ds[0]["image_height"])
    for path in out.rglob("*.parquet"):
        image_bytes = pq.read_table(path, columns=["image"]).column("image").combine_chunks().field("bytes")
        assert image_bytes.null_count == len(image_bytes), "reference mode copies no image"


def test_none_mode_needs_no_images_and_has_no_image_column(gemex_release, tmp_path):
    out = tmp_path / "none"
    build(gemex_release, out, image_mode="none", images=None)
    ds = load_dataset(str(out), split="train")
    assert "image" not in ds.column_names and ds[0]["boxes"] is None and ds[0]["boxes_224"]


def test_image_size_resizes_and_boxes_follow(gemex_release, gemex_embed, tmp_path):
    out = tmp_path / "small"
    build(gemex_release, out, image_mode="embed", image_size=128)
    small = load_dataset(str(out), split="test").sort("question_id")
    full = load_dataset(str(gemex_embed[0]), split="test").sort("question_id")
    for a, b in zip(small, full):
        assert max(a["image"].size) == 128 == max(a["image_width"], a["image_height"])
        scale = a["image_width"] / b["image_width"]
        for box_a, box_b in zip(a["boxes"], b["boxes"]):
            assert box_a == pytest.approx([v * scale for v in box_b], abs=1.5)


def test_the_three_layouts_build_the_same_questions(gemex_release, tmp_path):
    rows = {}
    for layout in ("per_type", "llava", "grouped"):
        out = tmp_path / layout
        build(
            gemex_release, out, source=gemex_release.root / layout, image_mode="none", images=gemex_release.image_root
        )
        ds = load_dataset(str(out), split="train")
        rows[layout] = {r["question_id"]: r for r in ds}
    assert rows["per_type"].keys() == rows["llava"].keys() == rows["grouped"].keys()
    for qid, row in rows["per_type"].items():
        for layout in ("llava", "grouped"):
            other = rows[layout][qid]
            for column in (
                "question",
                "choices",
                "answer",
                "answer_letters",
                "reason",
                "boxes_224",
                "boxes",
                "image_path",
            ):
                assert other[column] == row[column], (layout, qid, column)
        assert rows["llava"][qid]["report"] is None and rows["llava"][qid]["regions"] == []


def test_split_comes_from_the_folder_or_the_option(gemex_release, tmp_path):
    out = tmp_path / "forced"
    build(
        gemex_release,
        out,
        source=gemex_release.root / "per_type" / "test",
        split="valid",
        image_mode="none",
        images=None,
    )
    assert list(load_dataset(str(out))) == ["validation"]


def test_existing_output_is_kept_without_overwrite(gemex_release, gemex_embed):
    out, _ = gemex_embed
    before = (out / "build_report.json").read_bytes()
    with pytest.raises(BuildError, match="already exists"):
        build(gemex_release, out)
    assert (out / "build_report.json").read_bytes() == before


def test_failed_build_leaves_no_folder(gemex_release, tmp_path, monkeypatch):
    import gemex_dataset.build as gb

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gb.GemexBuild, "write_card", boom)
    with pytest.raises(KeyboardInterrupt):
        build(gemex_release, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_shard_write_fails_the_build_and_leaves_no_folder(gemex_release, tmp_path, monkeypatch):
    """Row groups are written on a background thread: its failure must still stop the build."""

    def disk_full(self, table, row_group_size=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    with pytest.raises(BuildError, match="the disk is full"):
        build(gemex_release, tmp_path / "out", image_mode="embed")
    assert list(tmp_path.iterdir()) == []


def test_num_proc_gives_the_same_shards(gemex_release, gemex_embed, tmp_path):
    out = tmp_path / "par"
    report = build(gemex_release, out, image_mode="embed", num_proc=2)
    assert report.shards == gemex_embed[1].shards


def test_a_rebuilt_folder_loads_afresh(gemex_release, tmp_path):
    """`datasets` caches local folders by their card alone; the card names the build's content."""
    out = tmp_path / "same"
    build(gemex_release, out, image_mode="none", images=None)
    first = load_dataset(str(out), split="test")
    build(gemex_release, out, image_mode="none", images=None, source=gemex_release.root / "llava", overwrite=True)
    again = load_dataset(str(out), split="test")
    assert set(first["source_layout"]) == {"per_type"} and set(again["source_layout"]) == {"llava"}


def test_shards_declare_exactly_the_features_schema(gemex_embed):
    """Images are written dictionary-encoded, but every reader sees the features' own types."""
    out, _ = gemex_embed
    for path in question_shards(out):
        assert pq.ParquetFile(path).schema_arrow.equals(features("embed").arrow_schema, check_metadata=False)
        assert pq.read_table(path).schema.field("image").type == features("embed").arrow_schema.field("image").type


def test_card_documents_every_column(gemex_embed):
    from gemex_dataset.features import COLUMN_DOCS

    card = (gemex_embed[0] / "README.md").read_text()
    assert set(features("embed")) <= set(COLUMN_DOCS)
    assert all(f"- `{name}`: {COLUMN_DOCS[name]}" in card for name in features("embed"))


def test_reference_and_none_rows_made_a_column_at_a_time_match_the_embed_rows_made_a_row_at_a_time(
    tmp_path, header_readers
):
    """Only `embed` attaches images row by row (`group_rows`); the other modes attach them column-wise."""
    from gemex_dataset.prompts import to_messages
    from gemex_dataset.synthetic.release import generate

    release = generate(tmp_path / "release", num_images=12, seed=3)
    missing = sorted(release.image_root.rglob("*.jpg"))[4]
    missing.unlink()
    builds = {mode: build(release, tmp_path / mode, image_mode=mode) for mode in ("embed", "reference", "none")}

    def rows(mode: str) -> list[dict]:
        table = pq.read_table(question_shards(tmp_path / mode))
        return sorted(
            table.drop_columns([c for c in ("image",) if c in table.column_names]).to_pylist(),
            key=lambda r: r["question_id"],
        )

    embed, reference, none = rows("embed"), rows("reference"), rows("none")
    assert reference == embed and len(embed) > 50
    assert any(row["boxes"] for row in reference) and all(row["messages"] == to_messages(row) for row in reference)
    assert builds["reference"].rejected == builds["embed"].rejected > 0
    assert sorted(map(str, builds["reference"].rejects)) == sorted(map(str, builds["embed"].rejects))
    assert builds["reference"].notices == builds["embed"].notices
    lost = {row["question_id"] for row in none} - {row["question_id"] for row in embed}
    assert lost and all(
        row["image_width"] is None and row["boxes"] is None for row in none if row["question_id"] in lost
    )
    by_id = {row["question_id"]: row for row in embed}
    kept = [row for row in none if row["question_id"] not in lost]
    assert kept and all(row == {k: by_id[row["question_id"]][k] for k in row} for row in kept)


def test_a_root_with_the_same_questions_in_three_layouts_is_read_once_in_one(gemex_release, tmp_path):
    """The synthetic root, like the release as downloaded, holds every split in per_type, llava and
    grouped: the build reads per_type alone and says so, rather than rejecting two copies as repeats."""
    alone = build(gemex_release, tmp_path / "per_type", image_mode="none", images=None)
    report = build(gemex_release, tmp_path / "root", source=gemex_release.root, image_mode="none", images=None)
    assert report.rejected == 0
    assert report.records_read == report.rows_written == alone.records_read
    assert "read per_type" in report.summary() and "6 grouped/llava file(s) not read" in report.summary()
    assert json.loads((tmp_path / "root" / "build_report.json").read_text())["source_note"] == report.source_note
    assert set(load_dataset(str(tmp_path / "root"), split="train")["source_layout"]) == {"per_type"}


def test_splits_in_different_layouts_are_all_read(gemex_release, tmp_path):
    """A source whose splits each come in one layout (train as LLaVA, test per type) is read whole."""
    source = tmp_path / "mixed"
    shutil.copytree(gemex_release.root / "llava" / "train", source / "train")
    shutil.copytree(gemex_release.root / "per_type" / "test", source / "test")
    report = build(gemex_release, tmp_path / "out", source=source, image_mode="none", images=None)
    assert report.source_note == "" and report.rejected == 0
    assert set(report.rows) >= {"train/open_ended", "test/open_ended"}
