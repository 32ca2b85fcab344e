import shlex
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from datasets import load_dataset
from PIL import Image

from builders.assembly.settings import BuildSettings
from cxr_vqa.cli import main, parser
from cxr_vqa.options import options_from_command_line, parsed_options


def test_demo_builds_a_loadable_dataset_and_names_a_next_step_that_runs(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--num-images", "8"]) == 0
    printed = capsys.readouterr().out
    assert "rows written" in printed
    assert len(load_dataset(str(tmp_path / "demo" / "gemex"), "open_ended", split="train")) > 0
    suggested = printed.split("Next:\n", 1)[1].splitlines()[0].split("#")[0]
    args = shlex.split(suggested)
    assert args[:2] == ["cxr-vqa", "evaluate"] and main(args[1:]) == 0
    assert "majority" in capsys.readouterr().out.lower()


def test_preview_counts_the_rows_it_drew_and_a_config_error_exits_2_as_in_evaluate(tmp_path, capsys):
    from rexvqa_dataset.synthetic.release import generate

    release = generate(tmp_path / "raw", num_studies=6)
    out = tmp_path / "rexvqa"
    assert main(["build", "rexvqa", "--source", str(release.root), "--out", str(out)]) == 0
    test_rows = load_dataset(str(out), split="test").num_rows
    assert 0 < test_rows < 16
    capsys.readouterr()
    assert main(["preview", str(out), "--out", str(tmp_path / "p.png"), "--n", "16"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"p.png: {test_rows} rows")
    for command in (
        ["preview", str(out), "--out", str(tmp_path / "q.png")],
        ["evaluate", str(out), "--baseline", "majority"],
    ):
        assert main([*command, "--config", "nosuch"]) == 2
        assert "no config 'nosuch'" in capsys.readouterr().err


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_demo_replaces_only_what_a_demo_wrote(tmp_path, capsys):
    """A second demo replaces the first one's releases and builds; a file of the user's in any of them
    (or a folder no build wrote where a build goes) stops the run before a file is changed, in one line."""
    demo = tmp_path / "demo"
    (demo / "raw").mkdir(parents=True)
    (demo / "raw" / "notes.txt").write_text("the user's, beside the releases")
    assert main(["demo", "--out", str(demo), "--num-images", "6"]) == 0
    assert main(["demo", "--out", str(demo), "--num-images", "8"]) == 0  # the first demo's folders, replaced
    assert (demo / "raw" / "notes.txt").read_text() == "the user's, beside the releases"
    assert not [p for p in (demo / "raw").iterdir() if p.name.startswith(".")]  # no staging or lock left
    capsys.readouterr()

    mine = demo / "raw" / "rexvqa" / "metadata" / "my_questions.json"
    mine.write_text("[]")
    before = files_under(demo)
    assert main(["demo", "--out", str(demo), "--num-images", "8"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "metadata/my_questions.json was not written by the synthetic generator" in error
    assert "nothing was changed" in error and files_under(demo) == before
    mine.unlink()

    image = next((demo / "raw" / "gemex" / "files").rglob("*.jpg"))
    Image.new("L", (8, 8)).save(image)  # the user's own picture under the generator's name: it carries no tag
    (demo / "rexvqa" / "build_report.json").unlink()  # and a folder no build wrote where the ReXVQA build goes
    before = files_under(demo)
    assert main(["demo", "--out", str(demo)]) == 1
    assert "was not written by the synthetic generator" in capsys.readouterr().err
    assert files_under(demo) == before


def test_demo_refuses_a_folder_of_the_users_where_its_raw_releases_go(tmp_path, capsys):
    demo = tmp_path / "demo"
    (demo / "raw" / "gemex").mkdir(parents=True)
    (demo / "raw" / "gemex" / "study.jpg").write_bytes(b"\xff\xd8 the user's image")
    (demo / "gemex").mkdir()
    (demo / "gemex" / "mine.parquet").write_bytes(b"PAR1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (demo / "raw" / "rexvqa").symlink_to(elsewhere, target_is_directory=True)
    before = files_under(tmp_path)
    assert main(["demo", "--out", str(demo), "--num-images", "6"]) == 1
    error = capsys.readouterr().err
    assert "study.jpg was not written by the synthetic generator" in error and "nothing was changed" in error
    assert files_under(tmp_path) == before
    (demo / "raw" / "gemex" / "study.jpg").unlink()
    assert main(["demo", "--out", str(demo), "--num-images", "6"]) == 1
    assert f"{demo / 'gemex'} is not one (no build_report.json" in capsys.readouterr().err
    (demo / "gemex" / "mine.parquet").unlink()
    (demo / "gemex").rmdir()
    assert main(["demo", "--out", str(demo), "--num-images", "6"]) == 1
    assert f"{demo / 'raw' / 'rexvqa'} is not one (a link)" in capsys.readouterr().err
    assert list((demo / "raw" / "gemex").iterdir()) == [] and not (demo / "gemex").exists()


def test_build_gemex_from_the_command_line(gemex_release, tmp_path):
    out = tmp_path / "out"
    args = [
        "build",
        "gemex",
        "--source",
        str(gemex_release.root / "per_type"),
        "--images",
        str(gemex_release.image_root),
        "--out",
        str(out),
        "--image-mode",
        "embed",
        "--image-size",
        "96",
    ]
    assert main(args) == 0
    assert max(load_dataset(str(out), split="test")[0]["image"].size) == 96


def test_shard_layout_option(gemex_release, tmp_path):
    base = ["build", "gemex", "--source", str(gemex_release.root / "per_type"), "--image-mode", "none"]
    assert main([*base, "--out", str(tmp_path / "auto")]) == 0
    assert {p.name.split("-")[0] for p in (tmp_path / "auto").glob("data/test/*.parquet")} == {
        "open_ended",
        "closed_ended",
        "single_choice",
        "multi_choice",
    }
    assert main([*base, "--out", str(tmp_path / "shared"), "--shard-layout", "shared"]) == 0
    assert [p.name for p in (tmp_path / "shared").glob("data/test/*.parquet")] == ["questions-00000-of-00001.parquet"]
    closed = load_dataset(str(tmp_path / "shared"), "closed_ended", split="test")
    assert set(closed["question_type"]) == {1}
    assert len(closed) == len(load_dataset(str(tmp_path / "auto"), "closed_ended", split="test"))


def test_errors_are_one_line_and_exit_non_zero(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cxr_vqa",
            "build",
            "gemex",
            "--source",
            str(tmp_path / "nowhere"),
            "--out",
            str(tmp_path / "out"),
            "--image-mode",
            "none",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no such file or folder" in result.stderr


def test_images_are_required_unless_mode_none(gemex_release, tmp_path, capsys):
    assert main(["build", "gemex", "--source", str(gemex_release.root / "per_type"), "--out", str(tmp_path / "o")]) == 1
    assert "--images is needed" in capsys.readouterr().err


def test_synthesize_writes_a_release(tmp_path):
    assert main(["synthesize", "gemex", "--out", str(tmp_path / "r"), "--num-images", "6"]) == 0
    assert (tmp_path / "r" / "per_type" / "test" / "open_ended_question.jsonl").exists()


@pytest.mark.parametrize(
    "dataset, size, annotations, pictures",
    [("gemex", "--num-images", "per_type", "files/**/*.jpg"), ("rexvqa", "--num-studies", "metadata", "**/*.png")],
)
def test_synthesize_plain_findings_redraws_the_images_of_the_same_questions(
    tmp_path, dataset, size, annotations, pictures
):
    variants = {"default": [], "all": ["--plain-findings"], "answered": ["--plain-findings", "answered"]}
    for name, extra in variants.items():
        assert main(["synthesize", dataset, "--out", str(tmp_path / name), size, "6", *extra]) == 0
    default = tmp_path / "default"
    questions = sorted(p for p in (default / annotations).rglob("*.json*"))
    images = sorted(default.glob(pictures))
    assert questions and len(images) >= 6
    for name in ("all", "answered"):
        plain = tmp_path / name
        assert [q.read_bytes() for q in questions] == [(plain / q.relative_to(default)).read_bytes() for q in questions]
        assert any(i.read_bytes() != (plain / i.relative_to(default)).read_bytes() for i in images)


@pytest.mark.parametrize(
    "dataset, count, test, manifest_count",
    [("gemex", "--num-images", "--test-images", "images"), ("rexvqa", "--num-studies", "--test-studies", "studies")],
)
def test_synthesize_sets_the_test_split_size_when_asked(tmp_path, capsys, dataset, count, test, manifest_count):
    out = tmp_path / dataset
    assert main(["synthesize", dataset, "--out", str(out), count, "12", test, "5", "--downscale", "32"]) == 0
    built = tmp_path / f"{dataset}-built"
    source = ["--source", str(out)] + (["--images", str(out / "files")] if dataset == "gemex" else [])
    assert main(["build", dataset, *source, "--out", str(built), "--image-mode", "none"]) == 0
    key = "dicom_id" if dataset == "gemex" else "study_id"
    per_split = {split: len(set(load_dataset(str(built), split=split)[key])) for split in ("train", "test")}
    assert per_split["test"] == 5 and per_split["train"] >= 5
    error = one_line_error(["synthesize", dataset, "--out", str(tmp_path / "none"), count, "6", test, "6"], capsys)
    assert f"6 test {manifest_count} of 6" in error and not (tmp_path / "none").exists()


def one_line_error(args: list[str], capsys) -> str:
    """What `cxr-vqa ARGS` prints on standard error, checked to be one line with exit status 1
    (`main`'s, in this process: `test_errors_are_one_line_and_exit_non_zero` runs the command itself)."""
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err
    return err


def test_a_folder_that_does_not_exist_is_named_as_such(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    for args in (
        ["validate", missing],
        ["preview", missing, "--out", str(tmp_path / "p.html")],
        ["publish", missing, "--repo", "org/name", "--dry-run"],
        ["convert", missing, "--out", str(tmp_path / "x.json")],
    ):
        assert "nowhere: no such folder; name the folder a build wrote" in one_line_error(args, capsys)


def test_convert_of_a_rexvqa_build_says_what_it_converts(tmp_path, capsys):
    from rexvqa_dataset.synthetic.release import generate

    release = generate(tmp_path / "raw", num_studies=6)
    out = tmp_path / "rexvqa"
    assert main(["build", "rexvqa", "--source", str(release.root), "--out", str(out), "--image-mode", "none"]) == 0
    error = one_line_error(["convert", str(out), "--out", str(tmp_path / "x.json")], capsys)
    assert "a rexvqa build; convert writes GEMeX builds" in error and not (tmp_path / "x.json").exists()


def test_convert_of_a_split_the_build_lacks_names_those_it_has(gemex_release, tmp_path, capsys):
    out = tmp_path / "gemex"
    assert (
        main(
            [
                "build",
                "gemex",
                "--source",
                str(gemex_release.root / "per_type"),
                "--out",
                str(out),
                "--image-mode",
                "none",
            ]
        )
        == 0
    )
    error = one_line_error(["convert", str(out), "--split", "valid", "--out", str(tmp_path / "x.json")], capsys)
    assert "no 'valid' split (it has test, train, validation)" in error


def test_build_options_are_the_settings_fields_with_their_defaults():
    for dataset in ("gemex", "rexvqa"):
        args = parser().parse_args(["build", dataset, "--source", "raw", "--out", "built"])
        assert parsed_options(BuildSettings, args) == BuildSettings(source=Path("raw"), out=Path("built"))
    args = parser().parse_args(
        [
            "build",
            "gemex",
            "--source",
            "raw",
            "--out",
            "built",
            "--image-mode",
            "embed",
            "--image-size",
            "96",
            "--keep-16bit",
            "--shard-layout",
            "shared",
            "--turn-seed",
            "3",
            "--num-proc",
            "2",
            "--no-conversations",
        ]
    )
    settings = parsed_options(BuildSettings, args)
    assert (
        settings.image_mode,
        settings.image_size,
        settings.keep_16bit,
        settings.shard_layout,
        settings.turn_seed,
        settings.num_proc,
        settings.no_conversations,
    ) == ("embed", 96, True, "shared", 3, 2, True)
    assert all(field.metadata["help"] for field in fields(BuildSettings))


def test_options_take_a_comma_separated_tuple_and_a_flag_that_defaults_to_true():
    @dataclass
    class Probe:
        seed: int = field(metadata={"help": "required"})
        arms: tuple[str, ...] = field(default=("images", "blank"), metadata={"help": "comma-separated"})
        balance: bool = field(default=True, metadata={"help": "on unless --no-balance"})
        resume: bool = field(default=False, metadata={"help": "off unless --resume"})

    assert options_from_command_line(Probe, ["--seed", "1"], None) == Probe(1)
    given = ["--seed", "2", "--arms", "images,shuffled", "--no-balance", "--resume"]
    assert options_from_command_line(Probe, given, None) == Probe(2, ("images", "shuffled"), False, True)


def test_each_dataset_build_has_its_own_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width, and breaks lines after a hyphen
    helps = {}
    for dataset in ("gemex", "rexvqa"):
        with pytest.raises(SystemExit):
            main(["build", dataset, "--help"])
        helps[dataset] = " ".join(capsys.readouterr().out.split())
    assert "--source SOURCE the raw release: a folder holding any of its three layouts" in helps["gemex"]
    assert "--source SOURCE the raw release: its root or its metadata/ folder" in helps["rexvqa"]
    for text in helps.values():
        assert "--keep-16bit embed 16-bit sources as 16-bit PNG" in text and "{reference,embed,none}" in text
    for dataset, conversation in (("gemex", "sft_per_image"), ("rexvqa", "sft_per_study")):
        layouts = helps[dataset].split("--shard-layout {auto,by-config,shared} ", 1)[1].split(" --turn-seed", 1)[0]
        assert f"once more in {conversation}" in layouts and "with --no-conversations" in layouts
        assert f"--no-conversations write no {conversation} config" in helps[dataset]


def test_a_choice_outside_the_declared_ones_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build", "rexvqa", "--source", "raw", "--out", "built", "--shard-layout", "sideways"])
    assert exit_.value.code == 2 and "invalid choice: 'sideways'" in capsys.readouterr().err


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


def every_parser(root):
    """Each parser of the command line, subcommands of subcommands included, with its name."""
    import argparse

    yield "cxr-vqa", root
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for path, nested in every_parser(sub):
                    yield f"{name} {path}" if path != "cxr-vqa" else name, nested


def test_every_option_has_help_and_shows_its_default():
    for name, command in every_parser(parser()):
        text = " ".join(command.format_help().split())
        for action in command._actions:
            if action.help == "==SUPPRESS==" or action.dest == "help" or action.nargs == "A...":
                continue
            assert action.help, f"cxr-vqa {name}: {action.option_strings or action.dest} has no help"
            if action.option_strings and action.nargs != 0 and action.default is not None:
                assert "default" in action.help or f"(default: {action.default})" in text, (name, action.option_strings)


def test_every_command_that_reads_a_build_names_its_folder_first(tmp_path):
    """One grammar, `cxr-vqa COMMAND FOLDER ...`; the older `--dataset FOLDER` of convert and evaluate is refused."""
    for name, command in every_parser(parser()):
        if name.split()[0] in ("validate", "preview", "publish", "convert", "evaluate"):
            positional = [a for a in command._actions if not a.option_strings]
            assert positional and positional[0].metavar == "FOLDER", name
    from gemex_dataset.synthetic.release import generate

    release = generate(tmp_path / "raw", num_images=12, layouts=("per_type",), images=False)
    out = tmp_path / "gemex"
    assert (
        main(["build", "gemex", "--source", str(release.root / "per_type"), "--out", str(out), "--image-mode", "none"])
        == 0
    )
    assert main(["convert", str(out), "--out", str(tmp_path / "train.json")]) == 0
    for spelling in ([str(out)], [str(out), "--benchmark", "gemex"]):
        assert main(["evaluate", *spelling, "--baseline", "majority", "--text-metrics", ""]) == 0
    for older in (
        ["convert", "--dataset", str(out), "--out", str(tmp_path / "older.json")],
        ["evaluate", "gemex", "--dataset", str(out), "--baseline", "majority"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(older)
        assert exit_.value.code == 2
