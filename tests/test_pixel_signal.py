"""The pixel-signal benchmark (benchmarks/pixel_signal.py) on tiny builds: it reads every closed-ended GEMeX
question and every ReXVQA question, splits them by image, trains its classifier per arm and size, and writes
each run's figures to result.json."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.pixel_learners import GridNet
from benchmarks.pixel_signal import (
    Question,
    finding_named,
    gemex_questions,
    grade_named,
    held_out,
    main,
    of_kinds,
    probe_tokens,
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


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    from benchmarks.probe_model import main as probe_model

    out = tmp_path_factory.mktemp("probe") / "probe"
    assert probe_model(["--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("learner", ["tokens", "attention", "matching", "pointer"])
@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_the_probe_learners_read_the_probe_s_image_tokens_in_every_arm(
    builds, probe, tmp_path, capsys, learner, dataset
):
    out = tmp_path / learner
    args = [f"--{dataset}", str(builds[dataset]), "--out", str(out), "--learner", learner, "--probe-model", str(probe)]
    assert main([*args, "--epochs", "1", "--held-out-share", "0.4", "--width", "1"]) == 0
    runs = json.loads((out / "result.json").read_text())["runs"]
    assert [(r["arm"], r["learner"], r["image_size"]) for r in runs] == [
        ("images", learner, 112),
        ("blank", learner, 112),
    ]
    assert all(r["held_out_questions"] > 0 and 0 <= r["accuracy"] <= 100 for r in runs)
    assert f"| {dataset} | images | {learner} | 112 |" in capsys.readouterr().out


def test_probe_tokens_are_one_vector_an_image_and_blank_images_are_not_taken_for_padding(probe):
    """Idefics3 drops an all-zero image as padding; the blank arm's zeros must still give one row each, all alike."""
    torch.manual_seed(0)
    pictures = torch.rand(3, 1, 112, 112) * 2 - 1
    tokens = probe_tokens(pictures, probe)
    assert tokens.shape == (3, 49, 128) and not torch.equal(tokens[0], tokens[1])
    blank = probe_tokens(torch.zeros(4, 1, 112, 112), probe)
    assert blank.shape == (4, 49, 128) and bool((blank == blank[0]).all())
    with pytest.raises(SystemExit, match="sees 112 px images: give --image-sizes 112"):
        probe_tokens(torch.zeros(2, 1, 56, 56), probe)


def test_the_verdict_learner_trains_the_probe_s_decoder_in_every_arm(builds, probe, tmp_path, capsys):
    out = tmp_path / "verdicts"
    args = ["--rexvqa", str(builds["rexvqa"]), "--out", str(out), "--learner", "verdicts", "--probe-model", str(probe)]
    assert main([*args, "--epochs", "1", "--held-out-share", "0.4", "--text-between", "5"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert [(r["arm"], r["learner"]) for r in result["runs"]] == [("images", "verdicts"), ("blank", "verdicts")]
    assert all(r["held_out_questions"] > 0 and 0 <= r["accuracy"] <= 100 for r in result["runs"])
    assert result["settings"]["text_between"] == 5
    assert "| rexvqa | images | verdicts | 112 |" in capsys.readouterr().out


def test_the_verdict_learner_spells_each_option_before_its_verdict_and_turns_negation_around(probe):
    """Each option's verdict is read at the token just before " yes" / " no" would follow its name; the LM's
    targets say which options the image shows, so a negation question's answer is the one option not shown."""
    from transformers import AutoTokenizer

    from benchmarks.pixel_learners import VerdictNet

    tasks = ["task:Negation Assessment", "task:Presence Assessment"]
    names = ["Chest tube", "Hiatal hernia", "Rib fracture", "Pneumothorax"]
    net = VerdictNet(probe, tasks, names, between=3, seed=0)
    conditions, options = torch.tensor([[1], [2]]), torch.tensor([[0, 1, 2, 3], [3, 2, -1, 0]])
    ids, slots = net.spelt(conditions, options)
    text = AutoTokenizer.from_pretrained(probe).decode
    assert ids[0, :3].tolist() == ids[1, :3].tolist() == net.between
    first = text(ids[0, 3 : slots[0][0] + 1].tolist())
    assert first.startswith(" Negation Assessment: A: Chest tube") and first.endswith(text(net.before_verdict))
    assert text(ids[1, slots[1][1] + 1 : slots[1][2] + 1].tolist()).startswith(" C: unknown")
    tokens = torch.randn(2, 49, 128)
    logits = net.verdict_logits(tokens, conditions, options)
    shown = logits[..., net.yes] - logits[..., net.no]
    assert torch.allclose(net(tokens, conditions, options), torch.stack([-shown[0], shown[1]]))
    answer = torch.tensor([1, 0])  # negation: B is not shown, so A, C and D are; presence: A is shown
    targets = torch.tensor([[net.yes, net.no, net.yes, net.yes], [net.yes, net.no, net.no, net.no]])
    kept = options.flatten() >= 0
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1)[kept], targets.flatten()[kept])
    assert torch.allclose(net.loss(tokens, conditions, options, answer), expected)


