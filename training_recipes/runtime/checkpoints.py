"""Checkpoints a resume can trust: the completion marker, and which checkpoint `auto` takes.

A checkpoint is trusted only when its marker (`COMPLETE`) says which run wrote it (`RunIdentity`:
model, data and layout, the hyper-parameters that shape the trajectory, and the number of
processes) and vouches for every file a resume reads, by size and SHA-256. The marker is written
last, atomically, once every process has saved its part and only when the folder holds all a resume
needs (weights, optimizer, scheduler, each process's RNG state and, for a stream, each process's
data loader state); it is removed before the folder is saved again, so a save that does not finish
never leaves a marker over a folder that mixes two saves.

`resume_checkpoint(AUTO, ...)` walks the checkpoints newest first and takes the first that is
marked, written by this run, and holds the bytes its marker vouches for, saying in one line why each
newer one was passed over; one written by another number of processes stops the run (its loader
and RNG states are per process). `max_steps` and `num_train_epochs` are not part of the identity: a
run may be resumed to train longer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

COMPLETE = "checkpoint_complete.json"
STREAM_STATE = "stream_state_{rank}.pt"
"""Each process's data loader state in a checkpoint of a streamed run."""
AUTO = "auto"
MARKER_FORMAT = 2

HYPER_PARAMETERS = (
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim",
    "optim_args",
    "max_grad_norm",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
    "data_seed",
    "train_sampling_strategy",
    "bf16",
    "fp16",
    "max_length",
    "packing",
    "assistant_only_loss",
    "completion_only_loss",
    "neftune_noise_alpha",
    "label_smoothing_factor",
)
"""Training arguments that shape what a step does; a checkpoint written under other values is another run's."""
MODEL_FIELDS = (
    "model_name_or_path",
    "model_revision",
    "dtype",
    "use_peft",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "freeze_vision_tower",
)
DATA_FIELDS = (
    "gemex_config",
    "rexvqa_config",
    "gemex_weight",
    "rexvqa_weight",
    "train_split",
    "max_train_samples",
    "streaming",
    "box_convention",
    "layout",
    "reply",
    "fold_system_prompt",
    "max_pixels",
    "min_pixels",
)

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
WEIGHTS_FOLDER_PREFIX = "pytorch_model_fsdp"
"""FSDP's sharded weights (`SHARDED_STATE_DICT`) are a folder per model; its optimizer, `optimizer_0`."""


class CheckpointRefused(SystemExit):
    """A checkpoint the run must not go on from, and why (one line)."""


def checkpoint_step(folder: Path) -> int | None:
    match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", folder.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The folders named like checkpoints in `output_dir`, newest (highest step) first."""
    root = Path(output_dir)
    found = [f for f in root.iterdir() if f.is_dir() and checkpoint_step(f) is not None] if root.is_dir() else []
    return sorted(found, key=checkpoint_step, reverse=True)


def folder_contents(path: str) -> str | None:
    """A short digest of a local dataset folder's file names and sizes (a rebuild changes it); None for a Hub id."""
    root = Path(path)
    if not root.is_dir():
        return None
    listing = sorted(
        (str(f.relative_to(root)), f.stat().st_size)
        for f in root.rglob("*")
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts)
    )
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunIdentity:
    """Which run writes a checkpoint: `run` (model, data, layout, hyper-parameters) and `world_size`."""

    run: dict
    world_size: int

    @classmethod
    def of(cls, data_args, training_args, model_args) -> RunIdentity:
        def picked(source, names):
            return {name: getattr(source, name) for name in names if hasattr(source, name)}

        data = picked(data_args, DATA_FIELDS)
        for name in ("gemex", "rexvqa"):
            path = getattr(data_args, f"{name}_path")
            data[f"{name}_path"] = None if path is None else source(path)
            data[f"{name}_files"] = None if path is None else folder_contents(path)
        run = {
            "model": picked(model_args, MODEL_FIELDS),
            "data": data,
            "hyper_parameters": picked(training_args, HYPER_PARAMETERS),
        }
        return cls(run=json.loads(json.dumps(run, default=str)), world_size=training_args.world_size)


