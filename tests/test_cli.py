import shlex
import subprocess
import sys

from datasets import load_dataset

from builders.cli import main


def test_demo_builds_a_loadable_dataset(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--num-images", "8"]) == 0
    assert "rows written" in capsys.readouterr().out
    assert len(load_dataset(str(tmp_path / "demo" / "gemex"), "open_ended", split="train")) > 0


def test_build_gemex_from_the_command_line(gemex_release, tmp_path):
    out = tmp_path / "out"
    args = ["build", "gemex", "--source", str(gemex_release.root / "per_type"), "--images", str(gemex_release.image_root),
            "--out", str(out), "--image-mode", "embed", "--image-size", "96"]
    assert main(args) == 0
    assert max(load_dataset(str(out), split="test")[0]["image"].size) == 96


def test_shard_layout_option(gemex_release, tmp_path):
    base = ["build", "gemex", "--source", str(gemex_release.root / "per_type"), "--image-mode", "none"]
    assert main([*base, "--out", str(tmp_path / "auto")]) == 0
    assert {p.name.split("-")[0] for p in (tmp_path / "auto").glob("data/test/*.parquet")} == {
        "open_ended", "closed_ended", "single_choice", "multi_choice"}
    assert main([*base, "--out", str(tmp_path / "shared"), "--shard-layout", "shared"]) == 0
    assert [p.name for p in (tmp_path / "shared").glob("data/test/*.parquet")] == ["questions-00000-of-00001.parquet"]
    closed = load_dataset(str(tmp_path / "shared"), "closed_ended", split="test")
    assert set(closed["question_type"]) == {1}
    assert len(closed) == len(load_dataset(str(tmp_path / "auto"), "closed_ended", split="test"))


def test_errors_are_one_line_and_exit_non_zero(tmp_path):
    result = subprocess.run([sys.executable, "-m", "builders.cli", "build", "gemex", "--source", str(tmp_path / "nowhere"),
                             "--out", str(tmp_path / "out"), "--image-mode", "none"], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no such file or folder" in result.stderr


def test_images_are_required_unless_mode_none(gemex_release, tmp_path, capsys):
    assert main(["build", "gemex", "--source", str(gemex_release.root / "per_type"), "--out", str(tmp_path / "o")]) == 1
    assert "--images is needed" in capsys.readouterr().err


def test_synthesize_writes_a_release(tmp_path):
    assert main(["synthesize", "gemex", "--out", str(tmp_path / "r"), "--num-images", "6"]) == 0
    assert (tmp_path / "r" / "per_type" / "test" / "open_ended_question.jsonl").exists()


def test_synthesize_prints_the_build_commands_that_build_it(tmp_path, capsys):
    for dataset, count in (("gemex", "--num-images"), ("rexvqa", "--num-studies")):
        assert main(["synthesize", dataset, "--out", str(tmp_path / dataset), count, "6"]) == 0
        command = capsys.readouterr().out.splitlines()[-1].strip()
        args = shlex.split(command)
        assert args[:3] == ["cxr-vqa", "build", dataset]
        assert main(args[1:]) == 0
        summary = capsys.readouterr().out
        assert " 0 rejected" in summary, summary
        assert load_dataset(str(tmp_path / f"{dataset}-dataset"), split="train").num_rows > 0
