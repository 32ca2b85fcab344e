"""The GPU kit (benchmarks/gpu) on CPU with the tiny model: the very steps a GPU call runs
(synthesize and build, B.1 rows, B.2 batch sizes, the B.3 loop through `cxr-vqa evaluate`, B.4),
so the first GPU call is not also the kit's first run; and a step that breaks is recorded while
the next one still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.gpu import kit  # noqa: E402


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def run_sh_tiny(part: str, out: Path, work: Path) -> None:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    completed = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), part, "--tiny", "--work", str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


@pytest.mark.slow
def test_run_sh_tiny_writes_every_row_log_and_the_scores_table(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    run_sh_tiny("1", out, work)
    plan = kit.load_plan(tiny=True)
    profiled = [kit.train_name(s, plan["train"]["speedups"]) for s in plan["parts"]["1"] if s.get("profile")]
    assert sorted(p.name for p in out.iterdir()) == sorted(  # three files and the traces: nothing else
        ["logs.tar.gz", "results.jsonl", "results.md", *(f"trace-{name}.json.gz" for name in profiled)]
    )

    rows = rows_of(out)
    assert [r for r in rows if r["status"] not in ("ok", "skipped")] == []
    assert rows[0]["bench"] == "env" and rows[0]["device"] == "cpu" and "unmet: none" in rows[0]["versions"]
    bench = {name: [r for r in rows if r["bench"] == name] for name in ("env", "data", "B.1", "B.2", "B.3", "B.4")}
    assert len(bench["data"]) == 4 and all(r["status"] == "ok" for r in bench["data"])

    train_steps = [s for s in plan["parts"]["1"] if s["step"] == "train"]
    assert [r["name"] for r in bench["B.1"]] == [kit.train_name(s, plan["train"]["speedups"]) for s in train_steps]
    for step, row in zip(train_steps, bench["B.1"]):
        assert row["speedups"] == step.get("speedups", plan["train"]["speedups"])
        assert ("--group_by_length" in row["command"]) == ("group_by_length" in row["speedups"])
        assert ("--chunked_vision_attention" in row["command"]) == ("chunked_vision_attention" in row["speedups"])
        assert ("--flash_first" in row["command"]) == ("flash_first" in row["speedups"])
        if "compile" in row["speedups"] and row["status"] == "ok":
            assert row["compiled_blocks"] > 0 and row["compiled_graphs"] > 0
    assert all(0 <= r["padding_share"] < 1 for r in bench["B.1"] if r["status"] == "ok")
    for row in bench["B.1"]:
        if row["status"] == "ok":
            assert row["samples_per_s"] > 0 and row["tokens_per_sample"] > 0 and 0 <= row["data_wait_share"] <= 1
            assert "-m benchmarks.train_throughput" in row["command"]
        else:  # a layout whose config the build lacks (one built with --no-conversations)
            assert row["config"] in row["error"]
    assert sum(r["status"] == "ok" for r in bench["B.1"]) >= 2
    # the throughput benchmark's compiled row (regional compile, aot_eager on CPU): its blocks and graphs counted
    assert any("compile" in r["speedups"] for r in bench["B.1"] if r["status"] == "ok")

    generation = plan["generate"]
    sweep = [r for r in bench["B.2"] if r["variant"] == "longest first" and r["dataset"] == "gemex"]
    assert [r["batch_size"] for r in sweep] == generation["batch_sizes"]
    assert all(
        r["status"] == "ok" and r["questions"] == generation["questions"] and r["questions_per_s"] > 0
        for r in bench["B.2"]
    )
    best = max(sweep, key=lambda r: r["questions_per_s"])["batch_size"]
    rest = [(r["dataset"], r["variant"], r["batch_size"]) for r in bench["B.2"] if r not in sweep]
    assert rest == [
        *(("gemex", v, best) for v in generation["variants"]),
        ("rexvqa", "longest first", best),
        ("rexvqa", "split order", best),
    ]

    loop, *evaluations = bench["B.3"]
    assert loop["status"] == "ok" and loop["steps"] == plan["loop"]["steps"] and loop["loss_falls"]
    assert [r["name"] for r in evaluations] == ["evaluate gemex", "evaluate rexvqa"]
    for row in evaluations:
        assert row["status"] == "ok" and row["missing"] == 0
        assert row["replies_scored"] == loop["predictions"][row["name"].split()[1]]["count"] > 0
        assert 0 <= row["failed_extractions"] <= row["replies_scored"]

    epoch = {r["name"]: r for r in bench["B.4"]}
    assert epoch["gemex per_question"]["hours_per_epoch"] > 0
    assert epoch["gemex per_question"]["train_rows"] > 1_500_000

    markdown = (out / "results.md").read_text()
    assert "| all |" in markdown and "| multi_choice |" in markdown  # GEMeX's scores table, per question type
    assert "| Overall |" in markdown  # ReXVQA's
    for title in ("B.1", "B.2", "B.3", "B.4", "## Commands"):
        assert title in markdown
    for name in profiled:  # where the profiled step's time went (benchmarks/step_profile.py)
        assert f"- `{name}` profile: " in markdown and "no GPU kernels in the trace" in markdown
    with tarfile.open(out / "logs.tar.gz") as archive:
        names = {Path(name).name for name in archive.getnames()}
    assert {
        "environment.log",
        "build-gemex.log",
        "build-rexvqa.log",
        "generate.log",
        "loop.log",
        "evaluate-gemex.log",
        "scores-gemex.json",
        "scores-rexvqa.json",
        "predictions-gemex.jsonl",
        "ops.txt",
    } <= names


@pytest.mark.slow
def test_run_sh_tiny_signal_part_trains_each_arm_of_both_datasets_for_the_same_time_and_scores_it_held_out(tmp_path):
    """B.5: the learning-signal benchmark as the plan sets it, ReXVQA and GEMeX (trained and scored on images asked
    both ways) in one call, each arm stopped at the plan's wall time (sft.py saves where SIGTERM stops it) and
    scored on the held-out release beside the majority baseline."""
    out, work = tmp_path / "out", tmp_path / "work"
    run_sh_tiny("4", out, work)
    plan = kit.load_plan(tiny=True)
    (step,) = plan["parts"]["4"]
    signal = {**plan["signal"], **step}
    rows = [r for r in rows_of(out) if r["bench"] == "B.5"]
    datasets, arms = signal["datasets"].split(","), signal["arms"].split(",")
    assert datasets == ["rexvqa", "gemex"] and signal["train_both_ways"]
    assert sorted(r["name"] for r in rows) == sorted(
        [f"{dataset} {arm}" for dataset in datasets for arm in arms]
        + [f"{dataset} majority baseline" for dataset in datasets]
    )
    baselines = {r["dataset"]: r for r in rows if r["arm"] == "majority baseline"}
    for row in (r for r in rows if r["arm"] != "majority baseline"):
        assert row["status"] == "ok" and row["size"] == signal["size"]
        assert 0 < row["steps"] < signal["steps"]  # stopped by the time, not by the steps
        assert row["seconds"] >= signal["train_seconds"]
        assert row["questions"] == baselines[row["dataset"]]["questions"] > 0 and 0 <= row["accuracy"] <= 100
        assert f"--train-seconds={signal['train_seconds']}" in row["command"]
        assert "--train-both-ways" in row["command"].split()
        assert (row["both_ways_accuracy"] is None) == (row["dataset"] != "gemex")
    with tarfile.open(out / "logs.tar.gz") as archive:
        names = set(archive.getnames())
    logs = "logs-part4/signal"
    runs = {f"{logs}/run-{dataset}-{arm}.log" for dataset in datasets for arm in arms}
    assert {f"{logs}/result.json", *runs} <= names
    results = (out / "results.md").read_text()
    assert all(f"| {dataset} | images | {signal['size']} |" in results for dataset in datasets)


def test_a_broken_step_is_recorded_and_the_next_still_runs(tmp_path):
    plan = kit.load_plan(tiny=True)
    plan["parts"] = {"x": [{"step": "generate"}, {"step": "no_such_step"}, {"step": "epoch_hours"}]}
    rows = kit.run_part(plan, "x", tmp_path / "out", tmp_path / "work", tiny=True)  # nothing built: generation fails
    by_bench = {r["bench"]: r for r in rows}
    assert by_bench["B.2"]["status"] == "failed" and by_bench["B.2"]["error"]  # the log's last lines
    assert by_bench["no_such_step"]["status"] == "failed"
    assert (
        all(r["status"] == "skipped" for r in rows if r["bench"] == "B.4")
        and len([r for r in rows if r["bench"] == "B.4"]) == 4
    )
    assert rows_of(tmp_path / "out") == rows
    assert "B.2" in (tmp_path / "out" / "results.md").read_text()


def test_a_call_packs_and_reads_only_its_own_logs(tmp_path):
    """The work folder outlives a call (its builds are reused); the logs of an earlier call, which went back with
    it, must not come back again as this call's, nor its trace, nor be read for this call's scores."""
    work = tmp_path / "work"
    earlier = work / "logs" / "profile-earlier"
    earlier.mkdir(parents=True)
    (earlier / kit.TRACE).write_bytes(b"an earlier run's trace")
    (work / "logs" / "scores-gemex.json").write_text("{}")
    plan = kit.load_plan(tiny=True)
    plan["parts"] = {"x": [{"step": "epoch_hours"}]}
    kit.run_part(plan, "x", tmp_path / "out", work, tiny=True)
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as archive:
        names = archive.getnames()
    assert "logs-partx/environment.log" in names
    assert not [n for n in names if "earlier" in n or "scores-gemex" in n]
    assert not list((tmp_path / "out").glob("trace-*"))


CUDA_OUT_OF_MEMORY = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.54 GiB. GPU 0 has a total capacity of 79.18 GiB"
    " of which 9.72 GiB is free. Including non-PyTorch memory, this process has 69.44 GiB memory in use. Of the"
    " allocated memory 52.46 GiB is allocated by PyTorch, and 16.24 GiB is reserved by PyTorch but unallocated. If"
    " reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid"
    " fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html)"
)
"""The line the H100 printed when a per-image batch's logits did not fit: longer than a row's error keeps."""


def test_an_out_of_memory_step_is_known_from_its_whole_log(tmp_path):
    """The recorded error keeps each last line's tail, which cuts CUDA's message before its "out of memory";
    the retry at half the batch must still see it."""
    plan = kit.load_plan(tiny=True)
    runner = kit.Kit(plan, "x", tmp_path / "out", tmp_path / "work", True, kit.time.monotonic() + 60)
    runner.logs.mkdir(parents=True)
    script = f"import sys; print({CUDA_OUT_OF_MEMORY!r}, file=sys.stderr); sys.exit(1)"
    outcome = runner.run("oom", [sys.executable, "-c", script], 30)
    assert outcome.status == "failed" and outcome.out_of_memory
    assert "out of memory" not in outcome.error.lower()
    assert not runner.run("fails", [sys.executable, "-c", "raise SystemExit('no')"], 30).out_of_memory


def test_a_training_row_out_of_memory_is_retried_at_half_the_batch(tmp_path, monkeypatch):
    plan = kit.load_plan(tiny=True)
    runner = kit.Kit(plan, "x", tmp_path / "out", tmp_path / "work", True, kit.time.monotonic() + 60)
    runner.out.mkdir(parents=True)
    runner.logs.mkdir(parents=True)
    batches = []

    def run(name: str, command: list[str], timeout: float) -> kit.Outcome:
        batch = int(command[command.index("--batch_size") + 1])
        batches.append(batch)
        if batch > 1:
            return kit.Outcome("failed", 1.0, 1, "orch but unallocated.", out_of_memory=True)
        Path(command[command.index("--output_json") + 1]).write_text(json.dumps({"samples_per_s": 2.0}))
        return kit.Outcome("ok", 1.0, 0)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(kit, "built_configs", lambda built: {"sft", "sft_per_image"})
    kit.step_train(runner, {"step": "train", "dataset": "gemex", "layout": "per_image", "tuning": "full"})
    assert batches == [2, 1]
    assert [(r["status"], r["batch_size"]) for r in runner.rows] == [("failed", 2), ("ok", 1)]
    assert runner.rows[-1]["samples_per_s"] == 2.0

    batches.clear()
    kit.step_train(
        runner, {"step": "train", "dataset": "gemex", "layout": "per_question", "tuning": "full", "batch_size": 1}
    )
    assert batches == [1] and runner.rows[-1]["name"] == "gemex-per_question-full-default-batch1"


def test_b5_keeps_the_arms_that_trained_beside_the_one_that_failed(tmp_path, monkeypatch):
    """learning_signal writes the arms that finished and lists a failed one; the kit records both, so a long
    call's figures are not lost to one arm's failure."""
    plan = kit.load_plan(tiny=True)
    runner = kit.Kit(plan, "4", tmp_path / "out", tmp_path / "work", True, kit.time.monotonic() + 60)
    runner.out.mkdir(parents=True)
    runner.logs.mkdir(parents=True)
    trained = {"dataset": "rexvqa", "arm": "images", "train_seconds": 45.0, "steps": 9, "questions": 22}
    result = {
        "runs": [{**trained, "accuracy": 31.8, "both_ways_accuracy": None}],
        "majority": [{"dataset": "rexvqa", "questions": 22, "accuracy": 22.7}],
        "failed": [{"dataset": "rexvqa", "arm": "blank", "error": "python -m training_recipes.sft ... exited 1"}],
    }

    def run(name: str, command: list[str], timeout: float) -> kit.Outcome:
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "result.json").write_text(json.dumps(result))
        return kit.Outcome("failed", 50.0, 1, "1 arm failed")

    monkeypatch.setattr(runner, "run", run)
    kit.step_signal(runner, {"step": "signal"})
    rows = {r["name"]: r for r in runner.rows}
    assert rows["rexvqa images"]["status"] == "ok" and rows["rexvqa images"]["accuracy"] == 31.8
    assert rows["rexvqa blank"]["status"] == "failed" and "exited 1" in rows["rexvqa blank"]["error"]
    assert rows["rexvqa majority baseline"]["accuracy"] == 22.7
    assert rows["learning signal"]["status"] == "failed"


def test_a_worker_that_saves_nothing_is_not_read_for_what_an_earlier_call_left(tmp_path, monkeypatch):
    """A part runs again on a warm machine in the same work folder: a worker that dies before saving must not
    be credited with the last call's figures."""
    plan = kit.load_plan(tiny=True)
    runner = kit.Kit(plan, "x", tmp_path / "out", tmp_path / "work", True, kit.time.monotonic() + 60)
    runner.logs.mkdir(parents=True)
    (runner.logs / "loop.json").write_text(json.dumps({"steps": 60, "losses": [1.0, 0.5]}))
    monkeypatch.setattr(kit, "worker_command", lambda *_: [sys.executable, "-c", "raise SystemExit(3)"])
    outcome, _, measured = runner.run_worker("loop", 30)
    assert outcome.status == "failed" and measured == {}


