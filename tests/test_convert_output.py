"""What `cxr-vqa convert --to llamafactory|swift` leaves on disk: a whole conversion or none at all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builders.assembly.settings import BuildSettings
from builders.hub.validate import validate
from cxr_vqa.cli import main
from gemex_dataset.build import build_gemex
from rexvqa_dataset.build import build_rexvqa


@pytest.fixture(scope="module")
def gemex_none(gemex_release, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gemex-none") / "gemex"
    build_gemex(BuildSettings(source=gemex_release.root / "per_type", out=out, image_mode="none"))
    return out


def stopped_convert(build: Path, out: Path, point: str) -> subprocess.Popen:
    """`cxr-vqa convert BUILD --to llamafactory --out OUT` in a process of its own, stopped at `point`."""
    env = {**os.environ, "CXR_VQA_STOP_AT": point, "TQDM_DISABLE": "1"}
    argv = [sys.executable, "-m", "cxr_vqa.cli", "convert", str(build), "--to", "llamafactory", "--out", str(out)]
    # Ctrl-C's default action, as from a terminal (a test run in the background inherits SIGINT ignored)
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    stat = Path(f"/proc/{process.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        if process.poll() is not None:
            pytest.fail(f"convert ended before {point}: {process.stderr.read()}")
        time.sleep(0.01)
    return process


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_convert_leaves_nothing_behind(gemex_embed, tmp_path, signum, status):
    out = tmp_path / "lf"
    process = stopped_convert(gemex_embed[0], out, "atomic-write")
    os.kill(process.pid, signum)
    os.kill(process.pid, signal.SIGCONT)
    assert process.wait(timeout=120) == status
    assert "no partial output was left behind" in process.stderr.read()
    assert list(tmp_path.iterdir()) == []


def test_a_convert_that_completes_says_what_it_wrote(gemex_embed, tmp_path, capsys):
    out = tmp_path / "lf"
    assert main(["convert", str(gemex_embed[0]), "--to", "swift", "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lf"]
    printed = capsys.readouterr().out
    assert all(f"{out / p.name}:" in printed for p in out.glob("*.jsonl"))


def test_a_convert_whose_image_fails_writes_no_file(gemex_release, tmp_path, capsys):
    """One image unreadable: exit 1 naming it, and no JSON Lines file (they would name PNGs never written)."""
    images = shutil.copytree(gemex_release.image_root, tmp_path / "files")
    build = tmp_path / "reference"
    build_gemex(BuildSettings(source=gemex_release.root / "per_type", out=build, images=images))
    broken = sorted(images.rglob("*.jpg"))[0]
    broken.write_bytes(b"not a JPEG")
    out = tmp_path / "lf"
    assert main(["convert", str(build), "--to", "llamafactory", "--out", str(out)]) == 1
    assert broken.name in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files", "reference"]


@pytest.mark.parametrize("inside", [".", "converted", "data/x.json"])
@pytest.mark.parametrize("command", ["llava", "swift", "attach"])
def test_an_out_inside_the_build_is_refused(gemex_none, gemex_release, capsys, command, inside):
    build = gemex_none
    before = sorted(build.rglob("*"))
    out = build / inside
    argv = ["--to", command] if command != "attach" else ["--image-root", str(gemex_release.image_root)]
    verb = "attach" if command == "attach" else "convert"
    assert main([verb, str(build), *argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"cxr-vqa: error: --out {out}: inside the build {build} it reads; " + (
        "choose an --out outside it\n"
    )
    assert sorted(build.rglob("*")) == before and validate(build) == []


def test_llamafactory_entries_join_those_already_in_the_folder(gemex_embed, rexvqa_release, tmp_path):
    """GEMeX then ReXVQA into one folder that holds the user's own dataset: every entry kept, ours replaced."""
    rexvqa = tmp_path / "rexvqa"
    build_rexvqa(BuildSettings(source=rexvqa_release.root, out=rexvqa, image_mode="embed"))
    out = tmp_path / "data"
    out.mkdir()
    mine = {"mine": {"file_name": "mine.json"}, "gemex_sft_test": {"file_name": "old.jsonl"}}
    (out / "dataset_info.json").write_text(json.dumps(mine))
    (out / "mine.json").write_text("[]")
    for build in (gemex_embed[0], rexvqa):
        assert main(["convert", str(build), "--to", "llamafactory", "--out", str(out), "--split", "test"]) == 0
    info = json.loads((out / "dataset_info.json").read_text())
    names = ["gemex_sft_test", "gemex_sft_per_image_test", "rexvqa_sft_test", "rexvqa_sft_per_study_test"]
    assert sorted(info) == sorted(["mine", *names])
    assert info["mine"] == mine["mine"] and info["gemex_sft_test"]["file_name"] == "gemex_sft_test.jsonl"
    assert (out / "mine.json").read_text() == "[]" and all((out / f"{name}.jsonl").is_file() for name in names)


def test_a_dataset_info_that_is_no_json_object_is_named_and_kept(gemex_embed, tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "dataset_info.json").write_text("[1, 2]")
    assert main(["convert", str(gemex_embed[0]), "--to", "llamafactory", "--out", str(out), "--split", "test"]) == 1
    assert f"{out / 'dataset_info.json'}: not a JSON object of datasets (a JSON list)" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["dataset_info.json"]


def test_tags_in_the_record_text_are_escaped(gemex_release, tmp_path):
    """A question and a reason holding `<image>` and `<bbox>`: each converted row's tags are its images and boxes."""
    source = shutil.copytree(gemex_release.root / "per_type", tmp_path / "per_type")
    path = source / "train" / "open_ended_question.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    record["question"] += " (compare <image> with the prior)"
    record["reason"] += " <bbox> <image>"
    path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    build_gemex(BuildSettings(source=source, out=tmp_path / "gemex", images=gemex_release.image_root))
    for tool in ("llamafactory", "swift"):
        argv = ["convert", str(tmp_path / "gemex"), "--to", tool, "--out", str(tmp_path / tool), "--split", "train"]
        assert main(argv) == 0
        escaped = 0
        for file in (tmp_path / tool).glob("*.jsonl"):
            for row in map(json.loads, file.read_text().splitlines()):
                text = "".join(m["content"] for m in row["messages"])
                assert text.count("<image>") == len(row["images"]), (tool, file.name)
                assert text.count("<bbox>") == len(row.get("objects", {}).get("bbox", [])), (tool, file.name)
                escaped += "compare &lt;image&gt; with" in text and "&lt;bbox&gt; &lt;image&gt;" in text
        assert escaped == 2, tool  # the question's row in sft and in sft_per_image
