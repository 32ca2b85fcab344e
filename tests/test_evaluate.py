import json

import pytest
from datasets import ClassLabel, Dataset, Features, List, Value

from cxr_vqa import evaluate
from gemex_dataset import scoring as gemex_scoring
from gemex_dataset.features import QUESTION_TYPES, features
from rexvqa_dataset import scoring as rex_scoring

from .scoring_fixtures import TASKS, gemex_rows, rexvqa_rows, write_jsonl


def _gemex_dir(tmp_path, per_type=6):
    rows = gemex_rows(per_type=per_type, seed=5)
    folder = tmp_path / "gemex"
    schema = features("none")
    for index, kind in enumerate(QUESTION_TYPES):
        full = [
            {
                **dict.fromkeys(schema),
                **r,
                "split": "test",
                "regions": ["left lung"] * len(r["boxes"]),
                "q_id": i,
                "row_id": f"row_{i}",
            }
            for i, r in enumerate(rows)
            if r["question_type"] == index
        ]
        path = folder / "data" / "test" / f"{kind}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        Dataset.from_list(full, features=schema).to_parquet(str(path))
    return folder, rows


def judged_gemex_argv(tmp_path, judge_url: str, *extra: str, per_type: int = 1) -> list[str]:
    """`cxr-vqa evaluate` arguments that score a small GEMeX build's reference replies with the judge at `judge_url`."""
    folder, rows = _gemex_dir(tmp_path, per_type=per_type)
    predictions = tmp_path / "pred.jsonl"
    write_jsonl(predictions, [(r["question_id"], gemex_scoring.reference_reply(r)) for r in rows])
    return [
        str(folder),
        "--benchmark",
        "gemex",
        "--predictions",
        str(predictions),
        "--text-metrics",
        "",
        "--judge-url",
        judge_url,
        "--judge-model",
        "m",
        *extra,
    ]


def _rex_dir(tmp_path, n=40):
    rows = rexvqa_rows(n, seed=6)
    schema = Features(
        {
            "question_id": Value("string"),
            "question": Value("string"),
            "options": List(Value("string")),
            "answer": Value("string"),
            "answer_index": Value("int32"),
            "task_name": ClassLabel(names=list(TASKS)),
            "task_name_raw": Value("string"),
            "category": Value("string"),
            "subcategory": Value("string"),
            "split": Value("string"),
        }
    )
    path = tmp_path / "rexvqa" / "data" / "test" / "default-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    Dataset.from_list(rows, features=schema).to_parquet(str(path))
    return path.parents[2], rows


def _run(argv):
    return evaluate.main(argv)