def test_the_environment_row_checks_the_projects_own_requirements():
    """The machine runs the checkout, never an installed copy: pyproject's requirements (torchdata for the
    recipes' stateful loader, say) are checked there as the carried wheels' are."""
    from benchmarks.gpu import environment

    lines = environment.project_requirements()
    assert any(line.startswith("torchdata") for line in lines) and any(line.startswith("datasets") for line in lines)
    assert environment.unmet("cxr-vqa", ["no-such-package-here>=1", "pytest>=1"]) == [
        "cxr-vqa needs no-such-package-here>=1 (have none)"
    ]


def test_the_carried_qwen25vl_3b_config_has_the_published_size():
    """benchmarks/models/qwen2.5-vl-3b.json builds Qwen2.5-VL-3B's 3.75 B parameters (on the meta device: no memory)."""
    from benchmarks import train_throughput
    from builders.pixel_budget import PixelBudget

    preset = train_throughput.model_preset(train_throughput.MODELS["qwen2.5-vl-3b"])
    model, _ = train_throughput.build_model_and_processor(preset, PixelBudget(3136, 1003520), "sdpa", "meta")
    language, vision, embeddings = train_throughput.count_parameters(model)
    assert round((language + vision + embeddings) / 1e9, 2) == 3.75
    assert round(vision / 1e6) == 669 and embeddings == 151936 * 2048


