"""Runs a lab can leave overnight: a recipe run killed with SIGKILL between two checkpoints and
started again with `--resume_from_checkpoint auto` ends with the weights of an uninterrupted run and
trains the same rows in the same order after the checkpoint, in each layout (one question a row
with length-grouped batches, one conversation per image, a stream, the GEMeX + ReXVQA mixture); a
resumed stream does not read again the rows it trained; SIGTERM saves a checkpoint and exits 0;
a checkpoint torn by a kill during its save is never the one `auto` picks.

Tiny Gemma 3 (tests/tiny_models.py), float32 on CPU, fixed seed; the killed runs are real
processes (`tests/row_recorder.py` around `training_recipes/sft.py`), the uninterrupted and
resumed runs run here through `sft.main`, the same entry point."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import chain
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("torchdata")
pytestmark = pytest.mark.slow

from safetensors.torch import load_file  # noqa: E402

from builders.assembly import shards  # noqa: E402
from builders.assembly.settings import BuildSettings  # noqa: E402
from gemex_dataset.build import build_gemex  # noqa: E402
from rexvqa_dataset.build import build_rexvqa  # noqa: E402
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa  # noqa: E402
from training_recipes import sft  # noqa: E402
from training_recipes.runtime import checkpoints  # noqa: E402

from . import row_recorder, tiny_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONVERSATION_TOKENS = 300
MAX_STEPS, SAVE_STEPS, KILL_AT = 8, 4, 6
"""Killed at the end of step 6, between checkpoints 4 and 8; resumed from checkpoint 4."""
MICRO_BATCHES_PER_STEP = 2


@pytest.fixture(scope="module")
def builds(gemex_release, tmp_path_factory) -> dict[str, Path]:
    """GEMeX and ReXVQA built by the real builders, with row groups of two images, so that a
    stream of them has several shards (a full build's groups hold 256 images)."""
    root = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards, "IMAGES_PER_GROUP", 2)
        build_gemex(
            BuildSettings(
                source=gemex_release.root / "per_type",
                out=root / "gemex",
                images=gemex_release.image_root,
                image_mode="embed",
                image_size=112,
                conversation_tokens=CONVERSATION_TOKENS,
            )
        )
        release = generate_rexvqa(root / "release", num_studies=12, seed=5)
        build_rexvqa(
            BuildSettings(
                source=release.root,
                out=root / "rexvqa",
                image_mode="embed",
                image_size=112,
                conversation_tokens=CONVERSATION_TOKENS,
            )
        )
    return {
        "gemex": root / "gemex",
        "rexvqa": root / "rexvqa",
        "model": tiny_models.save_tiny_vlm("gemma3", root / "model"),
    }


def layout_arguments(layout: str, builds: dict[str, Path]) -> list[str]:
    gemex, rexvqa = ["--gemex_path", str(builds["gemex"])], ["--rexvqa_path", str(builds["rexvqa"])]
    return {
        "per question, length-grouped": [
            *gemex,
            "--max_train_samples",
            "12",
            "--train_sampling_strategy",
            "group_by_length",
        ],
        "per image": [*gemex, "--layout", "per_image", "--max_train_samples", "10"],
        "stream": [*gemex, "--streaming"],
        "mixture": [*gemex, *rexvqa, "--rexvqa_weight", "2"],
    }[layout]


def command(layout: str, builds: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    return [
        *layout_arguments(layout, builds),
        "--model_name_or_path",
        str(builds["model"]),
        "--output_dir",
        str(output_dir),
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        str(MICRO_BATCHES_PER_STEP),
        "--max_steps",
        str(MAX_STEPS),
        "--save_strategy",
        "steps",
        "--save_steps",
        str(SAVE_STEPS),
        "--learning_rate",
        "1e-2",
        "--lr_scheduler_type",
        "cosine",
        "--logging_steps",
        "1",
        "--seed",
        "0",
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--dtype",
        "float32",
        "--gradient_checkpointing",
        "false",
        "--dataloader_num_workers",
        "0",
        "--report_to",
        "none",
        *extra,
    ]


def recorded_run(argv: list[str], log_dir: Path, monkeypatch):
    """`sft.main(argv)` here, recorded as `row_recorder.py` records a process."""
    with monkeypatch.context() as patch:
        row_recorder.install(log_dir, patch=patch.setattr)
        return sft.main(argv)


def saved_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "model.safetensors")


