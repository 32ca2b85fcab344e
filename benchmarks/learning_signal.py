"""Does a model trained by the recipes learn from the pixels? Images against blank and shuffled images.

    python -m benchmarks.learning_signal --seed 0 --out runs/learning-signal
    python -m benchmarks.learning_signal --seed 0 --out runs/ls-layout --layout per_image --datasets gemex

For each dataset it synthesizes a training release and a held-out release from `--seed` (their images
never meet), builds both with `cxr-vqa build --image-mode embed`, and trains one probe model per arm
(`benchmarks/probe_arms.py`: `images`, `blank`, `shuffled`) with `python -m training_recipes.sft`,
the same settings and steps in every arm (`--arms marked` adds the positive control: blank images and the
answer in the words), then answers the held-out questions with
`python -m training_recipes.generate` and scores them with `cxr-vqa evaluate`: each step is the
command a user runs. The accuracy is GEMeX's A-score over its closed-ended, single- and multi-choice
questions together (evaluate's `all` row) and ReXVQA's overall accuracy; GEMeX's V-score (box IoU) is
reported beside it. The majority baseline is `cxr-vqa evaluate --baseline majority` on the same
questions. `DIR/result.json` holds every run, with the build and split `cxr-vqa evaluate` scores. Arms of both
datasets run `--jobs` at a time (2: one a core, each command on `--threads 1`).

`--layout per_image` compares how fast the two layouts learn: the `images` arm per question and
per image (GEMeX `sft_per_image`, ReXVQA `sft_per_study`), each given the per-question run's wall time
(the per-image run is stopped by SIGTERM, which makes `sft.py` save and exit) and scored at the
checkpoints nearest 25, 50 and 100% of that time.

Releases are synthesized with `--plain-findings answered` (each finding a closed-ended "Yes." names, or a
ReXVQA correct option rests on, drawn as a large, high-contrast mark, so the answer is in sight at the probe's 112 px;
`--plain-findings all` every finding, `--plain-findings ''` the default drawing); `--balance-answers` trains every arm on the same rows, as many of each answer as the rarest has
(`benchmarks/probe_rows.py` cuts them),
and scores it on held-out questions cut alike, so a probe that answers one answer to all (what blank and shuffled
images teach) scores 50 and the images arm's lead over them is what it read in the pixels;
`--reply answer` trains replies without the reason (ReXVQA's explanation) and boxes (`sft.py --reply answer`), so the
loss falls on the answer; `--reply answer_boxes` keeps GEMeX's boxes, so the V-score of each arm shows what the image
adds to the grounding. By default each dataset's probe is fitted to its training build (`probe_model --fit-to`: the build's words
whole in its tokenizer, its random tower's output standardised on the build's images) and trained with the tower
frozen (`sft.py --freeze_vision_tower`, `--no-freeze-vision-tower` trains it); ReXVQA's arms train a checklist
reply (`sft.py --reply checklist`: a yes/no verdict on every option, then the letter) and answer each held-out
question with the offered option whose reply the probe finds likeliest (`generate.py --choose_by likelihood`), the
way lmms-eval scores multiple choice. Without these the probe reads ReXVQA at chance on a CPU (docs/benchmarks.md).

GEMeX's yes/no arms are also scored on the held-out images asked both ways (the `both ways` column,
`asked_both_ways`: each image asked "Yes." as often as "No."), where what an image says of the answer whatever
the question (how much is drawn on it) scores 50: above it, the probe reads the finding and region its question
names. `--train-both-ways` trains on such images only.

The probe is `python -m benchmarks.probe_model`; every size and count is an option. Where the
machine's speed is not known (a GPU), `--train-seconds` stops every arm at the same wall time instead of
after `--steps`, and each run records the steps it reached (`benchmarks/gpu/`, step `signal`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.probe_arms import ARMS, CONTROLS, make_arm
from benchmarks.probe_rows import asked_both_ways, balanced, conversations_of
from cxr_vqa.options import options_from_command_line

GEMEX_SCORED = ("closed_ended", "single_choice", "multi_choice")
"""GEMeX question types scored with an accuracy (open-ended answers are text)."""
HELD_OUT_SEED = 1_000_003
"""Added to `--seed` for the held-out releases: other images, other questions."""
TIME_FRACTIONS = (0.25, 0.5, 1.0)
STEPS = {"gemex": 1200, "rexvqa": 800}
"""Each dataset's training steps by default: a ReXVQA step (a study's images, a checklist) takes about twice a GEMeX one."""


def option(default, help: str, **metadata):
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class Settings:
    seed: int = field(metadata={"help": "changes every image, question and initial weight"})
    out: Path = field(metadata={"help": "the folder for builds, runs and result.json"})
    datasets: tuple[str, ...] = option(("gemex", "rexvqa"), "comma-separated: gemex, rexvqa")
    arms: tuple[str, ...] = option(CONTROLS, f"comma-separated of {', '.join(ARMS)}")
    layout: str = option(
        "per_question",
        "per_image: the images arm per question and per image for the same time",
        choices=("per_question", "per_image"),
    )
    train_images: int = option(3000, "GEMeX training release")
    train_studies: int = option(1500, "ReXVQA training release")
    held_out_images: int = option(560, "GEMeX held-out release")
    held_out_studies: int = option(180, "ReXVQA held-out release")
    image_size: int = option(224, "the build's --image-size")
    size: str = option("probe", "probe_model --size of the probe")
    steps: int = option(0, "training steps of every arm (0: each dataset's own, GEMeX 1,200 and ReXVQA 800)")
    rexvqa_steps: int = option(0, "training steps of every ReXVQA arm, over --steps (0: --steps's)")
    batch_size: int = option(16, "per-device batch of every arm")
    learning_rate: float = option(2e-3, "learning rate of every arm")
    warmup_steps: int = option(0, "linear warm-up steps of every arm")
    adam_beta2: float = option(
        0.999, "AdamW's second-moment decay (0.9 forgets the large gradients of the reply's format sooner)"
    )
    gemex_config: str = option(
        "closed_ended",
        "the GEMeX config trained on per question and scored ('': sft, every type; "
        "closed_ended, single_choice or multi_choice: that type alone)",
    )
    plain_findings: str = option(
        "answered",
        "releases drawn with `synthesize DATASET --plain-findings WHICH` ('': the default drawing)",
        choices=("all", "answered", ""),
    )
    balance_answers: bool = option(
        True,
        "train and score every arm on as many rows of each answer as the rarest has (GEMeX, with --gemex-config): "
        "no prior is worth learning, and a constant answer scores as the majority does",
    )
    train_both_ways: bool = option(
        False,
        "train every arm only on GEMeX images asked both ways (`asked_both_ways`, with --gemex-config closed_ended): "
        "no image says anything of the answer unless its question is read",
    )
    reply: str = option(
        "answer",
        "replies trained on: full (answer, reason, boxes), answer (reason or ReXVQA's explanation emptied, no "
        "boxes) or answer_boxes (GEMeX: reason emptied)",
        choices=("full", "answer", "answer_boxes"),
    )
    rexvqa_reply: str = option(
        "checklist",
        "ReXVQA's replies: checklist (a yes/no verdict on every option, then the letter), or '' for --reply's",
        choices=("checklist", "full", "answer", ""),
    )
    choose_by: str = option(
        "likelihood",
        "how ReXVQA's held-out answers are chosen (`generate.py --choose_by`): likelihood (the likeliest offered "
        "option's reply; with a checklist or answer reply) or greedy (what the probe writes)",
        choices=("likelihood", "greedy"),
    )
    fit_probe: bool = option(
        True,
        "fit each dataset's probe to its training build (`probe_model --fit-to`: its words whole in the tokenizer, "
        "the tower's output standardised on its images)",
    )
    freeze_vision_tower: bool = option(
        True,
        "train every arm with `sft.py --freeze_vision_tower`: the probe's tower keeps its weights as made, its "
        "connector and decoder train (about a fifth less time a GEMeX step on a CPU)",
    )
    max_new_tokens: int = option(16, "GEMeX reply length (boxes included)")
    train_seconds: float = option(
        0,
        "stop each arm's training at this wall time (SIGTERM: sft.py saves where it stopped) and score what it "
        "trained; 0: every one of --steps (a GPU's speed is not known beforehand)",
    )
    num_proc: int = option(
        1, "processes that draw each release's images and threads that encode them into its build (the same bytes)"
    )
    workers: int = option(0, "DataLoader workers of each training command (0: rows read in its own process)")
    threads: int = option(1, "torch threads of each command")
    jobs: int = option(
        2,
        "arms trained and scored at once, of every dataset (each command with --threads threads): two on two "
        "cores; one dataset's builds are made while the other's arms train",
    )


@dataclass
class Run:
    """One trained and scored probe: what `cxr-vqa evaluate BUILD --split SPLIT --predictions P` scores."""

    dataset: str
    arm: str
    layout: str
    build: str
    split: str
    predictions: str
    train_seconds: float
    steps: int
    accuracy: float | None = None
    v_score: float | None = None
    questions: int = 0
    time_fraction: float = 1.0
    scores: dict = field(default_factory=dict)
    both_ways_accuracy: float | None = None
    """GEMeX yes/no: the accuracy on held-out images each asked "Yes." as often as "No." (`asked_both_ways`)."""
    both_ways_questions: int = 0


def environment(settings: Settings) -> dict[str, str]:
    threads = str(settings.threads)
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "HF_DATASETS_CACHE": str(settings.out / "hf-cache"),
    }


def handles_sigterm(pid: int) -> bool:
    """Whether process `pid` has a SIGTERM handler of its own (Linux: the SigCgt mask in /proc); True where that
    cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), None)
    return caught is None or bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def command(settings: Settings, args: list[str], log: Path, stop_after: float | None = None) -> float:
    """Run one user-facing command (`cxr-vqa ...` or `python -m ...`), its output to `log`; its wall seconds.
    With `stop_after`, it is sent SIGTERM once that many seconds have passed and it handles SIGTERM (`sft.py`
    does once its imports are done, and then saves after the step it is in and exits 0), so an arm still
    importing on busy cores is stopped after its first step rather than killed."""
    argv = [sys.executable, "-m", "cxr_vqa.cli", *args[1:]] if args[0] == "cxr-vqa" else [sys.executable, *args[1:]]
    print("$", " ".join(args), flush=True)
    start = time.monotonic()
    with open(log, "a") as out:
        out.write("$ " + " ".join(args) + "\n")
        out.flush()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environment(settings))
        try:
            process.wait(timeout=stop_after)
        except subprocess.TimeoutExpired:
            while process.poll() is None and not handles_sigterm(process.pid):
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            process.wait()
    if process.returncode:
        raise SystemExit(f"{' '.join(args)} exited {process.returncode}; its output: {log}")
    return time.monotonic() - start


