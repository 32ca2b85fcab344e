"""Do the pixels reach the model? The training loss of the `images` arm against the `shuffled` arm's.

    python -m benchmarks.training_gap --seed 0 --out runs/training-gap

A reduced learning-signal probe (`benchmarks/learning_signal.py`), in one process: a small GEMeX training
release drawn with `--plain-findings answered`, built with embedded images, its closed-ended rows cut to
as many "Yes." as "No." (`balanced`) and trained as the answer alone (`sft.py --reply answer`), then the probe
model (`benchmarks.probe_model`) trained by `training_recipes.sft` twice from the same weights, on the
same rows in the same order with the same seed: once on the images (`images` arm), once with each image's
pixels swapped for another image's (`shuffled` arm, `benchmarks/probe_arms.py`). The shuffled arm can
memorise each row as well as the images arm (a permutation moves whole images), but only the images arm
can learn the rule "a mark in the region asked about means Yes.", so its loss falls faster.

These settings show it within 200 steps of 16 on one CPU thread: 200 images (about 13 epochs of
their 190-240 balanced rows), learning rate 3e-3 after 10 warm-up steps, and AdamW's `--adam_beta2 0.9`,
with which the images arm leaves the chance level by step ~120. With the Trainer's 0.999 (and 2e-3) it
stays there past step 150 here and to step ~380 in the 3,000-image benchmark: the second moment remembers
the large gradients of the first steps, while the reply's format is learned, and the answer's small
gradient then moves the weights little. Figures for other seeds and settings: docs/benchmarks.md.

What is measured is the trainer's logged training loss: the mean cross-entropy over the completion
tokens (`assistant_only_loss`). With answer-only replies the completion is
``<answer> Yes. <reason>  <location> []`` and the end-of-turn tokens: every token but the answer is the
same in every row and is learned within the first steps in both arms, so after those the gap between
the arms is the answer tokens' loss gap, spread over the completion's length. The figure is the mean of
the last `--tail` logged steps in each arm.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.probe_arms import make_arm
from benchmarks.probe_rows import balanced
from cxr_vqa.options import options_from_command_line

CONFIG = "closed_ended"


@dataclass
class GapSettings:
    seed: int = field(metadata={"help": "changes every image, question, initial weight and batch"})
    out: Path = field(metadata={"help": "the folder for the build, the model, the runs"})
    train_images: int = field(default=200, metadata={"help": "images of the training release"})
    image_size: int = field(default=112, metadata={"help": "the build's --image-size"})
    size: str = field(default="probe", metadata={"help": "probe_model --size of the probe"})
    steps: int = field(default=200, metadata={"help": "training steps of each arm"})
    batch_size: int = field(default=16, metadata={"help": "per-device batch of each arm"})
    learning_rate: float = field(default=3e-3, metadata={"help": "learning rate of each arm"})
    warmup_steps: int = field(default=10, metadata={"help": "linear warm-up steps of each arm"})
    adam_beta2: float = field(
        default=0.9,
        metadata={
            "help": "AdamW's second-moment decay (the Trainer's 0.999 remembers the first steps' large format gradients)"
        },
    )
    tail: int = field(default=30, metadata={"help": "the last logged steps averaged in each arm"})
    threads: int = field(default=1, metadata={"help": "torch threads"})


@dataclass
class ArmLoss:
    arm: str
    rows: int
    steps: int
    seconds: float
    losses: list[float]
    """The logged training loss of every step (completion tokens)."""
    tail_loss: float
    """The mean of the last `tail` steps' losses."""


@dataclass
class Gap:
    images: ArmLoss
    shuffled: ArmLoss

    @property
    def ratio(self) -> float:
        """The images arm's tail loss over the shuffled arm's (below 1: the pixels help)."""
        return self.images.tail_loss / self.shuffled.tail_loss


def cli(args: list[str]) -> None:
    from cxr_vqa.cli import main as cxr_vqa

    if cxr_vqa(args) != 0:
        raise SystemExit(f"cxr-vqa {' '.join(args)} failed")


