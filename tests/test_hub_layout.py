"""The Hub's dataset viewer, emulated: for every config of both datasets, the rows of its data
files read as they are (pyarrow, no `filters`, as the viewer links them) are the rows
`load_dataset(folder, config)` returns."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from builders.assembly.settings import BuildSettings
from builders.built_folder import card_configs, config_shards
from builders.hub.validate import validate
from gemex_dataset.build import build_gemex
from rexvqa_dataset.build import build_rexvqa


def build(dataset: str, source: Path, out: Path, layout: str, gemex_release=None, conversations: bool = True) -> Path:
    if dataset == "gemex":
        build_gemex(
            BuildSettings(
                source=gemex_release.root / "per_type",
                out=out,
                images=gemex_release.image_root,
                image_mode="embed",
                shard_layout=layout,
                no_conversations=not conversations,
            )
        )
    else:
        build_rexvqa(
            BuildSettings(
                source=source, out=out, image_mode="embed", shard_layout=layout, no_conversations=not conversations
            )
        )
    return out


def row_id(folder: Path, config: dict) -> str:
    """The config's id column: `question_id`, or `conversation_id` in the one-conversation-per-image config."""
    paths = next(paths for paths in config_shards(folder, config).values() if paths)
    return "question_id" if "question_id" in pq.read_schema(paths[0]).names else "conversation_id"


def viewer_rows(folder: Path, config: dict) -> dict[str, list[str]]:
    """What the viewer shows per split: every row of the config's files, unfiltered."""
    column = row_id(folder, config)
    return {
        split: [i for path in paths for i in pq.read_table(path, columns=[column]).column(column).to_pylist()]
        for split, paths in config_shards(folder, config).items()
    }


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_every_config_shows_in_the_viewer_what_load_dataset_returns(dataset, gemex_release, rexvqa_release, tmp_path):
    out = build(dataset, rexvqa_release.root, tmp_path / dataset, "auto", gemex_release)
    configs, _ = card_configs(out)
    assert {"default", "sft", {"gemex": "sft_per_image", "rexvqa": "sft_per_study"}[dataset]} < set(configs) and len(
        configs
    ) > 3
    for name, config in configs.items():
        assert "filters" not in config
        for split, shown in viewer_rows(out, config).items():
            loaded = load_dataset(str(out), name, split=split)[row_id(out, config)]
            assert sorted(shown) == sorted(loaded) and len(shown) == len(set(shown)), (name, split)
    assert validate(out) == []


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_validate_fails_a_layout_whose_configs_the_viewer_shows_wrong(dataset, gemex_release, rexvqa_release, tmp_path):
    out = build(dataset, rexvqa_release.root, tmp_path / dataset, "shared", gemex_release)
    problems = [p for p in validate(out) if p.rule == "viewer-rows"]
    configs, _ = card_configs(out)
    filtered = {name for name, config in configs.items() if config.get("filters")}
    assert filtered and {p.detail.split("'")[1] for p in problems} == filtered
    assert all("filters" in p.detail and "by-config" in p.detail for p in problems)


def studies_per_row_group(path: Path) -> list[list[str]]:
    parquet = pq.ParquetFile(path)
    groups = []
    for g in range(parquet.metadata.num_row_groups):
        ids = parquet.read_row_group(g, columns=["study_id"]).column("study_id").to_pylist()
        groups.append([s for k, s in enumerate(ids) if k == 0 or ids[k - 1] != s])
    return groups


def test_images_two_configs_share_lie_in_one_run_in_both_files(rexvqa_release, tmp_path):
    """The Xet store deduplicates whole ~64 KiB chunks, about one image: the studies the second
    largest config shares with the largest one must be one unbroken run in each file's row group,
    in the same order, not scattered among the studies only one of them has."""
    out = build("rexvqa", rexvqa_release.root, tmp_path / "rexvqa", "auto")
    files = {
        p.name.split("-")[0]: p
        for p in (out / "data" / "train").glob("*.parquet")
        if not p.name.startswith("sft_per_study-")
    }
    first, second = sorted(files, key=lambda c: -pq.ParquetFile(files[c]).metadata.num_rows)[:2]
    for big, small in zip(studies_per_row_group(files[first]), studies_per_row_group(files[second])):
        shared = set(big) & set(small)
        assert shared and set(small) - shared and set(big) - shared  # the test means something
        in_big = [k for k, s in enumerate(big) if s in shared]
        in_small = [k for k, s in enumerate(small) if s in shared]
        assert in_big == list(range(in_big[0], in_big[0] + len(shared)))
        assert in_small == list(range(in_small[0], in_small[0] + len(shared)))
        assert [big[k] for k in in_big] == [small[k] for k in in_small]


def image_copies(folder: Path) -> Counter[bytes]:
    """How many times each distinct image's bytes occur in the folder's Parquet files, read as raw bytes."""
    images = set()
    for path in folder.rglob("*.parquet"):
        column = "image" if "image" in pq.read_schema(path).names else "images"
        for value in pq.read_table(path, columns=[column]).column(column).to_pylist():
            images.update(image["bytes"] for image in (value if isinstance(value, list) else [value]))
    files = [path.read_bytes() for path in folder.rglob("*.parquet")]
    return Counter({image: sum(data.count(image) for data in files) for image in images})


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_shared_layout_without_conversations_stores_each_image_once(dataset, gemex_release, rexvqa_release, tmp_path):
    """`--shard-layout shared --no-conversations`: every image once on disk, every config still loads its rows."""
    conversation = {"gemex": "sft_per_image", "rexvqa": "sft_per_study"}[dataset]
    with_them = build(dataset, rexvqa_release.root, tmp_path / "with", "shared", gemex_release)
    assert set(image_copies(with_them).values()) == {2}  # the conversation config's files hold each image again
    out = build(dataset, rexvqa_release.root, tmp_path / "without", "shared", gemex_release, conversations=False)
    copies = image_copies(out)
    assert copies.keys() == image_copies(with_them).keys() and set(copies.values()) == {1}
    assert f"once more in\n`{conversation}`" in (with_them / "README.md").read_text()  # the card says what it holds
    assert "once more in" not in (out / "README.md").read_text()
    configs, infos = card_configs(out)
    assert conversation not in configs and {"default", "sft"} < set(configs)
    assert {p.rule for p in validate(out)} == {"viewer-rows"}  # the shared layout's one refusal: not for the Hub viewer
    asked = {
        split: sorted(load_dataset(str(out), "default", split=split)["question_id"])
        for split in infos["default"].splits
    }
    typed: dict[str, list[str]] = {split: [] for split in asked}
    for name in configs:
        for split, info in infos[name].splits.items():
            rows = load_dataset(str(out), name, split=split)
            assert len(rows) == info.num_examples > 0 and "question_id" in rows.column_names, (name, split)
            if name not in ("default", "sft"):
                typed[split] += rows["question_id"]
    assert {split: sorted(ids) for split, ids in typed.items()} == asked
