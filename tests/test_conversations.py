"""One conversation per image (GEMeX `sft_per_image`) and per study (ReXVQA `sft_per_study`):
every question once with its `sft` reply, a turn order fixed by the seed, long conversations cut
at the limit, the config's own shard set in the card, report and validate, and the Arrow cache a
non-streaming load writes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset
from huggingface_hub import DatasetCard

from builders.assembly.conversations import CHARS_PER_TOKEN, balanced_parts, turn_order
from builders.assembly.pipeline import BuildSettings
from builders.assembly.report import BuildReport
from builders.assembly.shards import sha256
from builders.hub.validate import card_configs, config_shards, validate
from gemex_dataset.build import build_gemex
from rexvqa_dataset.build import build_rexvqa

SPLITS = ("train", "validation", "test")


def gemex(release, out: Path, **settings) -> Path:
    build_gemex(BuildSettings(source=release.root / "per_type", out=out, images=release.image_root,
                              **{"image_mode": "embed", **settings}))
    return out


@pytest.fixture(scope="module")
def builds(gemex_release, rexvqa_release, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("conversations")
    made = {"gemex": gemex(gemex_release, root / "gemex"), "gemex-reference": gemex(gemex_release, root / "ref", image_mode="reference")}
    for mode in ("embed", "reference"):
        build_rexvqa(BuildSettings(source=rexvqa_release.root, out=root / f"rexvqa-{mode}", image_mode=mode))
        made[f"rexvqa-{mode}"] = root / f"rexvqa-{mode}"
    return made


def config_table(folder: Path, config: str, split: str, columns: list[str] | None = None) -> pa.Table:
    configs, _ = card_configs(folder)
    return pq.read_table(config_shards(folder, configs[config])[split], columns=columns)


def text(message: dict) -> str:
    return "".join(part["text"] for part in message["content"] if part["type"] == "text")


CONVERSATION_CONFIG = {"gemex": "sft_per_image", "gemex-reference": "sft_per_image", "rexvqa-embed": "sft_per_study", "rexvqa-reference": "sft_per_study"}


@pytest.mark.parametrize("build", list(CONVERSATION_CONFIG))
def test_every_question_is_one_turn_with_its_sft_reply(build, builds):
    folder, config = builds[build], CONVERSATION_CONFIG[build]
    image_column = "image" if build.startswith("gemex") else "images"
    for split in SPLITS:
        sft = {row["question_id"]: row for row in config_table(folder, "sft", split, ["question_id", "messages", image_column]).to_pylist()}
        rows = config_table(folder, config, split).to_pylist()
        asked = Counter(q for row in rows for q in row["question_ids"])
        assert set(asked) == set(sft) and set(asked.values()) == {1}
        for row in rows:
            messages, ids = row["messages"], row["question_ids"]
            assert len(row["turns"]) == len(ids)
            system = [text(m) for m in messages if m["role"] == "system"]
            users = [m for m in messages if m["role"] == "user"]
            replies = [text(m) for m in messages if m["role"] == "assistant"]
            assert [m["role"] for m in messages] == ["system"] * len(system) + ["user", "assistant"] * len(ids)
            assert replies == [text(sft[q]["messages"][-1]) for q in ids]
            images = [sum(p["type"] == "image" for p in m["content"]) for m in users]
            assert images == [images[0]] + [0] * (len(ids) - 1) and images[0] == (1 if image_column == "image" else len(row["images"]))
            for user, q in zip(users, ids):  # the question as sft asks it, its own instruction first where they differ
                instruction, question = text(sft[q]["messages"][0]), text(sft[q]["messages"][1])
                assert text(user) == (question if system else f"{instruction}\n{question}")
                assert system in ([], [instruction])
            if image_column == "images":  # every image the study's questions show, once
                shown = {image["path"] for q in ids for image in sft[q]["images"]}
                assert {image["path"] for image in row["images"]} >= shown


def test_gemex_instruction_is_a_system_turn_only_when_every_turn_shares_it(builds):
    rows = config_table(builds["gemex"], "sft_per_image", "train").to_pylist()
    for row in rows:
        one_type = len({turn["question_type"] for turn in row["turns"]}) == 1
        assert (row["messages"][0]["role"] == "system") == one_type
    assert any(row["messages"][0]["role"] == "user" for row in rows)


def test_typed_turns_are_the_questions_columns(builds):
    folder = builds["gemex"]
    default = {row["question_id"]: row for row in config_table(folder, "default", "test").drop_columns(["image"]).to_pylist()}
    for row in config_table(folder, "sft_per_image", "test").drop_columns(["image"]).to_pylist():
        for q, turn in zip(row["question_ids"], row["turns"]):
            assert turn == {k: default[q][k] for k in turn}
            assert all(row[k] == default[q][k] for k in ("image_path", "image_width", "image_height", "dicom_id", "split"))


def test_turn_order_is_fixed_by_the_seed(gemex_release, builds, tmp_path):
    first = builds["gemex"]
    again = gemex(gemex_release, tmp_path / "again")
    other = gemex(gemex_release, tmp_path / "other", turn_seed=1)
    ids = {name: config_table(folder, "sft_per_image", "train", ["question_ids"])["question_ids"].to_pylist()
           for name, folder in (("first", first), ("again", again), ("other", other))}
    assert ids["first"] == ids["again"]
    assert ids["first"] != ids["other"]
    assert sorted(map(sorted, ids["first"])) == sorted(map(sorted, ids["other"]))
    assert turn_order(0, "train/x", 10) == turn_order(0, "train/x", 10) != turn_order(1, "train/x", 10)
    assert sorted(turn_order(0, "train/x", 10)) == list(range(10))
    release_order = [ids for ids in ids["first"] if len(ids) > 3]
    assert any(row != sorted(row) for row in release_order)


def test_balanced_parts_cut_evenly_and_keep_every_turn():
    assert balanced_parts([100] * 10, 0, 450) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert balanced_parts([100] * 4, 50, 1000) == [[0, 1, 2, 3]]
    parts = balanced_parts([30, 500, 40, 60, 20], 10, 200)  # one turn longer than the limit keeps a row alone
    assert [k for run in parts for k in run] == list(range(5)) and [1] in parts
    assert all(10 + sum([30, 500, 40, 60, 20][k] for k in run) <= 200 for run in parts if run != [1])
    assert balanced_parts([], 0, 10) == []


def test_long_conversations_are_cut_into_rows_of_the_same_image(gemex_release, tmp_path):
    tokens = 150
    folder = gemex(gemex_release, tmp_path / "short", conversation_tokens=tokens)
    assert validate(folder) == []
    rows = config_table(folder, "sft_per_image", "train").drop_columns(["image"]).to_pylist()
    per_image = Counter(row["image_path"] for row in rows)
    assert max(per_image.values()) > 1
    for row in rows:
        chars = sum(len(part["text"] or "") for m in row["messages"] for part in m["content"])
        instructions = sum(len(text(m)) + 1 for m in row["messages"] if m["role"] == "system")
        assert chars <= tokens * CHARS_PER_TOKEN + instructions or len(row["question_ids"]) == 1
    for path, count in per_image.items():
        parts = sorted(int(r["conversation_id"].rsplit("/", 1)[1]) for r in rows if r["image_path"] == path)
        assert parts == list(range(count))
    whole = config_table(gemex(gemex_release, tmp_path / "whole"), "sft_per_image", "train", ["question_ids"])
    assert sorted(q for row in rows for q in row["question_ids"]) == sorted(q for ids in whole["question_ids"].to_pylist() for q in ids)


@pytest.mark.parametrize("build", ["gemex", "rexvqa-embed"])
def test_own_shard_set_in_card_report_and_validate(build, builds):
    folder, config = builds[build], CONVERSATION_CONFIG[build]
    configs, infos = card_configs(folder)
    entry = {item["split"]: item["path"] for item in configs[config]["data_files"]}
    assert entry == {split: f"data/{split}/{config}-*.parquet" for split in SPLITS}
    default_files = {p for paths in config_shards(folder, configs["default"]).values() for p in paths}
    assert not any(p.name.startswith(config) for p in default_files)
    report = json.loads((folder / "build_report.json").read_text())
    assert config in report["configs"]
    shards = sorted(str(p.relative_to(folder)) for p in folder.glob(f"data/*/{config}-*.parquet"))
    assert shards and all(len(report["shards"][s]) == 64 for s in shards)
    assert {f"{s}/{config}" for s in SPLITS} == set(report["conversation_rows"])
    assert all(infos[config].splits[s].num_examples == n for s, n in
               ((key.split("/")[0], n) for key, n in report["conversation_rows"].items()))
    card = DatasetCard.load(folder / "README.md").text
    assert f"(`{config}`)" in card and "Use `sft` for the paper's per-question setup" in card
    assert validate(folder) == []


def test_validate_catches_a_conversation_config_that_loses_or_changes_a_question(builds, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(builds["gemex"], folder)
    [path] = folder.glob("data/test/sft_per_image-*.parquet")
    shard = path.relative_to(folder).as_posix()

    def rewrite(rows: list[dict]) -> None:
        """Write the shard and vouch for it in the report, so only the conversation check can object."""
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
        BuildReport.add_files(folder / "build_report.json", {shard: sha256(path)}, {})

    table = pq.read_table(path)
    rows = table.to_pylist()
    original = [dict(row) for row in rows]
    rows[0]["messages"][-1]["content"][0]["text"] += " changed"
    rewrite(rows)
    assert [(p.rule, "replies differ" in p.detail) for p in validate(folder)] == [("conversations", True)]
    rows = [dict(row) for row in original]
    rows[0]["question_ids"] = [rows[1]["question_ids"][0], *rows[0]["question_ids"][1:]]
    rewrite(rows)
    [problem] = validate(folder)
    assert problem.rule == "conversations" and "1 asked twice, 1 missing" in problem.detail


def arrow_cache_bytes(folder: Path, config: str, cache: Path) -> int:
    """The Arrow cache a non-streaming `load_dataset` of `config` writes (every split)."""
    load_dataset(str(folder), config, split="train", cache_dir=str(cache))
    return sum(p.stat().st_size for p in cache.rglob("*.arrow"))


def test_a_non_streaming_load_caches_each_image_once(builds, tmp_path):
    """The cache of `sft_per_image` is the distinct images once plus its text; `sft`'s holds an image per question."""
    folder = builds["gemex"]
    table = pa.concat_tables(config_table(folder, "sft_per_image", split) for split in SPLITS)  # a load prepares every split
    images = sum(len(image["bytes"]) for image in {row["image_path"]: row["image"] for row in
                                                   table.select(["image_path", "image"]).to_pylist()}.values())
    text_bytes = table.drop_columns(["image"]).nbytes
    per_image = arrow_cache_bytes(folder, "sft_per_image", tmp_path / "per_image")
    per_question = arrow_cache_bytes(folder, "sft", tmp_path / "per_question")
    assert per_image <= 1.3 * images + text_bytes, (per_image, images, text_bytes)
    assert per_question > 5 * images
