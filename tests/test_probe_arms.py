"""The learning-signal benchmark's control arms (benchmarks/probe_arms.py): a blank arm whose every image
is one constant grey of the original's size, a shuffled arm whose images are a derangement of the
build's images (GEMeX) or studies (ReXVQA), the same in every file; rows, questions and answers untouched;
a marked arm whose images are blank and whose words hold the answer. And the rows each arm trains on
(benchmarks/probe_rows.py): answers balanced, images asked both ways, conversations cut to one config's turns."""

from __future__ import annotations

import io
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset
from PIL import Image

from benchmarks.learning_signal import Settings, command, handles_sigterm, headline, sft_args, steps_of
from benchmarks.probe_arms import ARMS, SEEN, image_column, make_arm, parquet_files, permutation
from benchmarks.probe_rows import asked_both_ways, balanced, conversations_of
from tests.tiny_builds import synthetic_embed_builds

KEY = {"gemex": "dicom_id", "rexvqa": "study_id"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    return synthetic_embed_builds(tmp_path_factory.mktemp("arms"), 10, 10, ())


def images_of(value, dataset: str) -> list[dict]:
    return value if dataset == "rexvqa" else [value]


def rows(folder: Path) -> dict[str, list[dict]]:
    return {str(p.relative_to(folder)): pq.read_table(p).to_pylist() for p in parquet_files(folder)}


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_the_blank_arm_holds_one_grey_image_of_each_size_and_the_same_rows(builds, dataset, tmp_path):
    arm = make_arm(dataset, builds[dataset], "blank", tmp_path / "blank")
    column = image_column(dataset)
    before, after = rows(builds[dataset]), rows(arm)
    assert before.keys() == after.keys() and before
    for name, table in before.items():
        for old, new in zip(table, after[name], strict=True):
            assert {k: v for k, v in old.items() if k != column} == {k: v for k, v in new.items() if k != column}
            for a, b in zip(images_of(old[column], dataset), images_of(new[column], dataset), strict=True):
                original, blank = Image.open(io.BytesIO(a["bytes"])), Image.open(io.BytesIO(b["bytes"]))
                assert blank.size == original.size and np.ptp(np.asarray(blank)) == 0
    assert (arm / "README.md").read_text() == (builds[dataset] / "README.md").read_text()


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_the_shuffled_arm_gives_every_image_another_ones_pixels_the_same_in_every_file(builds, dataset, tmp_path):
    arm = make_arm(dataset, builds[dataset], "shuffled", tmp_path / "shuffled", seed=3)
    column, key = image_column(dataset), KEY[dataset]
    originals: dict[str, bytes] = {}
    given: dict[str, set[bytes]] = defaultdict(set)
    for name, table in rows(builds[dataset]).items():
        for old, new in zip(table, rows(arm)[name], strict=True):
            assert old["question_id"] == new["question_id"] if "question_id" in old else True
            originals[old[key]] = b"".join(i["bytes"] for i in images_of(old[column], dataset))
            given[new[key]].add(b"".join(i["bytes"] for i in images_of(new[column], dataset)))
    assert all(len(v) == 1 for v in given.values()), "one key, one set of images in every file"
    moved = {k: next(iter(v)) for k, v in given.items()}
    assert sorted(moved.values()) == sorted(originals.values()), "a permutation: every image used once"
    assert all(moved[k] != originals[k] for k in moved), "no image or study keeps its own"


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_the_marked_arm_blanks_the_images_and_writes_the_answer_into_the_words(builds, dataset, tmp_path):
    arm = make_arm(dataset, builds[dataset], "marked", tmp_path / "marked")
    column = image_column(dataset)
    words = "options" if dataset == "rexvqa" else "question"
    before, after = rows(builds[dataset]), rows(arm)
    marked = 0
    for name, table in before.items():
        for old, new in zip(table, after[name], strict=True):
            assert all(
                np.ptp(np.asarray(Image.open(io.BytesIO(i["bytes"])))) == 0 for i in images_of(new[column], dataset)
            )
            kept = {k for k in old if k not in (column, words)}
            assert {k: old[k] for k in kept} == {k: new[k] for k in kept}
            if words not in old:
                continue
            marked += 1
            if dataset == "rexvqa":
                right = old["answer_index"]
                assert new["options"][right] == old["options"][right] + SEEN
                assert [o for k, o in enumerate(new["options"]) if k != right] == [
                    o for k, o in enumerate(old["options"]) if k != right
                ]
            else:
                assert new["question"] == f"{old['question']} ({old['answer']})"
    assert marked


def test_a_run_trains_the_three_controls_unless_the_marked_arm_is_asked_for():
    assert Settings(seed=0, out=Path("x")).arms == ("images", "blank", "shuffled")
    assert "marked" in ARMS


@pytest.mark.parametrize("frozen", [False, True])
def test_every_arms_training_command_says_whether_the_tower_is_frozen(frozen, tmp_path):
    pytest.importorskip("trl")
    from training_recipes import sft

    settings = Settings(seed=0, out=tmp_path, freeze_vision_tower=frozen)
    args = sft_args(settings, tmp_path / "probe", "gemex", tmp_path / "build", tmp_path / "run", "per_question")
    assert args[:3] == ["python", "-m", "training_recipes.sft"]
    _, _, model_args = sft.make_parser().parse_args_and_config(args=args[3:])
    assert model_args.freeze_vision_tower is frozen


def test_rexvqa_arms_train_a_checklist_and_answer_by_likelihood_and_gemex_arms_as_asked(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from benchmarks import learning_signal
    from training_recipes import generate, sft

    settings = Settings(seed=0, out=tmp_path)
    for dataset, reply in (("rexvqa", "checklist"), ("gemex", "answer")):
        args = sft_args(settings, tmp_path / "probe", dataset, tmp_path / "build", tmp_path / "run", "per_question")
        data_args = sft.make_parser().parse_args_and_config(args=args[3:])[0]
        assert data_args.reply == reply
    assert learning_signal.reply_of(Settings(seed=0, out=tmp_path, rexvqa_reply=""), "rexvqa") == "answer"

    commands = []
    monkeypatch.setattr(learning_signal, "command", lambda settings, args, log, stop_after=None: commands.append(args))
    for dataset in ("rexvqa", "gemex"):
        learning_signal.generate(
            settings, tmp_path / "m", dataset, tmp_path / "b", tmp_path / "p.jsonl", tmp_path / "l"
        )
    parsed = [
        generate.HfArgumentParser(generate.GenerateArguments).parse_args_into_dataclasses(c[3:])[0] for c in commands
    ]
    assert [(p.choose_by, p.reply) for p in parsed] == [("likelihood", "checklist"), ("greedy", "full")]

    assert [p.batch_size for p in parsed] == [8, 32]


@pytest.mark.parametrize(
    ("given", "gemex", "rexvqa"),
    [
        ({}, 1200, 800),
        ({"steps": 300}, 300, 300),
        ({"rexvqa_steps": 50}, 1200, 50),
        ({"steps": 9, "rexvqa_steps": 5}, 9, 5),
    ],
)
def test_steps_are_each_datasets_own_unless_given(given, gemex, rexvqa, tmp_path):
    settings = Settings(seed=0, out=tmp_path, **given)
    assert (steps_of(settings, "gemex"), steps_of(settings, "rexvqa")) == (gemex, rexvqa)


def test_an_arm_past_its_time_is_stopped_only_once_it_can_save(tmp_path):
    """`--train-seconds` ends an arm by SIGTERM, which sft.py answers with a checkpoint once its imports are done;
    a command still starting when its time is up gets the signal once it has a handler, not before."""
    settings = Settings(seed=0, out=tmp_path)
    late = tmp_path / "handled"
    slow_start = (
        "import signal, sys, time; time.sleep(3); "
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(late)!r}, 'w').close(), sys.exit(0))); time.sleep(60)"
    )
    seconds = command(settings, ["python", "-c", slow_start], tmp_path / "arm.log", stop_after=0.5)
    assert late.is_file() and 3 <= seconds < 30