def training_build(settings: GapSettings) -> Path:
    """The balanced, answer-only closed-ended training build of `settings.train_images` synthetic images."""
    out = settings.out
    raw, build = out / "gemex-raw", out / "gemex"
    if not build.is_dir():
        synthesize = ["--out", str(raw), "--num-images", str(settings.train_images), "--seed", str(settings.seed)]
        cli(["synthesize", "gemex", *synthesize, "--plain-findings", "answered"])
        source = ["--source", str(raw), "--images", str(raw / "files"), "--image-mode", "embed"]
        cli(["build", "gemex", *source, "--out", str(build), "--image-size", str(settings.image_size)])
    return balanced(build, CONFIG, out / "gemex-balanced", settings.seed)


def probe_model(settings: GapSettings) -> Path:
    from benchmarks.probe_model import main as probe_maker

    model = settings.out / f"probe-{settings.size}"
    if not model.is_dir():
        probe_maker(["--size", settings.size, "--seed", str(settings.seed), "--out", str(model)])
    return model


def logged_losses(log_history: list[dict]) -> list[float]:
    """The training loss of each logged step of a `Trainer.state.log_history` (or trainer_state.json's)."""
    return [entry["loss"] for entry in log_history if "loss" in entry and "train_runtime" not in entry]


def train_arm(settings: GapSettings, model: Path, build: Path, arm: str) -> ArmLoss:
    """`sft.py` on one arm's rows, a loss logged every step; nothing saved but the trainer's state."""
    from training_recipes.sft import main as sft

    run_dir = settings.out / f"run-{arm}"
    argv = [
        "--model_name_or_path",
        str(model),
        "--gemex_path",
        str(build),
        "--gemex_config",
        CONFIG,
        "--reply",
        "answer",
    ]
    argv += ["--output_dir", str(run_dir), "--max_steps", str(settings.steps), "--seed", str(settings.seed)]
    argv += ["--per_device_train_batch_size", str(settings.batch_size), "--learning_rate", str(settings.learning_rate)]
    argv += ["--warmup_steps", str(settings.warmup_steps), "--adam_beta2", str(settings.adam_beta2)]
    argv += ["--logging_steps", "1", "--save_strategy", "no"]
    argv += ["--report_to", "none", "--gradient_checkpointing", "false", "--dataloader_num_workers", "0"]
    argv += ["--disable_tqdm", "true"]
    start = time.monotonic()
    trainer = sft(argv)
    seconds = time.monotonic() - start
    trainer.save_state()
    losses = logged_losses(trainer.state.log_history)
    tail = losses[-settings.tail :]
    rows = len(trainer.train_dataset)
    return ArmLoss(arm, rows, trainer.state.global_step, round(seconds, 1), losses, sum(tail) / len(tail))


def measure(settings: GapSettings) -> Gap:
    """Both arms trained on the same rows from the same weights; their logged losses."""
    import torch

    torch.set_num_threads(settings.threads)
    settings.out.mkdir(parents=True, exist_ok=True)
    build = training_build(settings)
    model = probe_model(settings)
    shuffled = make_arm("gemex", build, "shuffled", settings.out / "gemex-shuffled", settings.seed)
    return Gap(train_arm(settings, model, build, "images"), train_arm(settings, model, shuffled, "shuffled"))


def main(argv: list[str] | None = None) -> int:
    settings = options_from_command_line(GapSettings, argv, __doc__)
    os.environ.setdefault("HF_DATASETS_CACHE", str(settings.out.absolute() / "hf-cache"))
    gap = measure(settings)
    for arm in (gap.images, gap.shuffled):
        print(f"{arm.arm}: {arm.rows} rows, {arm.steps} steps, {arm.seconds:.0f} s, tail loss {arm.tail_loss:.4f}")
    print(f"images / shuffled tail loss: {gap.ratio:.3f}")
    result = {"settings": {k: str(v) for k, v in asdict(settings).items()}, "ratio": gap.ratio}
    result |= {"images": asdict(gap.images), "shuffled": asdict(gap.shuffled)}
    (settings.out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