def test_gemex_perfect_predictions_end_to_end(tmp_path, capsys):
    folder, rows = _gemex_dir(tmp_path)
    predictions = tmp_path / "pred.jsonl"
    write_jsonl(predictions, [(r["question_id"], gemex_scoring.reference_reply(r)) for r in rows])
    out = tmp_path / "scores.json"
    code = _run(
        [
            str(folder),
            "--benchmark",
            "gemex",
            "--predictions",
            str(predictions),
            "--out",
            str(out),
            "--text-metrics",
            "rougeL,bleu1",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "| closed_ended |" in printed and "ROUGE-L" in printed
    report = json.loads(out.read_text())
    assert report["scores"]["all"]["A"] == pytest.approx(100) and report["scores"]["all"]["V"] == pytest.approx(
        100, abs=1e-3
    )
    assert report["settings"]["split"] == "test" and report["settings"]["box_convention"] == "pixels"
    assert report["predictions_check"]["missing"] == [] and len(report["per_question"]) == len(rows)


def test_gemex_bad_predictions_file_is_reported_and_strict_fails(tmp_path, capsys):
    folder, rows = _gemex_dir(tmp_path, per_type=3)
    predictions = tmp_path / "pred.jsonl"
    replies = [(r["question_id"], gemex_scoring.reference_reply(r)) for r in rows[1:]]
    write_jsonl(predictions, replies + [("nope", "Yes."), replies[0]])
    code = _run(
        [str(folder), "--benchmark", "gemex", "--predictions", str(predictions), "--text-metrics", "", "--strict"]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "1 question(s) of the split have no prediction" in captured.err and "'nope' (line" in captured.err
    assert "repeated prediction" in captured.err and str(predictions) in captured.err


def test_gemex_baselines_print_the_floor(tmp_path, capsys):
    folder, _ = _gemex_dir(tmp_path)
    for baseline in ("random", "majority"):
        assert _run([str(folder), "--benchmark", "gemex", "--baseline", baseline, "--text-metrics", "rougeL"]) == 0
        assert f"baseline {baseline}" in capsys.readouterr().out


def test_a_predictions_table_shows_the_majority_baseline_beside_each_score(tmp_path, capsys):
    """The `Majority A` column is what `--baseline majority` scores on the same questions, type by type."""
    folder, rows = _gemex_dir(tmp_path)
    predictions, scored, floor = tmp_path / "pred.jsonl", tmp_path / "scored.json", tmp_path / "floor.json"
    write_jsonl(predictions, [(r["question_id"], gemex_scoring.reference_reply(r)) for r in rows])
    common = ["--benchmark", "gemex", "--text-metrics", ""]
    assert _run([str(folder), *common, "--predictions", str(predictions), "--out", str(scored)]) == 0
    table = capsys.readouterr().out
    assert _run([str(folder), *common, "--baseline", "majority", "--out", str(floor)]) == 0
    assert "Majority" not in capsys.readouterr().out
    majority = json.loads(scored.read_text())["majority"]
    baseline = json.loads(floor.read_text())
    assert baseline["majority"] is None
    for kind, entry in baseline["scores"].items():
        assert majority[kind] == entry["A"]
    closed = majority["closed_ended"]
    assert (
        "| Type | Questions | A | Majority A | V |" in table
        and f"| closed_ended | 6 | 100.00 | {closed:.2f} |" in table
    )


def test_a_rexvqa_predictions_table_shows_the_majority_accuracy_of_each_group(tmp_path, capsys):
    folder, rows = _rex_dir(tmp_path)
    predictions, out = tmp_path / "pred.jsonl", tmp_path / "scores.json"
    write_jsonl(predictions, [(r["question_id"], rex_scoring.reference_reply(r)) for r in rows])
    assert _run([str(folder), "--benchmark", "rexvqa", "--predictions", str(predictions), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    majority = rex_scoring.score_rexvqa(rows, rex_scoring.majority_replies(rows))
    assert json.loads(out.read_text())["majority"]["overall"] == majority["overall"]
    assert f"| Overall | 40 | 100.00 | {majority['overall']['accuracy']:.2f} | 0 | 0 |" in table
    for task, block in majority["per_task"].items():
        assert f"| task: {task} | {block['questions']} | 100.00 | {block['accuracy']:.2f} |" in table


def test_rexvqa_end_to_end_with_rexrank_round_trip(tmp_path, capsys):
    folder, rows = _rex_dir(tmp_path)
    predictions = tmp_path / "pred.jsonl"
    write_jsonl(predictions, [(r["question_id"], rex_scoring.reference_reply(r)) for r in rows])
    submission, out = tmp_path / "rexrank.json", tmp_path / "scores.json"
    assert (
        _run(
            [
                str(folder),
                "--benchmark",
                "rexvqa",
                "--predictions",
                str(predictions),
                "--write-rexrank",
                str(submission),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "| Overall | 40 | 100.00 |" in capsys.readouterr().out
    assert _run([str(folder), "--benchmark", "rexvqa", "--predictions", str(submission)]) == 0
    assert "| Overall | 40 | 100.00 |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report["scores"]["per_task"]) <= set(TASKS) and report["scores"]["overall"]["failed_extraction"] == 0


def test_run_reports_errors_in_one_line(tmp_path, capsys):
    assert _run([str(tmp_path / "absent"), "--benchmark", "rexvqa", "--baseline", "random"]) == 2
    assert "no such dataset folder" in capsys.readouterr().err


@pytest.mark.parametrize("image_mode, convention", [("reference", "pixels"), ("none", "frame224")])
def test_evaluate_a_real_gemex_build(tmp_path, capsys, image_mode, convention):
    """Synthetic raw release -> `build gemex` (card with configs) -> evaluate perfect replies and a baseline.

    Without images (`none`) the build has no pixel boxes, so boxes are scored in the 224 frame."""
    from datasets import load_dataset

    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic.release import generate

    with_images = image_mode != "none"
    release = generate(tmp_path / "raw", num_images=3, layouts=("per_type",), images=with_images)
    folder = tmp_path / "gemex"
    build_gemex(
        BuildSettings(
            source=release.root / "per_type",
            out=folder,
            image_mode=image_mode,
            split="test",
            images=release.image_root if with_images else None,
        )
    )
    rows = load_dataset(str(folder), split="test").to_list()
    predictions = tmp_path / "pred.jsonl"
    write_jsonl(predictions, [(r["question_id"], gemex_scoring.reference_reply(r, convention)) for r in rows])
    out = tmp_path / "scores.json"
    argv = [str(folder), "--benchmark", "gemex", "--box-convention", convention, "--text-metrics", "rougeL,bleu1"]
    assert _run(argv + ["--predictions", str(predictions), "--out", str(out)]) == 0
    scores = json.loads(out.read_text())["scores"]["all"]
    assert scores["questions"] == len(rows) and scores["A"] == pytest.approx(100) and scores["V_skipped"] == 0
    assert scores["V"] == pytest.approx(100, abs=1e-3) and scores["rougeL"] == pytest.approx(100)
    assert _run(argv + ["--baseline", "random"]) == 0
    capsys.readouterr()


def test_gemex_with_the_llm_judge_on_a_local_server(tmp_path, capsys):
    import threading
    from http.server import HTTPServer

    from .test_judge import _FakeJudge

    server = HTTPServer(("127.0.0.1", 0), _FakeJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        out = tmp_path / "scores.json"
        assert _run(judged_gemex_argv(tmp_path, url, "--out", str(out), per_type=2)) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert "Judge" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["scores"]["all"]["judge"] == pytest.approx(100) and report["settings"]["judge"]["model"] == "m"


def test_unknown_split_is_a_one_line_error(tmp_path, capsys):
    folder, _ = _rex_dir(tmp_path, n=5)
    assert _run([str(folder), "--benchmark", "rexvqa", "--split", "valid", "--baseline", "majority"]) == 2
    err = capsys.readouterr().err
    assert "cxr-vqa evaluate: error:" in err and "valid" in err


def test_a_built_folder_with_a_preview_config_is_evaluated_on_its_rows_once(tmp_path):
    from builders.built_folder import card_configs
    from builders.hub.preview import add_preview_config

    from .publish_builds import copy_build

    folder = copy_build("synthetic-embed", tmp_path / "builds", tmp_path / "gemex")
    add_preview_config(folder, n=4, split="test", image=False)
    _, infos = card_configs(folder)
    rows = evaluate.load_split(folder, "test", ["question_id"], ["question_id"])
    assert len(rows) == len({r["question_id"] for r in rows}) == infos["default"].splits["test"].num_examples


def test_hostile_predictions_end_in_one_line_or_a_written_out(tmp_path, capsys, monkeypatch):
    """A deeply nested reply is a failed extraction, a lone-surrogate id an error
    naming its line before anything is printed, and secrets in the warnings are masked."""
    folder, rows = _gemex_dir(tmp_path, per_type=2)
    predictions, out = tmp_path / "pred.jsonl", tmp_path / "scores.json"
    write_jsonl(
        predictions,
        [(rows[0]["question_id"], "{" * 100_000 + "}"), (rows[1]["question_id"], "The answer" + "\n" * 1000 + "x")],
    )
    assert (
        _run(
            [
                str(folder),
                "--benchmark",
                "gemex",
                "--predictions",
                str(predictions),
                "--text-metrics",
                "",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["per_question"][0]["failed_extraction"] or report["per_question"][0]["extracted"] is None
    capsys.readouterr()
    predictions.write_text(json.dumps({"question_id": "q\ud800", "prediction": "A"}) + "\n")
    out.unlink()
    assert (
        _run(
            [
                str(folder),
                "--benchmark",
                "gemex",
                "--predictions",
                str(predictions),
                "--text-metrics",
                "",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    assert (
        captured.out == "" and "pred.jsonl:1: question_id holds a lone surrogate" in captured.err and not out.exists()
    )
    monkeypatch.setenv("HF_TOKEN", "hf_pastedTokenValue0123456789")
    secrets = [("hf_pastedTokenValue0123456789", "A"), ("Bearer sk-abcdefghijklmnopqrstuv", "B")]
    write_jsonl(predictions, [(r["question_id"], "A") for r in rows] + secrets)
    assert _run([str(folder), "--benchmark", "gemex", "--predictions", str(predictions), "--text-metrics", ""]) == 0
    err = capsys.readouterr().err
    assert "name a question_id not in the split" in err and "pastedToken" not in err and "abcdefghijklmnop" not in err
    write_jsonl(predictions, secrets)  # nothing of the split: refused, the ids it names masked too
    assert _run([str(folder), "--benchmark", "gemex", "--predictions", str(predictions), "--text-metrics", ""]) == 2
    err = capsys.readouterr().err
    assert "nothing was scored" in err and "pastedToken" not in err and "abcdefghijklmnop" not in err


@pytest.fixture(scope="module")
def gemex_build(tmp_path_factory):
    """A real GEMeX build (annotations only) with train, validation and test splits."""
    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic.release import generate

    root = tmp_path_factory.mktemp("gemex-build")
    release = generate(root / "raw", num_images=24, layouts=("per_type",), images=False)
    build_gemex(BuildSettings(source=release.root / "per_type", out=root / "gemex", image_mode="none"))
    return root / "gemex"


def _no_bertscore(monkeypatch):
    from builders.scoring import text_metrics

    def refused(*args, **kwargs):
        raise AssertionError("BERTScore was loaded")

    monkeypatch.setattr(text_metrics, "BertScorer", refused)


def test_predictions_of_another_split_stop_before_scoring_and_name_it(gemex_build, tmp_path, capsys, monkeypatch):
    _no_bertscore(monkeypatch)
    rows = evaluate.load_split(
        gemex_build, "validation", ["question_id", "question_type", "answer", "reason", "boxes"], ["question_id"]
    )
    predictions = tmp_path / "validation.jsonl"
    write_jsonl(predictions, [(r["question_id"], "<answer> Yes") for r in rows])
    out = tmp_path / "scores.json"
    assert (
        _run(
            [
                str(gemex_build),
                "--benchmark",
                "gemex",
                "--predictions",
                str(predictions),
                "--text-metrics",
                "bertscore",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "" and not out.exists()
    assert f"only 0 of its {len(rows)} prediction(s) match" in lines[0] and "pass --split validation" in lines[0]
    assert (
        _run(
            [
                str(gemex_build),
                "--benchmark",
                "gemex",
                "--split",
                "validation",
                "--predictions",
                str(predictions),
                "--text-metrics",
                "rougeL",
            ]
        )
        == 0
    )
    capsys.readouterr()


def test_predictions_of_the_other_dataset_are_named_as_such(gemex_build, tmp_path, capsys, monkeypatch):
    _no_bertscore(monkeypatch)
    rex_folder, rex_rows = _rex_dir(tmp_path)
    rex_predictions, gemex_predictions = tmp_path / "rex.jsonl", tmp_path / "gemex.jsonl"
    write_jsonl(rex_predictions, [(r["question_id"], "A") for r in rex_rows])
    gemex_ids = [r["question_id"] for r in evaluate.load_split(gemex_build, "test", ["question_id"], ["question_id"])]
    write_jsonl(gemex_predictions, [(question_id, "Yes") for question_id in gemex_ids])
    assert _run([str(gemex_build), "--benchmark", "gemex", "--predictions", str(rex_predictions)]) == 2
    assert "not GEMeX question ids" in capsys.readouterr().err
    assert _run([str(rex_folder), "--benchmark", "rexvqa", "--predictions", str(gemex_predictions)]) == 2
    assert "look like GEMeX question ids" in capsys.readouterr().err
    assert _run([str(gemex_build), "--benchmark", "rexvqa", "--baseline", "random"]) == 2
    assert "a gemex build (its build_report.json says so)" in capsys.readouterr().err


def test_a_partial_predictions_file_is_scored_with_its_missing_questions_wrong(gemex_build, tmp_path, capsys):
    rows = evaluate.load_split(gemex_build, "test", ["question_id"], ["question_id"])
    predictions = tmp_path / "first.jsonl"
    write_jsonl(predictions, [(rows[0]["question_id"], "Yes")])  # a --max_samples 1 run
    assert (
        _run([str(gemex_build), "--benchmark", "gemex", "--predictions", str(predictions), "--text-metrics", ""]) == 0
    )
    assert f"{len(rows) - 1} question(s) of the split have no prediction" in capsys.readouterr().err


def test_bertscore_embeds_no_empty_reply():
    from builders.scoring import text_metrics

    if "bertscore" not in text_metrics.installed_metrics()[0]:
        pytest.skip("the bertscore extra is not installed")
    scorer = text_metrics.BertScorer()
    embedded = []
    embed = scorer._embed
    scorer._embed = lambda texts: embedded.extend(texts) or embed(texts)
    scores = scorer.score(["", "  ", "left lung opacity"], ["right lung", "a reason", "left lung opacity"])
    assert scores[:2] == [0.0, 0.0] and scores[2] == pytest.approx(1.0, abs=1e-4)
    assert embedded == ["left lung opacity", "left lung opacity"]


def test_a_config_scores_its_questions_alone(gemex_build, tmp_path, capsys):
    """What `generate.py --dataset_config closed_ended` answered is scored on those questions, not counted
    missing among every type's."""
    wanted = ["question_id", "question_type"]
    closed = evaluate.load_split(gemex_build, "test", wanted, ["question_id"], config="closed_ended")
    every = evaluate.load_split(gemex_build, "test", wanted, ["question_id"])
    assert closed and {r["question_type"] for r in closed} == {"closed_ended"} and len(every) > len(closed)
    predictions, out = tmp_path / "closed.jsonl", tmp_path / "scores.json"
    write_jsonl(predictions, [(r["question_id"], "<answer> No.") for r in closed])
    argv = [str(gemex_build), "--config", "closed_ended", "--predictions", str(predictions), "--text-metrics", ""]
    assert _run(argv + ["--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "## gemex test closed_ended" in captured.out and "no prediction" not in captured.err
    report = json.loads(out.read_text())
    assert set(report["scores"]) == {"closed_ended", "all"} and report["settings"]["config"] == "closed_ended"
    assert report["scores"]["all"]["questions"] == len(closed) and report["scores"]["all"]["missing"] == 0
    assert _run([str(gemex_build), "--config", "yes_no", "--baseline", "majority"]) == 2
    assert "no config 'yes_no' in the card (configs: closed_ended, default" in capsys.readouterr().err