def test_a_sigterm_handler_is_read_from_proc_and_assumed_where_it_cannot_be():
    assert handles_sigterm(2**22 + 12345)  # no such process: nothing to wait for
    assert not handles_sigterm(os.getpid())  # pytest leaves SIGTERM to its default


def test_an_arm_that_fails_leaves_the_others_results(tmp_path, monkeypatch):
    """Arms of a long run (four at once on a GPU) finish and are written though one fails; the failed one is
    listed with the command's error and the run exits 1."""
    from benchmarks import learning_signal

    def arm_run(settings, dataset, arm, builds, model):
        if arm == "blank":
            raise SystemExit(f"python -m training_recipes.sft ... exited 1; its output: run-{dataset}-{arm}.log")
        return learning_signal.Run(dataset, arm, "per_question", "b", "train", "p.jsonl", 1.0, 5, accuracy=40.0)

    monkeypatch.setattr(learning_signal, "probe_model", lambda settings, dataset, build: tmp_path / "probe")
    monkeypatch.setattr(learning_signal, "prepared_builds", lambda settings, dataset: (tmp_path, tmp_path, None))
    monkeypatch.setattr(
        learning_signal,
        "majority",
        lambda settings, dataset, held_out: {"dataset": dataset, "questions": 9, "accuracy": 25.0, "v_score": None},
    )
    monkeypatch.setattr(learning_signal, "arm_run", arm_run)
    argv = ["--seed", "0", "--out", str(tmp_path / "ls"), "--datasets", "rexvqa,gemex", "--arms", "images,blank"]
    assert learning_signal.main(argv) == 1
    result = json.loads((tmp_path / "ls" / "result.json").read_text())
    assert [(r["dataset"], r["arm"]) for r in result["runs"]] == [("rexvqa", "images"), ("gemex", "images")]
    assert [(f["dataset"], f["arm"]) for f in result["failed"]] == [("rexvqa", "blank"), ("gemex", "blank")]
    assert "run-gemex-blank.log" in result["failed"][1]["error"]


