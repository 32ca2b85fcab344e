"""One conversation per image (GEMeX `sft_per_image`) and per study (ReXVQA `sft_per_study`):
every question once with its `sft` reply, a turn order fixed by the seed, long conversations cut
at the limit, the config's own shard set in the card, report and validate, and the Arrow cache a
non-streaming load writes."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset
from huggingface_hub import DatasetCard

from builders.assembly.conversations import CHARS_PER_TOKEN, balanced_parts, turn_order
from builders.assembly.report import BuildReport
from builders.assembly.settings import BuildSettings
from builders.assembly.shards import sha256
from builders.built_folder import card_configs, config_shards
from builders.hub.validate import validate
from gemex_dataset.build import build_gemex
from rexvqa_dataset.build import build_rexvqa
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa

SPLITS = ("train", "validation", "test")


def gemex(release, out: Path, **settings) -> Path:
    build_gemex(
        BuildSettings(
            source=release.root / "per_type", out=out, images=release.image_root, **{"image_mode": "embed", **settings}
        )
    )
    return out


@pytest.fixture(scope="module")
def builds(gemex_release, rexvqa_release, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("conversations")
    made = {
        "gemex": gemex(gemex_release, root / "gemex"),
        "gemex-reference": gemex(gemex_release, root / "ref", image_mode="reference"),
    }
    for mode in ("embed", "reference"):
        build_rexvqa(BuildSettings(source=rexvqa_release.root, out=root / f"rexvqa-{mode}", image_mode=mode))
        made[f"rexvqa-{mode}"] = root / f"rexvqa-{mode}"
    return made


def config_table(folder: Path, config: str, split: str, columns: list[str] | None = None) -> pa.Table:
    configs, _ = card_configs(folder)
    return pq.read_table(config_shards(folder, configs[config])[split], columns=columns)


def text(message: dict) -> str:
    return "".join(part["text"] for part in message["content"] if part["type"] == "text")


CONVERSATION_CONFIG = {
    "gemex": "sft_per_image",
    "gemex-reference": "sft_per_image",
    "rexvqa-embed": "sft_per_study",
    "rexvqa-reference": "sft_per_study",
}


@pytest.mark.parametrize("build", list(CONVERSATION_CONFIG))
def test_every_question_is_one_turn_with_its_sft_reply(build, builds):
    folder, config = builds[build], CONVERSATION_CONFIG[build]
    image_column = "image" if build.startswith("gemex") else "images"
    for split in SPLITS:
        sft = {
            row["question_id"]: row
            for row in config_table(folder, "sft", split, ["question_id", "messages", image_column]).to_pylist()
        }
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
            assert images == [images[0]] + [0] * (len(ids) - 1) and images[0] == (
                1 if image_column == "image" else len(row["images"])
            )
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
    default = {
        row["question_id"]: row for row in config_table(folder, "default", "test").drop_columns(["image"]).to_pylist()
    }
    for row in config_table(folder, "sft_per_image", "test").drop_columns(["image"]).to_pylist():
        for q, turn in zip(row["question_ids"], row["turns"]):
            assert turn == {k: default[q][k] for k in turn}
            assert all(
                row[k] == default[q][k] for k in ("image_path", "image_width", "image_height", "dicom_id", "split")
            )


def test_turn_order_is_fixed_by_the_seed(gemex_release, builds, tmp_path):
    first = builds["gemex"]
    again = gemex(gemex_release, tmp_path / "again")
    other = gemex(gemex_release, tmp_path / "other", turn_seed=1)
    ids = {
        name: config_table(folder, "sft_per_image", "train", ["question_ids"])["question_ids"].to_pylist()
        for name, folder in (("first", first), ("again", again), ("other", other))
    }
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
    assert balanced_parts([30, 500, 40, 60, 20], 10, 200) == [[0, 2, 3, 4], [1]]  # a turn longer than the limit alone
    assert balanced_parts([], 0, 10) == []


@pytest.mark.parametrize("turns", [40, 1000, 16000])
def test_one_turn_too_long_for_a_row_goes_alone_and_the_others_fill_the_fewest_rows(turns):
    """A 9,000-character turn cost every turn of its image a row of its own, and the search grew as turns squared."""
    costs = [150 + (k * 7919) % 550 for k in range(turns)]
    long = turns // 3
    costs[long] = 9000
    per_row, limit = 120, 8192
    rows = balanced_parts(costs, per_row, limit)
    assert sorted(k for row in rows for k in row) == list(range(turns))
    assert (
        [long] in rows
        and all(row == sorted(row) for row in rows)
        and [row[0] for row in rows] == sorted(row[0] for row in rows)
    )
    rest = [row for row in rows if row != [long]]
    assert all(per_row + sum(costs[k] for k in row) <= limit for row in rest)
    others = [c for k, c in enumerate(costs) if k != long]
    fewest, filled = 1, per_row  # in turn order, each row filled as far as it goes: no cut into fewer rows fits
    for cost in others:
        fewest, filled = (fewest + 1, per_row + cost) if filled + cost > limit else (fewest, filled + cost)
    assert len(rest) == fewest


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
    assert sorted(q for row in rows for q in row["question_ids"]) == sorted(
        q for ids in whole["question_ids"].to_pylist() for q in ids
    )


def test_a_question_with_a_9000_character_reason_has_a_row_alone_and_its_image_one_more(gemex_release, tmp_path):
    release = tmp_path / "release"
    shutil.copytree(gemex_release.root / "per_type" / "train", release / "train")
    path = release / "train" / "open_ended_question.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    image = Counter(record["image_path"] for record in lines).most_common(1)[0][0]
    long = next(k for k, record in enumerate(lines) if record["image_path"] == image)
    lines[long]["reason"] = ("The opacity is seen. " * 450)[:9000]
    path.write_text("\n".join(json.dumps(record) for record in lines) + "\n")
    out = tmp_path / "out"
    build_gemex(BuildSettings(source=release, out=out, images=gemex_release.image_root, image_mode="reference"))
    default = config_table(out, "default", "train", ["question_id", "image_path", "reason"]).to_pylist()
    asked = [q for q in default if q["image_path"] == image.removeprefix("files/")]
    [long_id] = [q["question_id"] for q in asked if len(q["reason"]) == 9000]
    rows = [
        row
        for row in config_table(out, "sft_per_image", "train", ["image_path", "question_ids"]).to_pylist()
        if row["image_path"] == image.removeprefix("files/")
    ]
    assert len(asked) > 3
    assert sorted((len(row["question_ids"]), set(row["question_ids"])) for row in rows) == [
        (1, {long_id}),
        (len(asked) - 1, {q["question_id"] for q in asked} - {long_id}),
    ]


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
    assert all(
        infos[config].splits[s].num_examples == n
        for s, n in ((key.split("/")[0], n) for key, n in report["conversation_rows"].items())
    )
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
    table = pa.concat_tables(
        config_table(folder, "sft_per_image", split) for split in SPLITS
    )  # a load prepares every split
    images = sum(
        len(image["bytes"])
        for image in {
            row["image_path"]: row["image"] for row in table.select(["image_path", "image"]).to_pylist()
        }.values()
    )
    text_bytes = table.drop_columns(["image"]).nbytes
    per_image = arrow_cache_bytes(folder, "sft_per_image", tmp_path / "per_image")
    per_question = arrow_cache_bytes(folder, "sft", tmp_path / "per_question")
    assert per_image <= 1.3 * images + text_bytes, (per_image, images, text_bytes)
    assert per_question > 5 * images


def image_parts(messages: list[dict]) -> int:
    return sum(part["type"] == "image" for m in messages for part in m["content"])


def studies_with_odd_image_lists(release: Path) -> tuple[str, str]:
    """Edit a ReXVQA release: one study's questions each list its first image twice; another's first question
    lists only its first image, its second question only the others. Returns the two study ids."""
    path = release / "metadata" / "train_vqa_data.json"
    records = json.loads(path.read_text())
    by_study: dict[str, list[str]] = {}
    for key, record in records.items():
        by_study.setdefault(record["study_id"], []).append(key)
    twice, apart = [s for s, keys in by_study.items() if len(keys) >= 2 and len(records[keys[0]]["ImagePath"]) >= 2][:2]
    for key in by_study[twice]:
        record = records[key]
        record["ImagePath"], record["ImageViewPosition"] = (
            [record["ImagePath"][0]] * 2,
            [record["ImageViewPosition"][0]] * 2,
        )
    first, second = (records[key] for key in by_study[apart][:2])
    for record, cut in ((first, slice(0, 1)), (second, slice(1, None))):
        record["ImagePath"], record["ImageViewPosition"] = record["ImagePath"][cut], record["ImageViewPosition"][cut]
    path.write_text(json.dumps(records, indent=1))
    return twice, apart


@pytest.mark.parametrize("mode", ["embed", "reference"])
def test_a_rows_image_parts_are_its_images_whatever_its_questions_list(mode, tmp_path):
    """A record listing its image twice, and a study whose questions show different images: each row of every
    config holds one image part per image it shows, the conversation row its study's images each once."""
    from training_recipes.data import ConversationSettings, to_messages

    release = generate_rexvqa(tmp_path / "release", num_studies=6, seed=3).root
    twice, apart = studies_with_odd_image_lists(release)
    folder = tmp_path / "built"
    build_rexvqa(BuildSettings(source=release, out=folder, image_mode=mode))
    assert validate(folder) == []
    for config in ("sft", "sft_per_study"):
        rows = config_table(folder, config, "train").to_pylist()
        assert all(image_parts(row["messages"]) == len(row["images"]) for row in rows)
    studies = {row["study_id"]: row for row in config_table(folder, "sft_per_study", "train").to_pylist()}
    assert len(studies[twice]["images"]) == 1 and len(studies[apart]["images"]) == 2
    for study in (twice, apart):
        row = studies[study]
        assert image_parts(to_messages(row, "rexvqa", ConversationSettings())) == len(row["images"])
        without_images = {k: v for k, v in row.items() if k != "images"}  # as token counting reads it
        assert image_parts(to_messages(without_images, "rexvqa", ConversationSettings())) == len(row["images"])


@pytest.mark.parametrize("config", ["sft", "sft_per_study"])
def test_validate_catches_image_parts_that_are_not_the_rows_images(config, builds, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(builds["rexvqa-reference"], folder)
    path = config_shards(folder, card_configs(folder)[0][config])["train"][0]
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[1]["messages"][1]["content"].insert(0, {"type": "image", "text": None})
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    shard = path.relative_to(folder).as_posix()
    BuildReport.add_files(folder / "build_report.json", {shard: sha256(path)}, {})
    problems = [p for p in validate(folder) if p.rule == "image-parts"]
    assert [p.file for p in problems] == [shard]
    assert (
        f"row 1 shows {len(rows[1]['images'])} image(s) in `images` but its messages hold {len(rows[1]['images']) + 1}"
        in problems[0].detail
    )