LAYOUTS = ["per question, length-grouped", "per image", "stream", "mixture"]


PREEMPTED = "preempted"
"""A run sent SIGTERM twice mid-training, started beside the killed ones."""


@pytest.fixture(scope="module")
def killed_runs(builds, tmp_path_factory) -> dict[str, Path]:
    """Each layout's run, killed with SIGKILL at the end of step `KILL_AT`, and a stream sent SIGTERM
    twice in quick succession once it has trained a few steps (all started at once)."""
    root = tmp_path_factory.mktemp("killed")
    started = {
        layout: row_recorder.recorded_process(
            command(layout, builds, root / str(i)), root / f"{i}-log", KILL_AT_STEP=str(KILL_AT)
        )
        for i, layout in enumerate(LAYOUTS)
    }
    preempted = row_recorder.recorded_process(
        command("stream", builds, root / PREEMPTED, "--max_steps", "200", "--save_steps", "1000"),
        root / f"{PREEMPTED}-log",
    )
    while (
        len(row_recorder.batches(root / f"{PREEMPTED}-log")) < 3 * MICRO_BATCHES_PER_STEP and preempted.poll() is None
    ):
        time.sleep(0.05)
    preempted.send_signal(signal.SIGTERM)
    time.sleep(0.01)
    preempted.send_signal(signal.SIGTERM)
    out, err = preempted.communicate(timeout=300)
    (root / f"{PREEMPTED}.out").write_text(out)
    assert preempted.returncode == 0, err[-3000:]
    for layout, process in started.items():
        _, err = process.communicate(timeout=300)
        assert process.returncode == -signal.SIGKILL, (layout, err[-3000:])
    return {PREEMPTED: root / PREEMPTED} | {layout: root / str(i) for i, layout in enumerate(LAYOUTS)}


def test_sigterm_saves_the_current_step_exits_0_and_resumes_from_there(
    builds, killed_runs, tmp_path, monkeypatch, capsys
):
    """The stop is at the end of a step, past the first three; the checkpoint is complete and a
    torn one beside it (a kill during a later save) is passed over by `auto`."""
    output_dir = killed_runs[PREEMPTED]
    lines = (output_dir.parent / f"{PREEMPTED}.out").read_text().splitlines()
    saved = list(output_dir.glob("checkpoint-*"))
    assert len(saved) == 1 and (saved[0] / checkpoints.COMPLETE).is_file()
    step = checkpoints.checkpoint_step(saved[0])
    assert 3 <= step < 200 and not (output_dir / "model.safetensors").exists()  # stopped, not finished
    assert (
        [line for line in lines if "SIGTERM" in line]
        == lines[-1:]
        == [
            f"SIGTERM: saved {saved[0]} at step {step}; run the same command with --resume_from_checkpoint auto to go on"
        ]
    )

    torn = output_dir / f"checkpoint-{step + 1}"
    torn.mkdir()
    shutil.copy(saved[0] / "model.safetensors", torn)  # the weights written, the rest not yet
    resumed = recorded_run(
        command("stream", builds, output_dir, "--max_steps", str(step + 2), "--resume_from_checkpoint", "auto"),
        tmp_path / "log",
        monkeypatch,
    )
    assert resumed.state.global_step == step + 2
    assert f"resume: from {saved[0]} (step {step})" in capsys.readouterr().err
    trained = row_recorder.batches(output_dir.parent / f"{PREEMPTED}-log")[: step * MICRO_BATCHES_PER_STEP]
    assert not set(chain(*trained)) & set(chain(*row_recorder.batches(tmp_path / "log")))  # no row of the stream again