def test_the_verdict_learner_is_refused_on_gemex_and_text_between_on_other_learners(builds, probe, tmp_path, capsys):
    gemex = ["--gemex", str(builds["gemex"]), "--out", str(tmp_path), "--probe-model", str(probe)]
    with pytest.raises(SystemExit):
        main([*gemex, "--learner", "verdicts"])
    assert "--learner verdicts checks ReXVQA's offered options one by one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rexvqa", str(builds["rexvqa"]), "--out", str(tmp_path), "--learner", "grid", "--text-between", "9"])
    assert "--text-between is text before the verdict learner's question: --learner grid" in capsys.readouterr().err


@pytest.mark.parametrize("learner", ["tokens", "attention", "matching", "pointer", "verdicts"])
def test_the_probe_learners_are_refused_without_a_probe(builds, tmp_path, capsys, learner):
    with pytest.raises(SystemExit):
        main(["--gemex", str(builds["gemex"]), "--out", str(tmp_path), "--learner", learner])
    assert f"--learner {learner} reads a probe's image tokens: give --probe-model MODEL" in capsys.readouterr().err


def named_token_accuracy(named: bool, steps: int = 800) -> float:
    """`AttentionNet` trained to answer whether the first feature of the image token the condition names is
    positive (four random tokens of 16 features), scored on 2,000 fresh questions; `named=False` gives every
    question the same condition."""
    from benchmarks.pixel_learners import AttentionNet

    torch.manual_seed(0)
    net = AttentionNet(width=16, conditions=5, options=2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)

    def questions(n: int):
        tokens = torch.randn(n, 4, 16, generator=generator)
        which = torch.randint(0, 4, (n,), generator=generator)
        answer = (tokens[torch.arange(n), which, 0] > 0).long()
        return tokens, ((which + 1) if named else torch.ones(n, dtype=torch.long))[:, None], answer

    for _ in range(steps):
        tokens, conditions, answer = questions(64)
        loss = torch.nn.functional.cross_entropy(net(tokens, conditions), answer)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tokens, conditions, answer = questions(2000)
    with torch.no_grad():
        return float((net(tokens, conditions).argmax(1) == answer).float().mean())


def test_the_attention_learner_learns_to_read_the_token_its_question_names():
    """What the probe's answer must learn: which image token to read, from the question. Told which, the net
    answers most questions; told nothing, it can only read all the tokens at once."""
    named, unnamed_ = named_token_accuracy(True), named_token_accuracy(False)
    assert named > 0.85 and named > unnamed_ + 0.15


def matched_letter_accuracy(texts_known: bool, steps: int = 500, learner: str = "matching") -> float:
    """The `learner` (`MatchingNet` or `PointerNet`) trained on questions like ReXVQA's over six image tokens, one
    per finding, each carrying its place (a fixed code, as a vision tower's position embeddings give a probe's
    tokens) and one of them drawn (its first feature 1, the others' -1): four of the six findings are offered in a
    random order and the answer is the letter of the drawn one. `texts_known=False` hides which finding each option names (every option an unknown
    text). Scored on 2,000 fresh questions."""
    from benchmarks.pixel_learners import MatchingNet, PointerNet

    torch.manual_seed(0)
    net = (MatchingNet if learner == "matching" else PointerNet)(width=16, conditions=2, options=6, letters=4)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    places = torch.randn(6, 16, generator=generator)

    def questions(n: int):
        offered = torch.stack([torch.randperm(6, generator=generator)[:4] for _ in range(n)])
        answer = torch.randint(0, 4, (n,), generator=generator)
        tokens = places + 0.1 * torch.randn(n, 6, 16, generator=generator)
        tokens[:, :, 0] = -1
        tokens[torch.arange(n), offered[torch.arange(n), answer], 0] = 1
        options = offered if texts_known else torch.full_like(offered, -1)
        return tokens, torch.ones(n, 1, dtype=torch.long), options, answer

    for _ in range(steps):
        tokens, conditions, options, answer = questions(64)
        loss = torch.nn.functional.cross_entropy(net(tokens, conditions, options), answer)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tokens, conditions, options, answer = questions(2000)
    with torch.no_grad():
        return float((net(tokens, conditions, options).argmax(1) == answer).float().mean())


def test_the_matching_learner_answers_the_letter_of_the_option_its_image_shows():
    """What a ReXVQA reply must learn: which offered option's finding the image shows, and the letter it stands
    at. Told the options' texts, the net answers most questions; with them hidden, no better than a letter."""
    known, hidden = matched_letter_accuracy(True), matched_letter_accuracy(False)
    assert known > 0.8 and hidden < 0.35


def test_the_pointer_learner_scores_each_option_by_what_its_own_token_reads():
    """The same questions answered by each option's own token: told the options' texts it answers them, and with
    them hidden every option reads alike, no better than a letter."""
    known, hidden = matched_letter_accuracy(True, learner="pointer"), matched_letter_accuracy(False, learner="pointer")
    assert known > 0.8 and hidden < 0.35


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