def release_and_build(settings: Settings, dataset: str, name: str, count: int, seed: int) -> Path:
    """A synthetic release of `count` images (GEMeX) or studies (ReXVQA), built with embedded images."""
    raw, build = settings.out / f"{dataset}-{name}-raw", settings.out / f"{dataset}-{name}"
    log = settings.out / "logs" / f"{dataset}-{name}.log"
    flag = "--num-images" if dataset == "gemex" else "--num-studies"
    if not build.is_dir():
        shutil.rmtree(raw, ignore_errors=True)
        plain = ["--plain-findings", settings.plain_findings] if settings.plain_findings else []
        workers = ["--num-proc", str(settings.num_proc)]
        command(
            settings,
            ["cxr-vqa", "synthesize", dataset, "--out", str(raw), flag, str(count), "--seed", str(seed), *plain]
            + workers,
            log,
        )
        source = ["--source", str(raw)] + (["--images", str(raw / "files")] if dataset == "gemex" else [])
        command(
            settings,
            ["cxr-vqa", "build", dataset, *source, "--out", str(build), "--image-mode", "embed"]
            + ["--image-size", str(settings.image_size), *workers],
            log,
        )
        shutil.rmtree(raw)
    return build


def probe_model(settings: Settings, dataset: str, train_build: Path) -> Path:
    """The probe every arm of `dataset` starts from: fitted to the training build (`--fit-probe`), else one for all."""
    name = f"probe-{settings.size}-{dataset}" if settings.fit_probe else f"probe-{settings.size}"
    model = settings.out / name
    if not model.is_dir():
        fit = ["--fit-to", str(train_build)] if settings.fit_probe else []
        command(
            settings,
            ["python", "-m", "benchmarks.probe_model", "--size", settings.size, "--seed", str(settings.seed)]
            + fit
            + ["--out", str(model)],
            settings.out / "logs" / "model.log",
        )
    return model


