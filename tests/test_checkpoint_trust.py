"""Checkpoints `--resume_from_checkpoint auto` can trust, against what a shared `--output_dir`, a kill
during a save, rotation, model-only saves, deleted or truncated files and another number of processes
leave behind: `auto` passes over each checkpoint it cannot trust, one line saying why, and the run
ends with the weights of an uninterrupted run (largest difference <= 1e-6); a checkpoint of another
number of processes stops the run.

Tiny Gemma 3, float32 on CPU, a constant learning rate (so a run of 4 steps is the first 4 steps of a
run of 6). Runs A (learning rate 1e-2) and B (5e-3) write checkpoints every 2 steps; the runs killed
inside a save are real processes (`tests/row_recorder.py`), the others run here through `sft.main`."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytestmark = pytest.mark.slow

from safetensors.torch import load_file  # noqa: E402

from training_recipes import sft  # noqa: E402
from training_recipes.runtime import checkpoints  # noqa: E402

from . import tiny_models  # noqa: E402
from .row_recorder import recorded_process as process  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LR_A, LR_B = "1e-2", "5e-3"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_models.save_tiny_vlm("gemma3", tmp_path_factory.mktemp("trust-model"))


def command(gemex: Path, model: Path, output_dir: Path, learning_rate: str, max_steps: int, *extra: str) -> list[str]:
    return [
        *("--gemex_path", str(gemex), "--max_train_samples", "8", "--model_name_or_path", str(model)),
        *("--output_dir", str(output_dir), "--per_device_train_batch_size", "2", "--max_steps", str(max_steps)),
        *("--save_strategy", "steps", "--save_steps", "2", "--learning_rate", learning_rate),
        *("--lr_scheduler_type", "constant", "--seed", "0", "--bf16", "false", "--use_cpu", "true"),
        *("--dtype", "float32", "--gradient_checkpointing", "false", "--dataloader_num_workers", "0"),
        *("--report_to", "none", "--disable_tqdm", "true"),
        *extra,
    ]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def largest_difference(a: Path, b: Path) -> float:
    expected, got = weights(a), weights(b)
    assert expected.keys() == got.keys()
    return max(float((expected[k] - got[k]).abs().max()) for k in expected)


@pytest.fixture(scope="module")
def runs(gemex_embed_112, model, tmp_path_factory) -> dict[str, Path]:
    """Run A (6 steps), run B (6), and the runs of B killed inside a save
    (all the killed ones started at once): into a copy of A's folder without its checkpoint-6, killed
    after checkpoint-4's weights (a torn re-save of a marked folder); and with `--save_total_limit 1`,
    killed after the Trainer's save of checkpoint-4, before the recipe's `on_save`."""
    root = tmp_path_factory.mktemp("trust")
    sft.main(command(gemex_embed_112, model, root / "A", LR_A, 6))
    torn, rotated = root / "torn", root / "rotated"
    shutil.copytree(root / "A", torn)
    shutil.rmtree(torn / "checkpoint-6")
    killed = {
        torn: process(
            command(gemex_embed_112, model, torn, LR_B, 6), root / "torn-log", KILL_IN_SAVE="4:before_optimizer"
        ),
        rotated: process(
            command(gemex_embed_112, model, rotated, LR_B, 6, "--save_total_limit", "1"),
            root / "rotated-log",
            KILL_IN_SAVE="4:before_callbacks",
        ),
    }
    sft.main(command(gemex_embed_112, model, root / "B-whole", LR_B, 6))
    for folder, killed_process in killed.items():
        _, err = killed_process.communicate(timeout=600)
        assert killed_process.returncode == -signal.SIGKILL, (folder.name, err[-3000:])
    return {"A": root / "A", "B-whole": root / "B-whole", "torn": torn, "rotated": rotated}


def resumed(gemex: Path, model: Path, output_dir: Path, learning_rate: str, max_steps: int, *extra: str):
    return sft.main(
        command(gemex, model, output_dir, learning_rate, max_steps, "--resume_from_checkpoint", "auto", *extra)
    )


def test_auto_passes_over_another_runs_checkpoint(runs, gemex_embed_112, model, tmp_path, capsys):
    """Run B, 4 steps into run A's folder, resumed to 6: from B's checkpoint-4, not A's checkpoint-6."""
    shared = tmp_path / "shared"
    shutil.copytree(runs["A"], shared)
    sft.main(command(gemex_embed_112, model, shared, LR_B, 4))
    capsys.readouterr()
    trainer = resumed(gemex_embed_112, model, shared, LR_B, 6)
    err = capsys.readouterr().err
    assert (
        f"resume: passing over {shared / 'checkpoint-6'}: written by another run (learning_rate 0.01 -> 0.005)" in err
    )
    assert f"resume: from {shared / 'checkpoint-4'} (step 4)" in err
    assert trainer.state.global_step == 6
    assert largest_difference(runs["B-whole"], shared) <= 1e-6
    with pytest.raises(SystemExit, match="checkpoint-6: written by another run"):
        checkpoints.resume_checkpoint(str(runs["A"] / "checkpoint-6"), str(shared), trainer_identity(trainer))