def test_auto_without_a_checkpoint_starts_fresh_and_a_wrong_path_stops(tmp_path, capsys):
    identity = checkpoints.RunIdentity(run={}, world_size=1)
    assert checkpoints.resume_checkpoint("auto", str(tmp_path / "new"), identity) is None
    assert "no complete checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not a checkpoint folder"):
        checkpoints.resume_checkpoint(str(tmp_path), str(tmp_path), identity)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_killed_run_resumed_with_auto_ends_as_an_uninterrupted_one(
    layout, builds, killed_runs, tmp_path, monkeypatch, capsys
):
    killed = killed_runs[layout]
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == [f"checkpoint-{SAVE_STEPS}"]
    assert (killed / f"checkpoint-{SAVE_STEPS}" / checkpoints.COMPLETE).is_file()

    whole = recorded_run(command(layout, builds, tmp_path / "whole"), tmp_path / "whole-log", monkeypatch)
    resumed = recorded_run(
        command(layout, builds, killed, "--resume_from_checkpoint", "auto"), tmp_path / "resumed-log", monkeypatch
    )
    assert f"resume: from {killed / f'checkpoint-{SAVE_STEPS}'} (step {SAVE_STEPS})" in capsys.readouterr().err
    assert resumed.state.global_step == whole.state.global_step == MAX_STEPS

    expected, got = saved_weights(tmp_path / "whole"), saved_weights(killed)
    assert expected.keys() == got.keys()
    assert max(float((expected[k] - got[k]).abs().max()) for k in expected) <= 1e-6
    assert (
        max(float((expected[k] - saved_weights(killed / f"checkpoint-{SAVE_STEPS}")[k]).abs().max()) for k in expected)
        > 1e-4
    )

    # after the checkpoint, the rows of the uninterrupted run's last steps, in the same order (no step
    # trained twice, none left out); before it, the killed run had trained that run's first rows
    trained, again = row_recorder.batches(tmp_path / "whole-log"), row_recorder.batches(tmp_path / "resumed-log")
    assert again == trained[len(trained) - len(again) :]
    assert len(trained) - len(again) == micro_batches(layout, SAVE_STEPS)
    before_kill = row_recorder.batches(killed.parent / f"{LAYOUTS.index(layout)}-log")
    assert len(before_kill) >= micro_batches(layout, KILL_AT) and before_kill == trained[: len(before_kill)]