def test_a_permutation_is_a_derangement_fixed_by_its_seed():
    keys = [f"k{i}" for i in range(9)]
    moved = permutation(keys, 5)
    assert sorted(moved.values()) == keys and all(moved[k] != k for k in keys)
    assert moved == permutation(list(reversed(keys)), 5) != permutation(keys, 6)


def test_the_headline_accuracy_weighs_the_scored_types_by_their_questions():
    scores = {
        "closed_ended": {"questions": 30, "A": 80.0, "V": 50.0},
        "single_choice": {"questions": 10, "A": 40.0, "V": 30.0},
        "multi_choice": {"questions": 10, "A": 20.0, "V": 10.0},
        "open_ended": {"questions": 40, "A": None, "V": 0.0},
    }
    assert headline("gemex", scores) == (60.0, 38.0, 50)
    assert headline("gemex", scores, ("closed_ended",)) == (80.0, 50.0, 30)
    assert headline("rexvqa", {"overall": {"accuracy": 41.5, "questions": 600}}) == (41.5, None, 600)


def test_balanced_rows_keep_as_many_of_each_answer_as_the_rarest_has(builds, tmp_path):
    out = balanced(builds["gemex"], "closed_ended", tmp_path / "balanced", seed=0)
    name = "data/train/closed_ended-00000-of-00001.parquet"
    before, after = rows(builds["gemex"]), rows(out)
    answers = [r["answer"] for r in before[name]]
    rarest = min(answers.count(a) for a in set(answers))
    kept = [r["answer"] for r in after[name]]
    assert {a: kept.count(a) for a in set(kept)} == dict.fromkeys(set(answers), rarest)
    ids = {r["question_id"] for r in before[name]}
    assert {r["question_id"] for r in after[name]} <= ids
    assert {k: v for k, v in after.items() if k != name} == {k: v for k, v in before.items() if k != name}
    loaded = load_dataset(str(out), "closed_ended", split="train", cache_dir=str(tmp_path / "cache"))
    assert len(loaded) == len(kept)


def test_images_asked_both_ways_keep_as_many_of_each_answer_image_by_image(builds, tmp_path):
    out = asked_both_ways(builds["gemex"], "closed_ended", tmp_path / "both-ways", seed=0)
    name = "data/train/closed_ended-00000-of-00001.parquet"
    before, after = rows(builds["gemex"]), rows(out)
    answers_of = defaultdict(list)
    for row in before[name]:
        answers_of[row["dicom_id"]].append(row["answer"])
    every_answer = {row["answer"] for row in before[name]}
    kept = defaultdict(list)
    for row in after[name]:
        kept[row["dicom_id"]].append(row["answer"])
    asked_both = {image for image, answers in answers_of.items() if set(answers) == every_answer}
    assert kept and set(kept) == asked_both < set(answers_of)
    for image, answers in kept.items():
        rarest = min(answers_of[image].count(a) for a in every_answer)
        assert {a: answers.count(a) for a in every_answer} == dict.fromkeys(every_answer, rarest)
    assert {r["question_id"] for r in after[name]} <= {r["question_id"] for r in before[name]}
    assert {k: v for k, v in after.items() if k != name} == {k: v for k, v in before.items() if k != name}
    loaded = load_dataset(str(out), "closed_ended", split="train", cache_dir=str(tmp_path / "cache"))
    assert len(loaded) == len(after[name])


def test_per_image_conversations_hold_the_questions_of_the_per_question_config(builds, tmp_path):
    config = "closed_ended"
    out = conversations_of(builds["gemex"], config, tmp_path / "per-image")
    before, after = rows(builds["gemex"]), rows(out)
    questions = {
        r["question_id"]: r for name, t in before.items() if name.startswith(f"data/train/{config}-") for r in t
    }
    (per_image,) = [name for name in after if name.startswith("data/train/sft_per_image")]
    conversations = after[per_image]
    assert questions and sum(len(r["turns"]) for r in conversations) < sum(len(r["turns"]) for r in before[per_image])
    assert sorted(q for row in conversations for q in row["question_ids"]) == sorted(questions)
    for row in conversations:
        assert row["question_ids"] and len(row["turns"]) == len(row["question_ids"])
        for question_id, turn in zip(row["question_ids"], row["turns"], strict=True):
            assert (
                turn["question"] == questions[question_id]["question"]
                and row["dicom_id"] == questions[question_id]["dicom_id"]
            )
    assert {k: v for k, v in after.items() if k != per_image} == {k: v for k, v in before.items() if k != per_image}
    loaded = load_dataset(str(out), "sft_per_image", split="train", cache_dir=str(tmp_path / "cache"))
    assert len(loaded) == len(conversations)