def trainer_identity(trainer) -> checkpoints.RunIdentity:
    callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, checkpoints.Checkpointing))
    return callback.identity


def test_a_torn_resave_of_a_marked_folder_is_passed_over(runs, gemex_embed_112, model, capsys):
    """B killed inside its save of checkpoint-4 (B's weights, A's optimizer and A's marker before it)."""
    torn = runs["torn"]
    assert not (torn / "checkpoint-4" / checkpoints.COMPLETE).exists()
    trainer = resumed(gemex_embed_112, model, torn, LR_B, 6)
    err = capsys.readouterr().err
    assert f"resume: passing over {torn / 'checkpoint-4'}: no completion marker" in err
    assert f"resume: from {torn / 'checkpoint-2'} (step 2)" in err
    assert trainer.state.global_step == 6
    assert largest_difference(runs["B-whole"], torn) <= 1e-6


def test_rotation_keeps_the_last_complete_checkpoint_until_the_new_one_is_marked(runs, gemex_embed_112, model, capsys):
    rotated = runs["rotated"]
    assert (rotated / "checkpoint-2" / checkpoints.COMPLETE).is_file()
    trainer = resumed(gemex_embed_112, model, rotated, LR_B, 6, "--save_total_limit", "1")
    assert f"resume: from {rotated / 'checkpoint-2'} (step 2)" in capsys.readouterr().err
    assert trainer.state.global_step == 6
    assert largest_difference(runs["B-whole"], rotated) <= 1e-6
    assert sorted(p.name for p in rotated.glob("checkpoint-*")) == ["checkpoint-6"]  # the limit still holds


def test_deleted_and_truncated_files_send_auto_back_to_a_checkpoint_that_loads(
    runs, gemex_embed_112, model, tmp_path, capsys
):
    """Checkpoint-6 without its optimizer, checkpoint-4 with its weights cut short: from checkpoint-2."""
    damaged = tmp_path / "damaged"
    shutil.copytree(runs["A"], damaged)
    (damaged / "checkpoint-6" / "optimizer.pt").unlink()
    weights_file = damaged / "checkpoint-4" / "model.safetensors"
    size = weights_file.stat().st_size
    with weights_file.open("r+b") as f:
        f.truncate(size // 2)
    rng = damaged / "checkpoint-2" / "rng_state.pth"
    trainer = resumed(gemex_embed_112, model, damaged, LR_A, 6)
    err = capsys.readouterr().err
    assert f"resume: passing over {damaged / 'checkpoint-6'}: " in err and "optimizer.pt is missing" in err
    assert (
        f"resume: passing over {damaged / 'checkpoint-4'}: model.safetensors holds {size // 2} bytes, "
        f"the marker vouches for {size}" in err
    )
    assert f"resume: from {damaged / 'checkpoint-2'} (step 2)" in err and rng.is_file()
    assert trainer.state.global_step == 6
    assert largest_difference(runs["A"], damaged) <= 1e-6


def test_a_file_changed_in_place_is_not_the_one_the_marker_vouches_for(runs, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(runs["A"] / "checkpoint-6", changed / "checkpoint-6")
    rng = changed / "checkpoint-6" / "rng_state.pth"
    content = bytearray(rng.read_bytes())
    content[-1] ^= 0xFF
    rng.write_bytes(bytes(content))
    marker = checkpoints.read_marker(changed / "checkpoint-6")
    identity = checkpoints.RunIdentity(run=marker["run"], world_size=1)
    assert checkpoints.distrust(changed / "checkpoint-6", identity) == (
        "rng_state.pth is not the file the marker vouches for (SHA-256 differs)"
    )


def test_model_only_checkpoints_are_not_marked_and_auto_starts_afresh(runs, gemex_embed_112, model, tmp_path, capsys):
    only_model = tmp_path / "only-model"
    sft.main(command(gemex_embed_112, model, only_model, LR_B, 4, "--save_only_model", "true"))
    err = capsys.readouterr().err
    assert f"{only_model / 'checkpoint-2'}: not marked complete, a resume needs optimizer.pt, scheduler.pt" in err
    assert not list(only_model.glob("checkpoint-*/" + checkpoints.COMPLETE))
    trainer = resumed(gemex_embed_112, model, only_model, LR_B, 4, "--save_only_model", "true")
    err = capsys.readouterr().err
    assert f"resume: passing over {only_model / 'checkpoint-4'}: no completion marker" in err
    assert "starting from step 0" in err and trainer.state.global_step == 4
    assert largest_difference(runs["B-whole"] / "checkpoint-4", only_model) <= 1e-6  # B's weights after 4 steps