def micro_batches(layout: str, steps: int) -> int:
    """Micro-batches of `steps` optimizer steps; an epoch of a map-style split ends with a short step."""
    rows = {"per question, length-grouped": 12, "per image": 10}.get(layout)
    if rows is None:  # a stream: no epoch ends in these runs
        return steps * MICRO_BATCHES_PER_STEP
    per_epoch = -(-rows // 2)
    steps_per_epoch = -(-per_epoch // MICRO_BATCHES_PER_STEP)
    epochs, rest = divmod(steps, steps_per_epoch)
    return epochs * per_epoch + rest * MICRO_BATCHES_PER_STEP


def launched(runs: list[list[str]], log_dir: Path, processes: int = 2) -> None:
    """`accelerate launch --multi_gpu --num_processes N` of `row_recorder.py` with the recipe's `--use_cpu true`:
    N processes on CPU over gloo, the runs one after another. (`accelerate launch --num_processes N --cpu`
    starts one process: accelerate's `--cpu` takes its simple launcher, which needs mpirun for more.)"""
    argv = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "0",
        str(ROOT / "tests" / "row_recorder.py"),
        *chain(*[[*run, "::"] for run in runs]),
    ][:-1]
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ROW_LOG": str(log_dir),
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    (log_dir / "stderr.txt").write_text(done.stderr)


MULTI_PROCESS = {
    "GEMeX, map-style": ["--max_train_samples", "24", "--num_train_epochs", "1"],
    "GEMeX, streamed": ["--streaming", "--max_steps", "4", "--dataloader_num_workers", "1"],
    "mixture": ["--rexvqa_path", "{rexvqa}", "--max_steps", "4"],
    "mixture, streamed": ["--rexvqa_path", "{rexvqa}", "--streaming", "--max_steps", "4"],
    # each process's pass (its own shards, of different row counts) ends on a different micro-batch, one
    # of them odd: without whole steps a partial accumulation group there leaves the all-reduces unpaired
    "GEMeX, streamed, passes of uneven length": [
        *("--streaming", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2"),
        *("--max_steps", "45", "--logging_steps", "50"),
    ],
}


@pytest.fixture(scope="module")
def two_processes(builds, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("two-processes")
    common = [
        "--gemex_path",
        str(builds["gemex"]),
        "--model_name_or_path",
        str(builds["model"]),
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--seed",
        "0",
        "--save_strategy",
        "no",
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--dtype",
        "float32",
        "--gradient_checkpointing",
        "false",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    ]
    runs = [
        [*common, *(a.format(rexvqa=builds["rexvqa"]) for a in arguments), "--output_dir", str(root / f"run-{i}")]
        for i, arguments in enumerate(MULTI_PROCESS.values())
    ]
    launched(runs, root)
    return root


def stored_ids(folder: Path) -> list[str]:
    from datasets import load_dataset

    return list(load_dataset(str(folder), split="train")["question_id"])


@pytest.mark.parametrize("run", list(MULTI_PROCESS))
def test_two_processes_train_disjoint_rows_each_prepared_and_read_by_its_own_process(run, builds, two_processes):
    log = two_processes / str(list(MULTI_PROCESS).index(run))
    trained = [list(chain(*row_recorder.batches(log, rank))) for rank in (0, 1)]
    assert trained[0] and trained[1]
    assert not set(trained[0]) & set(trained[1])
    for rank in (0, 1):  # batches collated and images decoded by this process (or its loader worker), never the other
        batches = row_recorder.events(log, rank, "batch")
        decoders = {e["pid"] for e in row_recorder.events(log, rank, "decoded")}
        assert decoders and decoders <= {e["pid"] for e in batches}
    mains = [
        {e["ppid"] if run == "GEMeX, streamed" else e["pid"] for e in row_recorder.events(log, rank, "batch")}
        for rank in (0, 1)
    ]
    assert len(mains[0]) == len(mains[1]) == 1 and mains[0] != mains[1]

    rows = stored_ids(builds["gemex"]) + (stored_ids(builds["rexvqa"]) if "mixture" in run else [])
    if run == "GEMeX, map-style":  # one epoch: every row once, the two halves evened out by repeating at most one batch
        assert set(trained[0]) | set(trained[1]) == set(rows[:24]) and len(trained[0]) == len(trained[1]) == 12
    else:  # a stream: each process reads its own shards, about half the rows, not all of them
        read = [{"+".join(e["ids"]) for e in row_recorder.events(log, rank, "read")} for rank in (0, 1)]
        # about half each, none read by both; the halves differ by a shard or two (a shard here is a row
        # group of two images' questions, a few percent of this tiny build; of a full build, 256 images' of 150,000)
        assert not read[0] & read[1] and max(len(read[0]), len(read[1])) <= 0.6 * len(rows), (
            len(read[0]),
            len(read[1]),
            len(rows),
        )
    if "streamed" in run:
        assert "stream: " in (two_processes / "stderr.txt").read_text()


def test_two_streaming_processes_whose_passes_end_apart_go_on_in_step(two_processes):
    """The uneven run: each process's pass holds another number of rows, one of them odd (a micro-batch
    of one row, two a step), and both passed their end; the launch ended (exit 0) rather than hanging."""
    log = two_processes / str(list(MULTI_PROCESS).index("GEMeX, streamed, passes of uneven length"))
    rows = [len({"+".join(e["ids"]) for e in row_recorder.events(log, rank, "read")}) for rank in (0, 1)]
    assert rows[0] != rows[1] and any(n % 2 for n in rows), rows
    for rank in (0, 1):
        assert len(row_recorder.batches(log, rank)) >= 90 > rows[rank]  # 45 steps of 2: past the end of a pass
