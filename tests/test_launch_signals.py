"""A SIGTERM ends a recipe run in a complete checkpoint and exit status 0 through each launcher the
docs name: `python -m training_recipes.runtime.launch accelerate launch ...` (one process),
`python -m training_recipes.runtime.launch torchrun ...` (two processes, gloo on CPU), and the recipe as the
tasks of an `srun` step (two processes with the variables `srun` gives its tasks, each signalled as
SLURM signals a step's tasks; `srun` itself is not installed here). So does a SIGTERM to `launch` over
`torchrun` before the recipe has imported anything (`tests/sigterm_at_start.py`). A SIGTERM during the final
`save_model` lets it finish (exit 0). A checkpoint written by two processes stops a one-process
resume. All signalled runs start at once; tiny Gemma 3, float32 on CPU."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytestmark = pytest.mark.slow

from training_recipes import sft  # noqa: E402
from training_recipes.runtime import checkpoints, launch  # noqa: E402

from . import row_recorder, tiny_models  # noqa: E402
from .test_checkpoint_trust import command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDER = str(ROOT / "tests" / "row_recorder.py")
AT_START = str(ROOT / "tests" / "sigterm_at_start.py")


def environment(log_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ROW_LOG": str(log_dir),
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def started(argv: list[str], log_dir: Path, **env: str) -> subprocess.Popen:
    log_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        argv, env=environment(log_dir, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


SIGNALLED = ("accelerate launch", "torchrun", "srun tasks", "final save")


@pytest.fixture(scope="module")
def signalled(gemex_embed_112, tmp_path_factory) -> dict[str, dict]:
    """Each launcher's run, sent SIGTERM once it has trained two micro-batches; a `torchrun` run whose
    `launch` is sent SIGTERM as the recipe starts; and a one-process run that sends itself SIGTERM as its
    final `save_model` starts."""
    root = tmp_path_factory.mktemp("signals")
    model = tiny_models.save_tiny_vlm("gemma3", root / "model")

    def recipe(name: str, max_steps: int = 200, *extra: str) -> list[str]:
        return command(gemex_embed_112, model, root / name, "1e-2", max_steps, "--save_steps", "1000", *extra)

    supervisor = [sys.executable, "-m", "training_recipes.runtime.launch"]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1"]
    accelerate += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    port = str(free_port())
    tasks = [
        started(
            [sys.executable, RECORDER, *recipe("srun tasks")],
            root / "srun tasks-log",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_STEP_NUM_TASKS="2",
            SLURM_STEP_TASKS_PER_NODE="2",
            SLURM_STEP_NODELIST="localhost",
            MASTER_PORT=port,
        )
        for rank in (0, 1)
    ]
    runs = {
        "accelerate launch": [
            started([*supervisor, *accelerate, RECORDER, *recipe("accelerate launch")], root / "accelerate launch-log")
        ],
        "torchrun": [started([*supervisor, *torchrun, RECORDER, *recipe("torchrun")], root / "torchrun-log")],
        "torchrun at start": [
            started([*supervisor, *torchrun, AT_START, *recipe("torchrun at start")], root / "torchrun at start-log")
        ],
        "srun tasks": tasks,
        "final save": [
            started(
                [sys.executable, RECORDER, *recipe("final save", 2)], root / "final save-log", SIGTERM_IN_FINAL_SAVE="1"
            )
        ],
    }
    for name in ("accelerate launch", "torchrun", "srun tasks"):
        while len(row_recorder.batches(root / f"{name}-log")) < 2 and all(p.poll() is None for p in runs[name]):
            time.sleep(0.1)
        for p in runs[name]:
            p.send_signal(signal.SIGTERM)
    results = {}
    for name, processes in runs.items():
        outcomes = [p.communicate(timeout=600) for p in processes]
        results[name] = {
            "codes": [p.returncode for p in processes],
            "out": "".join(out for out, _ in outcomes),
            "err": "".join(err for _, err in outcomes),
            "output_dir": root / name,
            "argv": recipe(name),
        }
    return results


def marked_checkpoint(output_dir: Path) -> tuple[Path, dict]:
    saved = list(output_dir.glob("checkpoint-*"))
    assert len(saved) == 1, saved
    return saved[0], json.loads((saved[0] / checkpoints.COMPLETE).read_text())


@pytest.mark.parametrize("name,processes", [("accelerate launch", 1), ("torchrun", 2), ("srun tasks", 2)])
def test_sigterm_through_the_launcher_ends_in_a_complete_checkpoint_and_exit_0(signalled, name, processes):
    run = signalled[name]
    assert run["codes"] == [0] * len(run["codes"]), run["err"][-4000:]
    folder, marker = marked_checkpoint(run["output_dir"])
    assert marker["world_size"] == processes and 1 <= marker["global_step"] < 200
    assert f"SIGTERM: saved {folder} at step {marker['global_step']}" in run["out"]
    assert not (run["output_dir"] / "model.safetensors").exists()  # stopped, not finished
    if name != "srun tasks":
        assert "launch: SIGTERM: SIGTERM to the recipe's processes, waiting for their checkpoint" in run["err"]


def test_sigterm_before_the_recipe_listens_ends_in_a_checkpoint_at_its_first_step_and_exit_0(signalled):
    run = signalled["torchrun at start"]
    assert run["codes"] == [0], run["err"][-4000:]
    folder, marker = marked_checkpoint(run["output_dir"])
    assert marker["world_size"] == 2 and marker["global_step"] == 1
    assert f"SIGTERM: saved {folder} at step 1; run the same command with --resume_from_checkpoint auto" in run["out"]
    assert "launch: SIGTERM: SIGTERM to the recipe's processes, waiting for their checkpoint" in run["err"]


def test_sigterm_during_the_final_save_lets_it_finish(signalled):
    run = signalled["final save"]
    assert run["codes"] == [0], run["err"][-4000:]
    assert (run["output_dir"] / "model.safetensors").is_file()


def test_a_checkpoint_of_two_processes_stops_a_one_process_resume(signalled):
    run = signalled["srun tasks"]
    folder, _ = marked_checkpoint(run["output_dir"])
    with pytest.raises(SystemExit, match=f"{folder}: written by 2 processes, this run has 1; resume with 2 processes"):
        sft.main([*run["argv"], "--resume_from_checkpoint", "auto"])


def test_srun_task_variables_become_torchs():
    task = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }
    assert launch.adopt_slurm_environment(task)
    assert {k: task[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu07",
    }
    assert not launch.adopt_slurm_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"})  # a batch script, not a step
    assert not launch.adopt_slurm_environment({**task, "RANK": "0"} | {"SLURM_PROCID": "0"})  # torchrun inside srun


def test_processes_the_trainer_does_not_see_as_distributed_stop_before_training():
    """What an FSDP config without GPUs gives: two processes, each a world of one (run here:
    `accelerate launch --config_file training_recipes/accelerate/fsdp.yaml --num_processes 2` on CPU)."""
    with pytest.raises(SystemExit, match="launched as 2 processes, but the Trainer sees 1"):
        launch.check_world_size(1, {"WORLD_SIZE": "2"})
    launch.check_world_size(2, {"WORLD_SIZE": "2"})
    launch.check_world_size(1, {})
