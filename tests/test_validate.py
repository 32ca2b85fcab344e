from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard

import builders.hub.validate as validate_module
from builders.hub.validate import check_ready, validate
from cxr_vqa.cli import main

from .publish_builds import built, copy_build


@pytest.fixture(scope="session")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("builds")


@pytest.fixture
def build(root, tmp_path) -> Path:
    return copy_build("synthetic-embed", root, tmp_path / "gemex")


def rules(problems) -> set[tuple[str, str]]:
    return {(p.file, p.rule) for p in problems}


@pytest.mark.parametrize("kind", ["synthetic-embed", "synthetic-none", "real-none"])
def test_builds_are_viewer_ready(root, kind):
    assert validate(built(kind, root)) == []


def test_missing_card(build):
    (build / "README.md").unlink()
    assert rules(validate(build)) == {("README.md", "card")}


def test_yaml_that_does_not_parse(build):
    text = (build / "README.md").read_text()
    (build / "README.md").write_text(text.replace("configs:\n", "configs: [\n", 1))
    [problem] = validate(build)
    assert (problem.file, problem.rule) == ("README.md", "card")


def test_file_with_other_columns(build):
    path = next((build / "data" / "train").glob("*.parquet"))
    table = pq.read_table(path).drop_columns(["reason"])
    pq.write_table(table, path)
    found = rules(validate(build))
    rel = str(path.relative_to(build))
    assert (rel, "columns") in found or (rel, "features") in found
    assert any(p.rule == "columns" and "reason" in p.detail for p in validate(build))


def test_card_features_differ_from_shards(build):
    card = DatasetCard.load(build / "README.md")
    for info in card.data["dataset_info"]:
        info["features"] = [f for f in info["features"] if f["name"] != "reason"]
    card.save(build / "README.md")
    problems = validate(build)
    assert {p.rule for p in problems} == {"features"}
    assert all("reason" in p.detail for p in problems)


def test_counted_splits_are_the_splits_on_disk(build):
    for path in (build / "data" / "validation").glob("*.parquet"):
        path.unlink()
    (build / "data" / "validation").rmdir()
    problems = validate(build)
    assert ("README.md", "splits") in rules(problems)
    assert ("README.md", "data-files") in rules(problems)
    assert any("validation" in p.detail for p in problems if p.rule == "splits")


def test_row_counts_must_match(build):
    path = next((build / "data" / "test").glob("*.parquet"))
    table = pq.read_table(path)
    last_type = ["open_ended", "closed_ended", "single_choice", "multi_choice"][table["question_type"][-1].as_py()]
    pq.write_table(table.slice(0, table.num_rows - 1), path)
    wrong = {p.detail.split("'")[1] for p in validate(build) if p.rule == "splits"}
    assert wrong == {"default", "sft", last_type}


def test_illegal_config_name(build):
    card = DatasetCard.load(build / "README.md")
    for config in card.data["configs"]:
        if config["config_name"] == "open_ended":
            config["config_name"] = "open ended?"
    for info in card.data["dataset_info"]:
        if info["config_name"] == "open_ended":
            info["config_name"] = "open ended?"
    card.save(build / "README.md")
    assert ("README.md", "config-name") in rules(validate(build))


def test_row_group_and_shard_limits(build, monkeypatch):
    monkeypatch.setattr(validate_module, "VIEWER_ROW_GROUP_BYTES", 1000)
    monkeypatch.setattr(validate_module, "HUB_SHARD_BYTES", 1000)
    problems = validate(build)
    assert {p.rule for p in problems} == {"row-group-size", "shard-size"}
    assert all(p.file.startswith("data/") for p in problems)


def test_stray_file(build):
    pq.write_table(pa.table({"x": [1]}), build / "data" / "test" / "extra.parquet")
    # every config names its own shard sets (`default` too), so no config reads a file dropped beside them
    assert ("data/test/extra.parquet", "stray-file") in rules(validate(build))
    (build / "data" / "other").mkdir()
    pq.write_table(pa.table({"x": [1]}), build / "data" / "other" / "extra.parquet")
    assert ("data/other/extra.parquet", "stray-file") in rules(validate(build))


