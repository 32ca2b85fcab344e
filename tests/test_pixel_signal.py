"""The pixel-signal benchmark (benchmarks/pixel_signal.py) on tiny builds: it reads every closed-ended GEMeX
question and every ReXVQA question, splits them by image, trains its classifier per arm and size, and writes
each run's figures to result.json."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.pixel_signal import (
    GridNet,
    Question,
    finding_named,
    gemex_questions,
    grade_named,
    held_out,
    main,
    of_kinds,
    rexvqa_questions,
    unnamed,
)
from tests.tiny_builds import synthetic_embed_builds

RUN_FIELDS = {
    "dataset",
    "arm",
    "learner",
    "image_size",
    "region_mask",
    "image_only",
    "train_questions",
    "held_out_questions",
    "epochs",
    "seconds",
    "accuracy",
    "balanced_accuracy",
    "train_accuracy",
    "majority",
    "majority_answer",
    "per_kind",
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    return synthetic_embed_builds(tmp_path_factory.mktemp("pixel-signal"), 16, 12, ("--plain-findings", "answered"))


def closed_ended_rows(build: Path) -> list[dict]:
    return [
        row
        for path in sorted((build / "data").rglob("closed_ended-*.parquet"))
        for row in pq.read_table(path, columns=["dicom_id", "question", "answer"]).to_pylist()
    ]


def test_a_tiny_run_writes_every_arm_and_size_with_its_figures(builds, tmp_path, capsys):
    out = tmp_path / "ps"
    args = ["--gemex", str(builds["gemex"]), "--rexvqa", str(builds["rexvqa"]), "--out", str(out)]
    assert main([*args, "--image-sizes", "32,48", "--epochs", "1", "--held-out-share", "0.4", "--width", "4"]) == 0
    result = json.loads((out / "result.json").read_text())
    runs = result["runs"]
    assert [(r["dataset"], r["image_size"], r["arm"]) for r in runs] == [
        (d, s, a) for d in ("gemex", "rexvqa") for s in (32, 48) for a in ("images", "blank")
    ]
    assert all(set(r) == RUN_FIELDS and r["learner"] == "cnn" for r in runs)
    rows = closed_ended_rows(builds["gemex"])
    gemex = [r for r in runs if r["dataset"] == "gemex"]
    assert {r["train_questions"] + r["held_out_questions"] for r in gemex} == {len(rows)}
    held = [r for r in rows if held_out(r["dicom_id"], 0.4)]
    assert {r["held_out_questions"] for r in gemex} == {len(held)}
    for r in gemex:  # the majority answer of the training questions, scored on the held-out ones
        trained = [q["answer"] for q in rows if not held_out(q["dicom_id"], 0.4)]
        assert r["majority_answer"] == max(set(trained), key=trained.count)
        assert r["majority"] == pytest.approx(100 * sum(q["answer"] == r["majority_answer"] for q in held) / len(held))
        assert sum(k["questions"] for k in r["per_kind"].values()) == r["held_out_questions"]
    assert all(0 <= r[f] <= 100 for r in runs for f in ("accuracy", "balanced_accuracy", "train_accuracy"))
    assert all(r["majority_answer"] in "ABCD" for r in runs if r["dataset"] == "rexvqa")
    assert "| gemex | images | cnn | 32 |" in capsys.readouterr().out


def test_every_question_of_a_build_is_read_with_what_it_names(builds):
    questions, images = gemex_questions(builds["gemex"])
    rows = closed_ended_rows(builds["gemex"])
    assert len(questions) == len(rows) and set(images) == {r["dicom_id"] for r in rows}
    for q, row in zip(questions, rows, strict=True):
        assert q.options[q.answer] == row["answer"]
        assert q.condition[0] == "finding:" + finding_named(row["question"])
        assert all(0 <= share <= 1 for share in q.box)
    studies, first_images = rexvqa_questions(builds["rexvqa"])
    assert studies and {q.key for q in studies} == set(first_images)
    assert all(q.condition[0].startswith("task:") and 0 <= q.answer < len(q.options) for q in studies)


def test_a_question_names_its_longest_finding_and_its_grade():
    assert finding_named("Is there a nodular opacity in the left lung?") == "nodular opacity"
    assert grade_named("Is the pleural effusion in the right lung severe?") == "severe"
    assert grade_named("Is there any pleural effusion in the right lung?") == ""
    with pytest.raises(ValueError, match="names no known finding"):
        finding_named("Is the film rotated?")


def test_a_folder_without_data_is_refused_with_its_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--gemex", str(tmp_path), "--out", str(tmp_path / "out")])
    assert f"--gemex {tmp_path}: not a built folder" in capsys.readouterr().err


def test_an_unknown_arm_is_refused_by_name(builds, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--gemex", str(builds["gemex"]), "--out", str(tmp_path), "--arms", "images,shuffled"])
    assert "--arms: unknown shuffled" in capsys.readouterr().err


def test_the_grid_learner_runs_every_arm_and_is_named_in_each_run(builds, tmp_path, capsys):
    out = tmp_path / "grid"
    args = ["--rexvqa", str(builds["rexvqa"]), "--out", str(out), "--learner", "grid", "--epochs", "1"]
    assert main([*args, "--image-sizes", "32", "--held-out-share", "0.4", "--width", "1"]) == 0
    runs = json.loads((out / "result.json").read_text())["runs"]
    assert [(r["arm"], r["learner"]) for r in runs] == [("images", "grid"), ("blank", "grid")]
    assert "| rexvqa | images | grid | 32 |" in capsys.readouterr().out


def test_question_kinds_keep_only_those_questions_and_an_unknown_kind_is_refused_with_the_kinds_held(builds, tmp_path):
    questions, _ = rexvqa_questions(builds["rexvqa"])
    kinds = sorted({q.kind for q in questions})
    kept = of_kinds(questions, kinds[0])
    assert kept and {q.kind for q in kept} == {kinds[0]} and of_kinds(questions, None) == questions
    with pytest.raises(SystemExit, match=f"--question-kinds: no Bone age in the build; it holds {kinds[0]}"):
        of_kinds(questions, f"{kinds[0]},Bone age")
    out = tmp_path / "kinds"
    args = ["--rexvqa", str(builds["rexvqa"]), "--out", str(out), "--question-kinds", kinds[0], "--epochs", "1"]
    assert main([*args, "--image-sizes", "32", "--held-out-share", "0.4", "--learner", "grid", "--width", "1"]) == 0
    run = json.loads((out / "result.json").read_text())["runs"][0]
    assert set(run["per_kind"]) == {kinds[0]}


def test_the_grid_net_answers_where_a_mark_lies():
    """Four options, one a quadrant: the answer is the quadrant a bright square is drawn in. The grid's cells
    give the place, so a few hundred examples teach it."""
    torch.manual_seed(0)

    def marked(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        quadrant = torch.randint(0, 4, (count,))
        images = torch.zeros(count, 1, 32, 32)
        for i, q in enumerate(quadrant.tolist()):
            y, x = 16 * (q // 2) + torch.randint(2, 8, ()).item(), 16 * (q % 2) + torch.randint(2, 8, ()).item()
            images[i, 0, y : y + 6, x : x + 6] = 1
        return images, quadrant

    net = GridNet(conditions=1, options=4, hidden=32, grid=8)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    conditions = torch.zeros(32, 1, dtype=torch.long)
    for _ in range(60):
        images, answers = marked(32)
        loss = torch.nn.functional.cross_entropy(net(images, conditions), answers)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    images, answers = marked(200)
    with torch.no_grad():
        predicted = net(images, torch.zeros(200, 1, dtype=torch.long)).argmax(1)
    assert (predicted == answers).float().mean() > 0.9


def test_image_only_withholds_what_every_question_names_and_keeps_the_rest(builds, tmp_path):
    questions, _ = rexvqa_questions(builds["rexvqa"])
    kept = unnamed(questions)
    assert {q.condition for q in kept} == {("",)} and len({q.condition for q in questions}) > 1
    assert [(q.key, q.options, q.answer) for q in kept] == [(q.key, q.options, q.answer) for q in questions]
    assert isinstance(kept[0], Question)
    out = tmp_path / "alone"
    args = ["--rexvqa", str(builds["rexvqa"]), "--out", str(out), "--image-only", "--epochs", "1", "--width", "1"]
    assert main([*args, "--image-sizes", "32", "--held-out-share", "0.4", "--learner", "grid"]) == 0
    assert all(r["image_only"] for r in json.loads((out / "result.json").read_text())["runs"])