def reply_of(settings: Settings, dataset: str) -> str:
    """What `dataset`'s arms train to reply (`sft.py --reply`)."""
    return settings.rexvqa_reply if dataset == "rexvqa" and settings.rexvqa_reply else settings.reply


def steps_of(settings: Settings, dataset: str) -> int:
    """`--rexvqa-steps` for ReXVQA where given, else `--steps` where given, else the dataset's own `STEPS`."""
    if dataset == "rexvqa" and settings.rexvqa_steps:
        return settings.rexvqa_steps
    return settings.steps or STEPS[dataset]


def chosen_by_likelihood(settings: Settings, dataset: str) -> bool:
    return dataset == "rexvqa" and settings.choose_by == "likelihood"


def sft_args(settings: Settings, model: Path, dataset: str, build: Path, run_dir: Path, layout: str) -> list[str]:
    args = ["python", "-m", "training_recipes.sft", "--model_name_or_path", str(model)]
    args += [f"--{dataset}_path", str(build), "--output_dir", str(run_dir), "--layout", layout]
    args += ["--reply", reply_of(settings, dataset)]
    if settings.freeze_vision_tower:
        args += ["--freeze_vision_tower", "true"]
    if dataset == "gemex" and layout == "per_question" and settings.gemex_config:
        args += ["--gemex_config", settings.gemex_config]
    return args + [
        "--per_device_train_batch_size",
        str(settings.batch_size),
        "--learning_rate",
        str(settings.learning_rate),
        "--warmup_steps",
        str(settings.warmup_steps),
        "--adam_beta2",
        str(settings.adam_beta2),
        "--seed",
        str(settings.seed),
        "--logging_steps",
        "10",
        "--report_to",
        "none",
        "--activation_checkpointing",
        "false",
        "--dataloader_num_workers",
        str(settings.workers),
    ]