def test_check_ready_raises_one_line(build):
    (build / "README.md").unlink()
    with pytest.raises(ValueError, match=r"^not ready for the Hub: README.md: \[card\]"):
        check_ready(build)


def test_cli(build, capsys):
    assert main(["validate", str(build)]) == 0
    assert "ready" in capsys.readouterr().out
    path = next((build / "data" / "train").glob("*.parquet"))
    pq.write_table(pq.read_table(path).drop_columns(["reason"]), path)
    assert main(["validate", str(build)]) == 1
    out = capsys.readouterr().out
    assert "[columns]" in out and str(path.relative_to(build)) in out


def test_unreadable_shard(build):
    path = next((build / "data" / "test").glob("*.parquet"))
    path.write_bytes(b"")
    problems = validate(build)
    assert (str(path.relative_to(build)), "parquet") in rules(problems)


def test_a_shard_edited_after_the_build_fails_its_checksum(build):
    assert validate(build) == []
    path = next((build / "data" / "test").glob("*.parquet"))
    table = pq.read_table(path)
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("answer"),
            "answer",
            pa.array(["Yes."] * table.num_rows, table.schema.field("answer").type),
        ),
        path,
    )
    problems = validate(build)
    assert rules(problems) == {(str(path.relative_to(build)), "checksum")}
    assert "changed after the build" in problems[0].detail


def test_a_shard_the_report_lists_must_be_there(build):
    path = next((build / "data" / "train").glob("*.parquet"))
    path.unlink()
    assert (str(path.relative_to(build)), "checksum") in rules(validate(build))


def test_a_card_missing_a_config_the_build_made(build):
    card = DatasetCard.load(build / "README.md")
    card.data["configs"] = [c for c in card.data["configs"] if c["config_name"] != "multi_choice"]
    card.data["dataset_info"] = [i for i in card.data["dataset_info"] if i["config_name"] != "multi_choice"]
    card.save(build / "README.md")
    problems = validate(build)
    assert rules(problems) == {("README.md", "missing-config")}
    assert "'multi_choice'" in problems[0].detail


def test_cli_names_the_checksum_rule(build, capsys):
    path = next((build / "data" / "test").glob("*.parquet"))
    with open(path, "r+b") as shard:  # a flipped byte in the page data; the file still parses
        shard.seek(8)
        byte = shard.read(1)
        shard.seek(8)
        shard.write(bytes([byte[0] ^ 0xFF]))
    assert main(["validate", str(build)]) == 1
    assert f"{path.relative_to(build)}: [checksum]" in capsys.readouterr().out


def test_a_repeated_question_id_is_not_ready(build):
    """Predictions are matched by `question_id`: two rows with one id cannot both be scored."""
    path = sorted((build / "data" / "train").glob("*.parquet"))[0]
    table = pq.read_table(path)
    ids = table["question_id"].to_pylist()
    ids[1] = ids[0]
    pq.write_table(table.set_column(table.schema.get_field_index("question_id"), "question_id", pa.array(ids)), path)
    problems = [p for p in validate(build) if p.rule == "duplicate-id"]
    assert (
        len(problems) == 1 and problems[0].file == str(path.relative_to(build)) and repr(ids[0]) in problems[0].detail
    )


def test_a_file_the_build_did_not_write_makes_the_folder_not_ready(build):
    """Publish uploads only what the build wrote, so anything else in the folder is a problem."""
    (build / "untagged.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a build's file")
    (build / "raw").mkdir()
    (build / "raw" / "test_question.jsonl").write_text("{}\n")
    (build / ".DS_Store").write_bytes(b"hidden files are never uploaded")
    assert rules(validate(build)) == {("untagged.jpg", "unlisted-file"), ("raw/test_question.jsonl", "unlisted-file")}


def test_a_config_reading_outside_data_or_unlisted_files(build, tmp_path):
    """A card edited to read another build's shards, or a file the report does not list."""
    (tmp_path / "elsewhere").mkdir()
    card = DatasetCard.load(build / "README.md")
    default = next(c for c in card.data["configs"] if c["config_name"] == "default")
    default["data_files"] = [
        {"split": "test", "path": "../elsewhere/*.parquet"},
        {"split": "train", "path": "/abs/data/*.parquet"},
    ]
    card.save(build / "README.md")
    problems = [p for p in validate(build) if p.rule == "data-files"]
    assert any("'../elsewhere/*.parquet' points outside data/" in p.detail for p in problems)
    assert any("'/abs/data/*.parquet' points outside data/" in p.detail for p in problems)