def source(path: str) -> str:
    """A local path made absolute (the same folder from any working directory); a Hub id as given."""
    return os.path.abspath(path) if Path(path).exists() else path


def differences(ours: dict, theirs: dict) -> str | None:
    """`name theirs -> ours` for each value of `ours`'s groups (``{group: {name: value}}``, a marker's `run`)
    that `theirs` holds otherwise, the first three in one line; None when they agree."""
    found = []
    for group, values in ours.items():
        other = theirs.get(group, {})
        for name in sorted(set(values) | set(other)):
            if values.get(name) != other.get(name):
                found.append(f"{name} {other.get(name)!r} -> {values.get(name)!r}")
    return "; ".join(found[:3]) + ("; ..." if len(found) > 3 else "") if found else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
    return digest.hexdigest()


def saved_files(folder: Path) -> list[str]:
    return sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file() and f.name != COMPLETE)


def missing_for_resume(names: list[str], world_size: int, stream: bool) -> list[str]:
    """What of a resume's needs a checkpoint holding `names` lacks (empty: nothing)."""
    present = set(names)
    tops = {name.split("/")[0] for name in names}
    missing = []
    if not (present & set(WEIGHTS) or any(top.startswith(WEIGHTS_FOLDER_PREFIX) for top in tops)):
        missing.append("model weights")
    if "optimizer.pt" not in present and not any(top.startswith("optimizer_0") for top in tops):
        missing.append("optimizer.pt")
    missing += [name for name in ("scheduler.pt", "trainer_state.json") if name not in present]
    ranks = range(world_size)
    rng = ["rng_state.pth"] if world_size == 1 else [f"rng_state_{rank}.pth" for rank in ranks]
    missing += [name for name in rng if name not in present]
    if stream:
        missing += [STREAM_STATE.format(rank=rank) for rank in ranks if STREAM_STATE.format(rank=rank) not in present]
    return missing


def remove_marker(folder: Path) -> None:
    """Before a folder is saved again: it is not complete until the new save is."""
    (folder / COMPLETE).unlink(missing_ok=True)


def write_marker(folder: Path, identity: RunIdentity, global_step: int, stream: bool) -> str | None:
    """Mark `folder` complete, vouching for each of its files; returns why not (a resume's need missing)."""
    names = saved_files(folder)
    missing = missing_for_resume(names, identity.world_size, stream)
    if missing:
        return (
            f"{folder}: not marked complete, a resume needs {', '.join(missing)} (--save_only_model saves weights only)"
        )
    marker = {
        "format": MARKER_FORMAT,
        "global_step": global_step,
        "world_size": identity.world_size,
        "stream": stream,
        "run": identity.run,
        "files": {name: {"size": (folder / name).stat().st_size, "sha256": sha256(folder / name)} for name in names},
    }
    partial = folder / (COMPLETE + ".tmp")
    with partial.open("w") as f:
        json.dump(marker, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, folder / COMPLETE)
    return None


def read_marker(folder: Path) -> dict | None:
    try:
        marker = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def distrust(folder: Path, identity: RunIdentity) -> str | None:
    """Why `folder` cannot be resumed by this run (None: it can). A checkpoint of another number of
    processes raises `CheckpointRefused`, as going back to an older one would hide the change."""
    if not (folder / COMPLETE).is_file():
        return "no completion marker (a save that did not finish, or --save_only_model)"
    marker = read_marker(folder)
    if marker is None or marker.get("format") != MARKER_FORMAT or not isinstance(marker.get("files"), dict):
        return "its marker does not say which run wrote it (an older recipe's, or damaged)"
    if changed := differences(identity.run, marker.get("run", {})):
        return f"written by another run ({changed})"
    files = marker["files"]
    missing = missing_for_resume(list(files), marker.get("world_size", 0), bool(marker.get("stream")))
    if missing:
        return f"its marker vouches for no {', '.join(missing)}"
    for name, vouched in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != vouched["size"]:
            return f"{name} holds {path.stat().st_size} bytes, the marker vouches for {vouched['size']}"
    for name, vouched in files.items():
        if sha256(folder / name) != vouched["sha256"]:
            return f"{name} is not the file the marker vouches for (SHA-256 differs)"
    if marker.get("world_size") != identity.world_size:
        raise CheckpointRefused(
            f"{folder}: written by {marker.get('world_size')} processes, this run has {identity.world_size}; "
            f"resume with {marker.get('world_size')} processes (each resumes its own data and RNG state)"
        )
    return None