def train(settings: Settings, model: Path, dataset: str, build: Path, run_dir: Path) -> tuple[float, Path, int]:
    """One arm's training: every step, or with `--train-seconds` until that wall time. Its wall seconds, the
    folder of the model it trained (the checkpoint SIGTERM left, else the run's own) and that model's steps."""
    shutil.rmtree(run_dir, ignore_errors=True)
    args = sft_args(settings, model, dataset, build, run_dir, "per_question")
    args += ["--max_steps", str(steps_of(settings, dataset)), "--save_strategy", "no"]
    log = settings.out / "logs" / f"{run_dir.name}.log"
    elapsed = command(settings, args, log, settings.train_seconds or None)
    stopped = max(run_dir.glob("checkpoint-*"), key=checkpoint_step, default=None)
    if stopped is not None:
        return elapsed, stopped, checkpoint_step(stopped)
    if not (run_dir / "config.json").is_file():
        raise SystemExit(f"{run_dir}: stopped at {elapsed:.0f} s before its first step; its output: {log}")
    return elapsed, run_dir, steps_of(settings, dataset)


def checkpoint_step(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("-", 1)[1])


def train_with_checkpoints(
    settings: Settings, model: Path, dataset: str, build: Path, run_dir: Path, layout: str, seconds: float | None
) -> tuple[float, list[tuple[float, Path]]]:
    """Train saving a checkpoint every tenth of the steps; with `seconds`, stop by SIGTERM once that wall time
    is spent (`sft.py` saves where it stopped). Returns the wall seconds and each checkpoint with its time."""
    shutil.rmtree(run_dir, ignore_errors=True)
    every = max(1, steps_of(settings, dataset) // 10)
    steps = steps_of(settings, dataset) * 20 if seconds else steps_of(settings, dataset)
    args = sft_args(settings, model, dataset, build, run_dir, layout)
    args += ["--max_steps", str(steps), "--save_strategy", "steps", "--save_steps", str(every)]
    args += ["--save_only_model", "true"]
    start = time.time()
    elapsed = command(settings, args, settings.out / "logs" / f"{run_dir.name}.log", seconds)
    checkpoints = sorted(
        ((p.stat().st_mtime - start, p) for p in run_dir.glob("checkpoint-*") if p.is_dir()),
        key=lambda item: item[0],
    )
    return elapsed, checkpoints


def scored_types(settings: Settings) -> tuple[str, ...]:
    """The GEMeX types scored: the one trained on (`--gemex-config closed_ended`), else all three."""
    return (settings.gemex_config,) if settings.gemex_config in GEMEX_SCORED else GEMEX_SCORED


def generate(settings: Settings, model: Path, dataset: str, build: Path, predictions: Path, log: Path) -> None:
    predictions.unlink(missing_ok=True)
    configs = scored_types(settings) if dataset == "gemex" else (None,)
    for config in configs:
        args = ["python", "-m", "training_recipes.generate", "--model_name_or_path", str(model)]
        args += ["--dataset_path", str(build), "--split", "train", "--output_file", str(predictions)]
        by_likelihood = chosen_by_likelihood(settings, dataset)
        batch = "8" if by_likelihood else "32"
        args += ["--batch_size", batch, "--max_new_tokens", str(settings.max_new_tokens if dataset == "gemex" else 12)]
        if config:
            args += ["--dataset_config", config]
        if by_likelihood:
            args += ["--choose_by", "likelihood", "--reply", reply_of(settings, dataset)]
        command(settings, args, log)


def evaluate(settings: Settings, dataset: str, build: Path, how: list[str], out: Path, log: Path) -> dict:
    command(
        settings,
        ["cxr-vqa", "evaluate", str(build), "--split", "train", *how, "--text-metrics", "", "--out", str(out)],
        log,
    )
    return json.loads(out.read_text())["scores"]


def headline(dataset: str, scores: dict, types: tuple[str, ...] = GEMEX_SCORED) -> tuple[float, float | None, int]:
    """(accuracy, V-score, questions scored): GEMeX's A and V over `types` (evaluate's `all` row would count
    the open-ended questions no probe is asked as missing), ReXVQA's overall accuracy."""
    if dataset == "rexvqa":
        return scores["overall"]["accuracy"], None, scores["overall"]["questions"]
    rows = [scores[t] for t in types]
    n = sum(r["questions"] for r in rows)
    accuracy = sum(r["A"] * r["questions"] for r in rows) / n
    v = sum(r["V"] * r["questions"] for r in rows if r["V"] is not None) / n
    return accuracy, v, n


def score_run(settings: Settings, run: Run, model: Path) -> Run:
    scores = generated_scores(settings, model, run.dataset, Path(run.build), Path(run.predictions))
    run.accuracy, run.v_score, run.questions = headline(run.dataset, scores, scored_types(settings))
    run.scores = {k: v for k, v in scores.items() if k != "per_category"}
    return run


def generated_scores(settings: Settings, model: Path, dataset: str, build: Path, predictions: Path) -> dict:
    """What `model` answers to `build`'s questions, as `cxr-vqa evaluate` scores it."""
    log = settings.out / "logs" / f"{predictions.stem}.log"
    generate(settings, model, dataset, build, predictions, log)
    return evaluate(
        settings, dataset, build, ["--predictions", str(predictions)], predictions.with_suffix(".scores.json"), log
    )


def majority(settings: Settings, dataset: str, build: Path) -> dict:
    out = settings.out / f"{dataset}-majority.scores.json"
    scores = evaluate(settings, dataset, build, ["--baseline", "majority"], out, settings.out / "logs" / "majority.log")
    accuracy, v, n = headline(dataset, scores, scored_types(settings))
    return {"dataset": dataset, "accuracy": accuracy, "v_score": v, "questions": n}


def arm_run(settings: Settings, dataset: str, arm: str, builds: tuple[Path, Path, Path | None], model: Path) -> Run:
    """One arm: its training and held-out builds, the probe trained on the first and scored on the second (and
    on the held-out images asked both ways, where `prepared_builds` made them)."""
    train_build, held_out, both_ways = builds
    arm_train = make_arm(dataset, train_build, arm, settings.out / f"{dataset}-train-{arm}", settings.seed)
    arm_held = make_arm(dataset, held_out, arm, settings.out / f"{dataset}-held-out-{arm}", settings.seed)
    run_dir = settings.out / f"run-{dataset}-{arm}"
    seconds, trained, steps = train(settings, model, dataset, arm_train, run_dir)
    run = Run(
        dataset,
        arm,
        "per_question",
        str(arm_held),
        "train",
        str(settings.out / f"{dataset}-{arm}.jsonl"),
        round(seconds, 1),
        steps,
    )
    score_run(settings, run, trained)
    if both_ways is not None:
        arm_both = make_arm(dataset, both_ways, arm, settings.out / f"{dataset}-both-ways-{arm}", settings.seed)
        predictions = settings.out / f"{dataset}-{arm}-both-ways.jsonl"
        scores = generated_scores(settings, trained, dataset, arm_both, predictions)
        run.both_ways_accuracy, _, run.both_ways_questions = headline(dataset, scores, scored_types(settings))
    print(f"{dataset} {arm}: accuracy {run.accuracy:.2f} ({run.questions} questions), {seconds:.0f} s", flush=True)
    return run


def layout_runs(settings: Settings, dataset: str, train_build: Path, held_out: Path, model: Path) -> list[Run]:
    """The images arm per question, then per image for the same wall time, each scored at 25/50/100% of it."""
    runs = []
    budget = None
    for layout in ("per_question", "per_image"):
        run_dir = settings.out / f"run-{dataset}-{layout}"
        elapsed, checkpoints = train_with_checkpoints(settings, model, dataset, train_build, run_dir, layout, budget)
        budget = budget or elapsed
        for fraction in TIME_FRACTIONS:
            at, checkpoint = min(checkpoints, key=lambda c: abs(c[0] - fraction * budget))
            step = checkpoint_step(checkpoint)
            name = f"{dataset}-{layout}-{int(fraction * 100)}"
            run = Run(
                dataset,
                "images",
                layout,
                str(held_out),
                "train",
                str(settings.out / f"{name}.jsonl"),
                round(at, 1),
                step,
                time_fraction=fraction,
            )
            runs.append(score_run(settings, run, checkpoint))
            print(f"{dataset} {layout} at {at:.0f} s (step {step}): accuracy {run.accuracy:.2f}", flush=True)
    return runs


def table(runs: list[Run], majorities: list[dict]) -> str:
    lines = [
        "| dataset | arm | layout | time | steps | train s | questions | accuracy | V (GEMeX) | both ways (GEMeX) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        v = f"{r.v_score:.2f}" if r.v_score is not None else "-"
        both = f"{r.both_ways_accuracy:.2f} of {r.both_ways_questions}" if r.both_ways_accuracy is not None else "-"
        lines.append(
            f"| {r.dataset} | {r.arm} | {r.layout} | {int(r.time_fraction * 100)}% | {r.steps} | {r.train_seconds:.0f} "
            f"| {r.questions} | {r.accuracy:.2f} | {v} | {both} |"
        )
    for m in majorities:
        v = f"{m['v_score']:.2f}" if m["v_score"] is not None else "-"
        lines.append(
            f"| {m['dataset']} | majority baseline | - | - | - | - | {m['questions']} | {m['accuracy']:.2f} | {v} | - |"
        )
    return "\n".join(lines)


def release_note(settings: Settings) -> str:
    """How the rows were made, printed above the table (result.json's settings hold the same)."""
    drawn = (
        f"plain findings (synthesize --plain-findings {settings.plain_findings})"
        if settings.plain_findings
        else "default drawing"
    )
    balancing = settings.balance_answers and settings.gemex_config and "gemex" in settings.datasets
    rows = "GEMeX's answers balanced, trained and scored" if balancing else "every row"
    if settings.train_both_ways and settings.gemex_config == "closed_ended" and "gemex" in settings.datasets:
        rows += "; GEMeX trained on images asked both ways"
    words = {
        "answer": "the answer alone (no reason, no boxes)",
        "answer_boxes": "the answer and boxes (no reason)",
        "checklist": "a verdict on every option, then the letter",
    }
    replies = ", ".join(
        f"{dataset} {words.get(reply_of(settings, dataset), 'answer, reason and boxes')}"
        + (" (chosen by likelihood)" if chosen_by_likelihood(settings, dataset) else "")
        for dataset in settings.datasets
    )
    probe = "; probe fitted to each training build" if settings.fit_probe else ""
    tower = "; vision tower frozen" if settings.freeze_vision_tower else ""
    return f"Images: {drawn}; training rows: {rows}; replies trained: {replies}{probe}{tower}"


def margins(runs: list[Run], majorities: list[dict]) -> list[str]:
    """The target's margins: images above blank and shuffled (>= 10 points) and above majority (>= 5)."""
    out = []
    for m in majorities:
        by_arm = {
            r.arm: r.accuracy
            for r in runs
            if r.dataset == m["dataset"] and r.layout == "per_question" and r.time_fraction == 1.0
        }
        if "images" not in by_arm:
            continue
        parts = [f"{arm} {by_arm['images'] - by_arm[arm]:+.1f}" for arm in ("blank", "shuffled") if arm in by_arm]
        parts.append(f"majority {by_arm['images'] - m['accuracy']:+.1f}")
        out.append(f"{m['dataset']}: images minus " + ", ".join(parts) + " points")
    return out


def prepared_builds(settings: Settings, dataset: str) -> tuple[Path, Path, Path | None]:
    """The dataset's training and held-out builds as every arm reads them (GEMeX: answers balanced, per-image
    conversations cut to the trained config, as the settings ask), and for GEMeX's yes/no questions the held-out
    release's images asked both ways (`asked_both_ways`; None otherwise), which `--train-both-ways` trains on too."""
    count = settings.train_images if dataset == "gemex" else settings.train_studies
    held = settings.held_out_images if dataset == "gemex" else settings.held_out_studies
    train_build = release_and_build(settings, dataset, "train", count, settings.seed)
    held_out = release_and_build(settings, dataset, "held-out", held, settings.seed + HELD_OUT_SEED)
    both_ways = None
    if dataset == "gemex" and settings.gemex_config == "closed_ended":
        both_ways = asked_both_ways(
            held_out, "closed_ended", settings.out / f"{held_out.name}-both-ways", settings.seed
        )
        if settings.train_both_ways:
            train_build = asked_both_ways(
                train_build, "closed_ended", settings.out / f"{train_build.name}-both-ways", settings.seed
            )
    if dataset == "gemex" and settings.balance_answers and settings.gemex_config:
        train_build, held_out = (
            balanced(build, settings.gemex_config, settings.out / f"{build.name}-balanced", settings.seed)
            for build in (train_build, held_out)
        )
    if dataset == "gemex" and settings.layout == "per_image" and settings.gemex_config:
        train_build = conversations_of(
            train_build, settings.gemex_config, settings.out / f"{train_build.name}-per-image"
        )
    return train_build, held_out, both_ways


def main(argv: list[str] | None = None) -> int:
    settings = options_from_command_line(Settings, argv, __doc__)
    (settings.out / "logs").mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    runs: list[Run] = []
    majorities = []
    arms: dict[Future, tuple[str, str]] = {}
    with ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        for dataset in settings.datasets:
            builds = prepared_builds(settings, dataset)
            train_build, held_out, _ = builds
            model = probe_model(settings, dataset, train_build)
            majorities.append(majority(settings, dataset, held_out))
            if settings.layout == "per_image":
                runs += layout_runs(settings, dataset, train_build, held_out, model)
            else:
                arms |= {
                    pool.submit(arm_run, settings, dataset, arm, builds, model): (dataset, arm) for arm in settings.arms
                }
        runs_done, failed = finished_arms(pool, arms)
        runs += runs_done
    result = {
        "seed": settings.seed,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
        "runs": [asdict(r) for r in runs],
        "majority": majorities,
        "failed": failed,
        "wall_seconds": round(time.monotonic() - start, 1),
    }
    (settings.out / "result.json").write_text(json.dumps(result, indent=1))
    print(release_note(settings))
    print(table(runs, majorities))
    for line in margins(runs, majorities):
        print(line)
    for failure in failed:
        print(f"{failure['dataset']} {failure['arm']} failed: {failure['error']}", file=sys.stderr)
    print(f"{result['wall_seconds']:.0f} s in all; {settings.out / 'result.json'}")
    return 1 if failed else 0


def finished_arms(pool: ThreadPoolExecutor, arms: dict[Future, tuple[str, str]]) -> tuple[list[Run], list[dict]]:
    """Each arm's run, in the order submitted; an arm that fails (a command's SystemExit naming its log) is
    listed with its error and the others still finish, so a long run keeps what it trained. ^C starts no other."""
    runs, failed = [], []
    try:
        for future, (dataset, arm) in arms.items():
            try:
                runs.append(future.result())
            except SystemExit as err:
                failed.append({"dataset": dataset, "arm": arm, "error": str(err)})
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise
    return runs, failed


if __name__ == "__main__":
    raise SystemExit(main())