def test_a_pattern_that_reads_an_unlisted_shard(build):
    extra = build / "data" / "test" / ".hidden-00000-of-00001.parquet"
    pq.write_table(pq.read_table(next((build / "data" / "test").glob("open*.parquet"))), extra)
    card = DatasetCard.load(build / "README.md")
    default = next(c for c in card.data["configs"] if c["config_name"] == "default")
    default["data_files"] = [{"split": "test", "path": "data/test/.hidden-*.parquet"}]
    card.save(build / "README.md")
    assert any(p.rule == "data-files" and "does not list" in p.detail for p in validate(build))


def test_a_folder_without_its_build_report_is_not_ready(build, capsys):
    """Without the report nothing says which files the build wrote, or their checksums."""
    (build / "build_report.json").unlink()
    assert rules(validate(build)) == {("build_report.json", "build-report")}
    assert main(["validate", str(build)]) == 1
    assert "[build-report] no build_report.json" in capsys.readouterr().out


def test_a_report_edited_to_list_other_files_does_not_vouch_for_them(build):
    from builders.assembly.shards import sha256

    raw = build / "raw.json"
    raw.write_text("{}")
    report = json.loads((build / "build_report.json").read_text())
    report["files"] = {"raw.json": sha256(raw)}
    (build / "build_report.json").write_text(json.dumps(report))
    assert ("build_report.json", "build-report") in rules(validate(build))


def _point_at_open_ended(card: DatasetCard) -> None:
    """`closed_ended` and `default` read the open_ended shards, every count edited to match: each file is still
    the build's own, with its checksum, and each count is the shards' own."""
    infos = {i["config_name"]: i for i in card.data["dataset_info"]}
    for config in card.data["configs"]:
        if config["config_name"] in ("closed_ended", "default"):
            config["data_files"] = [
                {"split": e["split"], "path": f"data/{e['split']}/open_ended-*.parquet"} for e in config["data_files"]
            ]
            infos[config["config_name"]]["splits"] = infos["open_ended"]["splits"]


def test_a_card_pointing_configs_at_other_shards_fails_against_the_report(build, capsys):
    card = DatasetCard.load(build / "README.md")
    _point_at_open_ended(card)
    card.save(build / "README.md")
    problems = [p for p in validate(build) if p.rule == "built-configs"]
    assert {p.file for p in problems} == {"README.md"} and problems
    assert {p.detail.split(" split ")[0] for p in problems} == {"config 'closed_ended'", "config 'default'"}
    assert any("data/test/closed_ended-00000-of-00001.parquet" in p.detail for p in problems)
    assert main(["publish", str(build), "--repo", "org/demo", "--private", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[built-configs] config" in err and "dry run" not in err


def test_a_row_count_or_a_config_the_build_did_not_make(build):
    card = DatasetCard.load(build / "README.md")
    open_ended = next(c for c in card.data["configs"] if c["config_name"] == "open_ended")
    card.data["configs"].append({**open_ended, "config_name": "extra"})
    info = next(i for i in card.data["dataset_info"] if i["config_name"] == "open_ended")
    card.data["dataset_info"].append({**info, "config_name": "extra"})
    card.save(build / "README.md")
    report = json.loads((build / "build_report.json").read_text())
    report["config_files"]["open_ended"]["splits"]["test"]["rows"] += 1  # what the build counted, against the card
    (build / "build_report.json").write_text(json.dumps(report))
    details = sorted(p.detail for p in validate(build) if p.rule == "built-configs")
    assert details[0] == "config 'extra' was not made by the build (build_report.json records no such config)"
    assert details[1].startswith("config 'open_ended' split 'test': the card counts") and len(details) == 2


def test_a_report_without_what_each_config_reads_is_not_ready(build):
    report = json.loads((build / "build_report.json").read_text())
    del report["config_files"]
    (build / "build_report.json").write_text(json.dumps(report))
    assert rules(validate(build)) == {("build_report.json", "built-configs")}