def test_tiny_runs_in_its_own_work_folder(tmp_path, monkeypatch):
    """`--tiny` and the full plan never share builds by default: a smoke test cannot become the measured data."""
    works = []

    def record_work(plan, part, out, work, tiny):
        works.append((work, tiny, plan["data"]["gemex_images"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("")
        return []

    monkeypatch.setattr(kit, "run_part", record_work)
    assert kit.main(["--part", "1", "--tiny", "--out", str(tmp_path / "a")]) == 0
    assert kit.main(["--part", "1", "--out", str(tmp_path / "b")]) == 0
    assert kit.main(["--part", "1", "--tiny", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "c")]) == 0
    (tiny_work, _, tiny_images), (full_work, _, full_images), (chosen, _, _) = works
    assert tiny_work != full_work and tiny_images < full_images and chosen == tmp_path / "w"


def test_a_build_is_reused_only_for_the_plan_it_was_made_for(tmp_path):
    """A tiny run's builds left in the work folder, then a plan asking for more images: the GEMeX build is made
    again for it (the ReXVQA one, unchanged in that plan, is reused), never measured as it is."""
    plan = kit.load_plan(tiny=True)
    plan["data"] = {**plan["data"], "gemex_images": 8, "rexvqa_studies": 8}
    rows = kit.run_part(
        {**plan, "parts": {"d": [{"step": "data"}]}}, "d", tmp_path / "out", tmp_path / "work", tiny=True
    )
    assert [r["status"] for r in rows if r["bench"] == "data"] == ["ok"] * 4
    gemex = tmp_path / "work" / "built" / "gemex"
    assert kit.reuse_mismatch(gemex, kit.data_plan(plan, "gemex")) is None

    larger = {**plan, "data": {**plan["data"], "gemex_images": 10}}
    assert "scale 8, the plan 10" in kit.reuse_mismatch(gemex, kit.data_plan(larger, "gemex"))
    resized = {**plan, "data": {**plan["data"], "image_size": 64}}
    assert "image_size None, the plan 64" in kit.reuse_mismatch(gemex, kit.data_plan(resized, "gemex"))
    shared = {**plan, "data": {**plan["data"], "shard_layout": "shared"}}
    assert "shard_layout 'auto', the plan 'shared'" in kit.reuse_mismatch(gemex, kit.data_plan(shared, "gemex"))

    rows = kit.run_part(
        {**larger, "parts": {"d": [{"step": "data"}]}}, "d", tmp_path / "out", tmp_path / "work", tiny=True
    )
    data = [r for r in rows if r["bench"] == "data"]
    assert [(r["name"], r["status"]) for r in data] == [
        ("gemex synthesize", "ok"),
        ("gemex build", "ok"),
        ("rexvqa build", "ok"),
    ]
    assert (
        "scale 8, the plan 10" in data[0]["rebuilt_because"]
        and data[2]["note"] == "already built on this machine for this plan"
    )
    report = json.loads((gemex / "build_report.json").read_text())
    assert sum(report["images"].values()) == 10 and kit.reuse_mismatch(gemex, kit.data_plan(larger, "gemex")) is None

    (gemex / "build_report.json").write_text(json.dumps({**report, "rows_written": 1}))  # a build changed by hand
    assert kit.reuse_mismatch(gemex, kit.data_plan(larger, "gemex")) == "the build there changed after the kit made it"


@pytest.mark.slow
def test_the_layout_race_trains_the_same_questions_both_ways_and_scores_the_same_held_back_ones(tmp_path):
    """B.6 on CPU: per question and per image from the same random weights, one epoch each of the same
    images' questions, each model's loss on the same held-back questions."""
    plan = kit.load_plan(tiny=True)
    plan["parts"] = {"x": [{"step": "data"}, {"step": "layouts"}]}
    rows = kit.run_part(plan, "x", tmp_path / "out", tmp_path / "work", tiny=True)
    race = [r for r in rows if r["bench"] == "B.6"]
    assert [(r["name"], r["status"]) for r in race] == [("per_question", "ok"), ("per_image", "ok")], race
    per_question, per_image = race
    assert per_question["images"] == per_image["images"] == plan["layout_race"]["images"]
    assert per_question["questions"] == per_image["questions"] == per_question["rows"] > per_image["rows"]
    for row in race:
        batch_size = plan["layout_race"]["batch_size"][row["layout"]]
        assert row["steps"] == -(-row["rows"] // batch_size) and row["batch_size"] == batch_size
        assert row["held_back_questions"] == per_question["held_back_questions"] > 0
        assert 0 < row["held_back_loss"] < 100 and row["train_seconds"] > 0
    assert "B.6 Per question or per image" in (tmp_path / "out" / "results.md").read_text()