def resume_checkpoint(requested: str | None, output_dir: str, identity: RunIdentity) -> str | None:
    """The checkpoint to resume from: `requested` when it can be trusted, or for `auto` the newest that
    can in `output_dir` (a fresh start when there is none); says which, and why others were passed over."""
    if requested is None:
        return None
    if requested != AUTO:
        folder = Path(requested)
        if not (folder / "trainer_state.json").is_file():
            raise CheckpointRefused(
                f"--resume_from_checkpoint {requested}: not a checkpoint folder (no trainer_state.json)"
            )
        reason = distrust(folder, identity)
        if reason is not None:
            raise CheckpointRefused(f"--resume_from_checkpoint {requested}: {reason}")
        return requested
    for folder in checkpoint_folders(output_dir):
        reason = distrust(folder, identity)
        if reason is None:
            print(f"resume: from {folder} (step {checkpoint_step(folder)})", file=sys.stderr)
            return str(folder)
        print(f"resume: passing over {folder}: {reason}", file=sys.stderr)
    print(f"resume: no complete checkpoint of this run in {output_dir}; starting from step 0", file=sys.stderr)
    return None


def rotate(output_dir: str | Path, keep: int | None, newest: Path, best: str | None = None) -> None:
    """`save_total_limit`, applied once `newest` is marked: the `keep` newest complete checkpoints up to
    `newest` stay (and `best`); older folders go, complete or not. Newer folders (another run's) stay."""
    if not keep or keep <= 0:
        return
    step = checkpoint_step(newest)
    older = [f for f in checkpoint_folders(output_dir) if checkpoint_step(f) <= step]
    kept = [f for f in older if (f / COMPLETE).is_file()][:keep]
    protected = {f.resolve() for f in kept} | ({Path(best).resolve()} if best else set())
    for folder in older:
        if folder.resolve() not in protected:
            shutil.rmtree(folder, ignore_errors=True)


def synchronised_barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


class Checkpointing(TrainerCallback):
    """Checkpoints `auto` can trust. Before a save, the folder's marker goes; after it, every process
    adds its data loader state when the data is a stream (a resumed stream reads on from there), and
    once all are done the main process marks the folder (`write_marker`) and only then applies
    `save_total_limit` (`rotate`): the Trainer's own rotation, inside its save, would delete the last
    complete checkpoint before the new one is marked, so the recipe takes the limit off the Trainer."""

    def __init__(self, identity: RunIdentity, stream: bool, save_total_limit: int | None):
        self.identity, self.stream, self.save_total_limit = identity, stream, save_total_limit

    def folder(self, args, state) -> Path:
        return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"

    def unmark_before_save(self, args, state, control, **kwargs):
        if control.should_save and state.is_world_process_zero:
            remove_marker(self.folder(args, state))
        return control

    on_step_end = on_epoch_end = unmark_before_save

    def on_save(self, args, state, control, train_dataloader=None, **kwargs):
        folder = self.folder(args, state)
        if self.stream and train_dataloader is not None:
            torch.save(train_dataloader.state_dict(), folder / STREAM_STATE.format(rank=args.process_index))
        synchronised_barrier()
        if state.is_world_process_zero:
            refused = write_marker(folder, self.identity, state.global_step, self.stream)
            if refused is not None:
                print(refused, file=sys.stderr, flush=True)
            else:
                rotate(args.output_dir, self.save_total_limit, folder, state.best_model_checkpoint)
        return control
