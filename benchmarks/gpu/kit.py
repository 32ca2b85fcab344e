"""The GPU kit's driver: one part of `plan.yaml` within the plan's time budget (`seconds`).

    python -m benchmarks.gpu.kit --part 1 --out "$OUT"            # on the GPU machine (run.sh does this)
    python -m benchmarks.gpu.kit --part 1 --out /tmp/out --tiny   # the same steps on CPU, tiny model

Each step runs in its own process under a time limit (the part's own deadline included), so a step
that fails, hangs or runs out of memory costs only itself: it is recorded with its log's last lines
and the next step runs. After every step `$OUT` holds the whole story so far, in three files: `results.jsonl` (one JSON object per table row, with the
exact command behind it), `results.md` (the tables) and `logs.tar.gz` (every step's log, profiler
operator tables, predictions and scores), and a `trace-<row>.json.gz` per profiled row.

Steps: `data` (synthesize full-size releases, build them), `train` (B.1, benchmarks/train_throughput.py),
`generate` (B.2), `loop` (B.3: LoRA fine-tune, predictions, `cxr-vqa evaluate`), `epoch_hours` (B.4),
`signal` (B.5, benchmarks/learning_signal.py: does a larger probe learn from the pixels in a GPU's steps?).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from benchmarks.gpu.report import results_markdown

KIT = Path(__file__).resolve().parent
ROOT = KIT.parents[1]

PLAN = KIT / "plan.yaml"
WORK, TINY_WORK = Path("/tmp/gpu-kit"), Path("/tmp/gpu-kit-tiny")
TRACE = "trace.json.gz"
FILE_LIMIT_BYTES = 15 * 2**20
MAX_TRACES = 4
"""results.md, results.jsonl, logs.tar.gz and at most four traces, each under FILE_LIMIT_BYTES: a small, fixed set of files to copy off the machine."""


def merged(base: dict, override: dict) -> dict:
    """`base` with `override`'s keys replaced, tables merged key by key."""
    result = dict(base)
    for key, value in override.items():
        result[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return result


def load_plan(tiny: bool, path: Path = PLAN) -> dict:
    plan = yaml.safe_load(path.read_text())
    return merged(plan["gpu"], plan["tiny"]) if tiny else plan["gpu"]


@dataclass
class Outcome:
    status: str  # ok, failed, timeout, skipped
    seconds: float = 0.0
    returncode: int | None = None
    error: str | None = None
    out_of_memory: bool = False
    """Read from the whole log: the error keeps only each last line's tail, where CUDA's long message
    can lose its "out of memory"."""


@dataclass
class Kit:
    plan: dict
    part: str
    out: Path
    work: Path
    tiny: bool
    deadline: float
    rows: list[dict] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def built(self, dataset: str) -> Path:
        return self.work / "built" / dataset

    def stamp(self, dataset: str) -> Path:
        """Beside the build (a build folder holds only what its build wrote): the plan it was made for."""
        return self.work / "built" / f"{dataset}.kit.json"

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, command: list[str], timeout: float) -> Outcome:
        """Run `command` with its output in logs/<name>.log, killed (its whole process group, the
        DataLoader workers too) past `timeout` or the part's deadline."""
        limit = min(timeout, self.seconds_left())
        if limit < 20:
            return Outcome("skipped", error=f"no time left in part {self.part} ({self.seconds_left():.0f} s)")
        log = self.logs / f"{name}.log"
        started = time.monotonic()
        with log.open("w") as sink:
            sink.write(f"$ {shlex.join(command)}\n")
            sink.flush()
            process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env(), start_new_session=True
            )
            try:
                returncode = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return Outcome(
                    "timeout", time.monotonic() - started, None, f"killed after {limit:.0f} s; {log_tail(log)}"
                )
        seconds = time.monotonic() - started
        if returncode != 0:
            return Outcome("failed", seconds, returncode, log_tail(log), out_of_memory=ran_out_of_memory(log))
        return Outcome("ok", seconds, 0)

    def run_worker(self, worker: str, timeout: float) -> tuple[Outcome, list[str], dict]:
        """A `workers.py` step in its own process, and what it saved: never what an earlier call left there."""
        result_file = self.logs / f"{worker}.json"
        result_file.unlink(missing_ok=True)
        command = worker_command(self, worker, result_file)
        outcome = self.run(worker, command, timeout)
        return outcome, command, json.loads(result_file.read_text()) if result_file.exists() else {}

    def env(self) -> dict[str, str]:
        paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            "PYTHONUNBUFFERED": "1",
            "HF_DATASETS_CACHE": str(self.work / "hf-cache"),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }

    def record(self, bench: str, name: str, outcome: Outcome, command: list[str] | None = None, **values) -> dict:
        row = {
            "part": self.part,
            "bench": bench,
            "name": name,
            "status": outcome.status,
            "seconds": round(outcome.seconds, 1),
            **values,
        }
        if outcome.error:
            row["error"] = outcome.error
        if command:
            row["command"] = shlex.join(command)
        self.rows.append(row)
        with (self.out / "results.jsonl").open("a") as sink:
            sink.write(json.dumps(row) + "\n")
        self.write_tables()
        self.pack_logs()
        return row

    def write_tables(self) -> None:
        (self.out / "results.md").write_text(results_markdown(self.rows, self.plan, self.part, self.tiny))

    def pack_logs(self) -> None:
        """Logs into `logs.tar.gz`; each profiler trace beside it as `trace-<row>.json.gz` (at most
        MAX_TRACES, each under FILE_LIMIT_BYTES: a trace too large, or past the last, stays in the work folder)."""

        def no_traces(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return None if info.name.endswith(TRACE) else info

        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as archive:
            archive.add(self.logs, arcname=f"logs-part{self.part}", filter=no_traces)
        traces = sorted(self.logs.glob(f"profile-*/{TRACE}"))
        for trace in [t for t in traces if t.stat().st_size <= FILE_LIMIT_BYTES][:MAX_TRACES]:
            target = self.out / f"trace-{trace.parent.name.removeprefix('profile-')}.json.gz"
            if not target.exists():
                shutil.copyfile(trace, target)


def log_tail(log: Path, lines: int = 6) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(line.strip()[-300:] for line in text[-lines:])


def ran_out_of_memory(log: Path) -> bool:
    text = log.read_text(errors="replace")
    return "OutOfMemoryError" in text or "out of memory" in text.lower()


def python(*args: str | Path) -> list[str]:
    return [sys.executable, *map(str, args)]


def cli(*args: str | Path) -> list[str]:
    """`cxr-vqa ARGS` (the package need not be installed: run from the repository root)."""
    return python("-m", "cxr_vqa.cli", *args)


# ---- steps -------------------------------------------------------------------------------------------------


RELEASE_SIZES = {"gemex": ("--num-images", "gemex_images"), "rexvqa": ("--num-studies", "rexvqa_studies")}
"""Each dataset's `cxr-vqa synthesize` size option and the plan's `data` key that gives it."""


def step_data(kit: Kit, spec: dict) -> None:
    """Synthesize full-size GEMeX and ReXVQA releases and build each (`--image-mode embed`), once per machine."""
    data = kit.plan["data"]
    releases = {
        dataset: cli(
            "synthesize",
            dataset,
            "--out",
            kit.work / "release" / dataset,
            count_option,
            str(data[count]),
            "--downscale",
            str(data["downscale"]),
            "--num-proc",
            str(data["num_proc"]),
        )
        for dataset, (count_option, count) in RELEASE_SIZES.items()
    }
    sources = {
        "gemex": [
            "--source",
            kit.work / "release" / "gemex" / "per_type",
            "--images",
            kit.work / "release" / "gemex" / "files",
        ],
        "rexvqa": ["--source", kit.work / "release" / "rexvqa"],
    }
    for dataset, synthesize in releases.items():
        wanted = data_plan(kit.plan, dataset)
        mismatch = reuse_mismatch(kit.built(dataset), wanted)
        if mismatch is None:
            kit.record(
                "data", f"{dataset} build", Outcome("ok"), note="already built on this machine for this plan", **wanted
            )
            continue
        shutil.rmtree(
            kit.work / "release" / dataset, ignore_errors=True
        )  # a smaller release would keep a larger one's files
        kit.stamp(dataset).unlink(missing_ok=True)
        outcome = kit.run(f"synthesize-{dataset}", synthesize, data["timeout"])
        kit.record("data", f"{dataset} synthesize", outcome, synthesize, rebuilt_because=mismatch)
        if outcome.status != "ok":
            continue
        build = cli(
            "build",
            dataset,
            *sources[dataset],
            "--out",
            kit.built(dataset),
            "--image-mode",
            data["image_mode"],
            *(["--image-size", str(data["image_size"])] if data.get("image_size") else []),
            "--shard-layout",
            data.get("shard_layout", "auto"),
            "--num-proc",
            str(data["num_proc"]),
            "--overwrite",
        )
        outcome = kit.run(f"build-{dataset}", build, data["timeout"])
        if outcome.status == "ok":
            kit.stamp(dataset).write_text(
                json.dumps({"plan": wanted, "report_sha256": file_sha256(kit.built(dataset) / "build_report.json")})
            )
        kit.record("data", f"{dataset} build", outcome, build, **build_counts(kit.built(dataset)))


def data_plan(plan: dict, dataset: str) -> dict:
    """What a build must have been made from to serve this plan: its release's scale and image scale, the
    build's image mode, image size and shard layout, and the configs the plan's layouts train on."""
    data = plan["data"]
    return {
        "dataset": dataset,
        "scale": data["gemex_images" if dataset == "gemex" else "rexvqa_studies"],
        "downscale": data["downscale"],
        "image_mode": data["image_mode"],
        "image_size": data.get("image_size"),
        "shard_layout": data.get("shard_layout", "auto"),
        "configs": sorted(set(plan["layouts"][dataset].values())),
    }


def reuse_mismatch(built: Path, wanted: dict) -> str | None:
    """Why the build in `built` cannot serve `wanted` (`data_plan`), or None when it can: the kit's stamp beside it
    records the plan it was made for and its report's checksum, and the report's own settings agree."""
    stamp = built.parent / f"{built.name}.kit.json"
    report_path = built / "build_report.json"
    if not report_path.exists():
        return "no build yet"
    try:
        made = json.loads(stamp.read_text())
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        return f"no readable {stamp.name} says which plan the build there was made for"
    if made.get("report_sha256") != file_sha256(report_path):
        return "the build there changed after the kit made it"
    differ = [
        f"{key} {made.get('plan', {}).get(key)!r}, the plan {value!r}"
        for key, value in wanted.items()
        if made.get("plan", {}).get(key) != value
    ]
    settings = report.get("settings", {})
    differ += [
        f"its report's {key} {settings.get(key)!r}, the plan {wanted[key]!r}"
        for key in ("image_mode", "image_size", "shard_layout")
        if settings.get(key) != wanted[key]
    ]
    lacking = sorted(set(wanted["configs"]) - set(report.get("configs", [])))
    differ += [f"it lacks the config(s) {', '.join(lacking)} the plan's layouts train on"] if lacking else []
    return f"the build there was made for another plan: {'; '.join(differ)}" if differ else None


def file_sha256(path: Path) -> str:
    from builders.assembly.shards import sha256

    return sha256(path)


def build_counts(built: Path) -> dict:
    report = built / "build_report.json"
    if not report.exists():
        return {}
    data = json.loads(report.read_text())
    return {key: data[key] for key in ("records_read", "rows_written") if key in data}


def built_configs(built: Path) -> set[str]:
    from builders.built_folder import card_configs

    try:
        return set(card_configs(built)[0])
    except ValueError:
        return set()


SPEEDUP_FLAGS = {
    "group_by_length": ["--group_by_length"],
    "chunked_vision_attention": ["--chunked_vision_attention"],
    "flash_first": ["--flash_first"],
    "liger": ["--liger"],
    "compile": ["--compile"],
}
"""benchmarks/train_throughput.py's flag for each speed-up a plan row may name."""


def speedups(kit_train: dict, spec: dict) -> list[str]:
    """A row's speed-ups: its own list, else the plan's default (the recipe's: batches grouped by length)."""
    chosen = spec.get("speedups", kit_train["speedups"])
    unknown = sorted(set(chosen) - set(SPEEDUP_FLAGS))
    if unknown:
        raise ValueError(f"unknown speed-up {', '.join(unknown)}: plan.yaml may name {', '.join(SPEEDUP_FLAGS)}")
    return list(chosen)


def train_name(spec: dict, default_speedups: list[str]) -> str:
    parts = [spec["dataset"], spec["layout"], spec["tuning"], spec.get("budget", "default")]
    if "speedups" in spec and spec["speedups"] != default_speedups:
        parts.append("+".join(spec["speedups"]) or "random-batches")
    if "batch_size" in spec:
        parts.append(f"batch{spec['batch_size']}")
    return "-".join(parts) + ("-profiled" if spec.get("profile") else "")


def step_train(kit: Kit, spec: dict) -> None:
    """B.1: one row of training throughput; an out-of-memory run is retried once at half the batch."""
    train, name = kit.plan["train"], train_name(spec, kit.plan["train"]["speedups"])
    chosen = speedups(train, spec)
    config = kit.plan["layouts"][spec["dataset"]][spec["layout"]]
    max_pixels = kit.plan["larger_max_pixels" if spec.get("budget") == "larger" else "max_pixels"]
    facts = {
        "dataset": spec["dataset"],
        "layout": spec["layout"],
        "config": config,
        "tuning": spec["tuning"],
        "max_pixels": max_pixels,
        "speedups": chosen,
    }
    if config not in built_configs(kit.built(spec["dataset"])):
        kit.record(
            "B.1", name, Outcome("skipped", error=f"the {spec['dataset']} build has no `{config}` config"), **facts
        )
        return
    batch_size = spec.get("batch_size", train["batch_size"][spec["tuning"]])
    while True:
        result_file = kit.logs / f"train-{name}-bs{batch_size}.json"
        command = python(
            "-m",
            "benchmarks.train_throughput",
            "--dataset",
            kit.built(spec["dataset"]),
            "--dataset_config",
            config,
            "--batch_size",
            str(batch_size),
            "--steps",
            str(train["steps"]),
            "--warmup_steps",
            str(train["warmup_steps"]),
            "--rows",
            str(train["rows"]),
            "--max_pixels",
            str(max_pixels),
            "--min_pixels",
            str(kit.plan["min_pixels"]),
            "--num_workers",
            str(train["num_workers"]),
            "--attn_implementation",
            kit.plan["attn_implementation"],
            "--device",
            kit.plan["device"],
            "--output_json",
            result_file,
            "--gradient_checkpointing" if train["gradient_checkpointing"] else "--no-gradient_checkpointing",
            *(["--model", kit.plan["model"]] if not kit.tiny else ["--tiny"]),
            *(flag for speedup in chosen for flag in SPEEDUP_FLAGS[speedup]),
            *(["--compile_backend", train["compile_backend"]] if "compile" in chosen else []),
            *(
                ["--lora", "--lora_r", str(train["lora_r"]), "--lora_alpha", str(train["lora_alpha"])]
                if spec["tuning"] == "lora"
                else []
            ),
            *(
                [
                    "--profile",
                    kit.logs / f"profile-{name}",
                    "--profile_when",
                    train["profile_when"],
                    "--profile_steps",
                    str(train["profile_steps"]),
                ]
                if spec.get("profile")
                else []
            ),
        )
        outcome = kit.run(f"train-{name}-bs{batch_size}", command, spec.get("timeout", train["timeout"]))
        if outcome.out_of_memory and batch_size > 1:
            kit.record("B.1", name, outcome, command, **facts, batch_size=batch_size)
            batch_size //= 2
            continue
        measured = json.loads(result_file.read_text()) if outcome.status == "ok" and result_file.exists() else {}
        kit.record(
            "B.1",
            name,
            outcome,
            command,
            **facts,
            batch_size=batch_size,
            **{k: v for k, v in measured.items() if k not in facts and k != "batch_size"},
        )
        return


def step_generate(kit: Kit, spec: dict) -> None:
    """B.2: questions/s and peak memory of the recipe's batched generation at each batch size, then
    its other options and ReXVQA at the fastest one."""
    settings = kit.plan["generate"]
    outcome, command, measured = kit.run_worker("generate", settings["timeout"])
    batches = measured.get("batches", [])
    for batch in batches:
        batch_outcome = Outcome(batch.pop("status"), batch["seconds"], error=batch.pop("error", None))
        kit.record(
            "B.2",
            f"{batch['dataset']} batch {batch['batch_size']}, {batch['variant']}",
            batch_outcome,
            command,
            split=settings["split"],
            max_new_tokens=settings["max_new_tokens"],
            **{k: v for k, v in batch.items() if k != "seconds"},
        )
    if outcome.status != "ok" or not batches:
        kit.record(  # the sweep's rows after the last one measured: killed with the worker
            "B.2",
            f"{settings['dataset']} generation",
            outcome,
            command,
            dataset=settings["dataset"],
            split=settings["split"],
            variant="the rows after",
        )


def step_loop(kit: Kit, spec: dict) -> None:
    """B.3: a short LoRA fine-tune on both builds, predictions on each test split, then `cxr-vqa evaluate`."""
    loop = kit.plan["loop"]
    outcome, command, trained = kit.run_worker("loop", loop["timeout"])
    losses = trained.get("losses", [])
    steps, seconds = trained.get("steps"), trained.get("train_seconds")
    kit.record(
        "B.3",
        "LoRA fine-tune + predictions",
        outcome,
        command,
        steps=steps,
        train_seconds=seconds,
        samples_per_s=steps * loop["batch_size"] / seconds if steps and seconds else None,
        peak_memory_gb=trained.get("peak_memory_gb"),
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        loss_falls=bool(losses) and losses[-1] < losses[0],
        losses=losses,
        predictions=trained.get("predictions"),
    )
    for dataset, predictions in trained.get("predictions", {}).items():
        scores = kit.logs / f"scores-{dataset}.json"
        evaluate = cli(
            "evaluate",
            kit.built(dataset),
            "--predictions",
            predictions["file"],
            "--split",
            "test",
            "--out",
            scores,
            *(
                [
                    "--box-convention",
                    "qwen2.5-vl",
                    "--max-pixels",
                    str(kit.plan["max_pixels"]),
                    "--min-pixels",
                    str(kit.plan["min_pixels"]),
                ]
                if dataset == "gemex"
                else []
            ),
            *(["--text-metrics", loop["text_metrics"]] if loop["text_metrics"] and dataset == "gemex" else []),
        )
        outcome = kit.run(f"evaluate-{dataset}", evaluate, 120)
        kit.record(
            "B.3",
            f"evaluate {dataset}",
            outcome,
            evaluate,
            questions=predictions["count"],
            table=scores_table(kit.logs / f"evaluate-{dataset}.log"),
            **extraction_counts(scores),
        )


def step_layouts(kit: Kit, spec: dict) -> None:
    """B.6: per question against per image, the same GEMeX questions (workers.layouts_worker), a row each."""
    if kit.plan["layouts"]["gemex"]["per_image"] not in built_configs(kit.built("gemex")):
        kit.record("B.6", "layouts", Outcome("skipped", error="the gemex build has no per-image config"))
        return
    outcome, command, measured = kit.run_worker("layouts", kit.plan["layout_race"]["timeout"])
    rows = measured.get("layouts", [])
    for row in rows:
        kit.record("B.6", row["layout"], Outcome("ok", row["train_seconds"]), command, **row)
    if outcome.status != "ok" or len(rows) < 2:  # the layouts after the last one measured: killed with the worker
        kit.record("B.6", "gemex layouts", outcome, command, layout="the layouts after")


def scores_table(log: Path) -> str:
    """The table `cxr-vqa evaluate` prints, out of its log (progress bars and notes left out)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(line for line in lines if line.startswith("|"))


def extraction_counts(scores: Path) -> dict:
    """Replies whose answer could not be extracted, from `evaluate --out`'s per-question records."""
    if not scores.exists():
        return {}
    per_question = json.loads(scores.read_text()).get("per_question", [])
    return {
        "replies_scored": sum(not q.get("missing") for q in per_question),
        "missing": sum(bool(q.get("missing")) for q in per_question),
        "failed_extractions": sum(bool(q.get("failed_extraction")) for q in per_question),
    }


def step_epoch_hours(kit: Kit, spec: dict) -> None:
    """B.4: hours for one epoch of each full release's train split, from this part's B.1 rows."""
    from benchmarks.gpu.epoch import epoch_rows  # imports torch, datasets and trl (via train_throughput): only here

    for row in epoch_rows(kit.rows, kit.plan):
        kit.record("B.4", row.pop("name"), Outcome(row.pop("status"), error=row.pop("error", None)), **row)


def step_signal(kit: Kit, spec: dict) -> None:
    """B.5: the learning-signal benchmark (`benchmarks/learning_signal.py`) at what a CPU cannot reach: the
    plan's probe size, every arm trained for the same wall time, scored on held-out questions beside the
    majority baseline. Its releases are its own (the plain-findings drawing at the probe's sizes). The step's
    own keys override the plan's `signal` settings (a `true` one is a flag: `train_both_ways: true`)."""
    settings = {**kit.plan["signal"], **{key: value for key, value in spec.items() if key != "step"}}
    out = kit.work / f"signal-{settings['datasets'].replace(',', '-')}"
    (out / "result.json").unlink(missing_ok=True)
    command = python("-m", "benchmarks.learning_signal", *signal_options(settings), "--out", out)
    outcome = kit.run("signal", command, settings["timeout"])
    (kit.logs / "signal").mkdir(exist_ok=True)
    if (out / "logs").is_dir():
        shutil.copytree(out / "logs", kit.logs / "signal", dirs_exist_ok=True)
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    if result:
        shutil.copyfile(out / "result.json", kit.logs / "signal" / "result.json")
    for run in result.get("runs", []):
        kit.record(
            "B.5",
            f"{run['dataset']} {run['arm']}",
            Outcome("ok", run["train_seconds"]),
            command,
            **{key: run.get(key) for key in ("dataset", "arm", "steps", "questions", "accuracy", "both_ways_accuracy")},
            size=settings["size"],
        )
    for failure in result.get("failed", []):
        kit.record(
            "B.5",
            f"{failure['dataset']} {failure['arm']}",
            Outcome("failed", error=failure["error"][-300:]),
            command,
            dataset=failure["dataset"],
            arm=failure["arm"],
            size=settings["size"],
        )
    for baseline in result.get("majority", []):
        kit.record(
            "B.5",
            f"{baseline['dataset']} majority baseline",
            Outcome("ok"),
            **{key: baseline[key] for key in ("dataset", "questions", "accuracy")},
            arm="majority baseline",
        )
    if outcome.status != "ok" or not result:
        kit.record("B.5", "learning signal", outcome, command)


def signal_options(settings: dict) -> list[str]:
    """`learning_signal`'s options from the plan's settings: `--key=value`; a flag `--key` where true, `--no-key`
    where false (what an option that defaults to true takes)."""
    options = []
    for key, value in settings.items():
        if key == "timeout":
            continue
        name = key.replace("_", "-")
        options.append(f"--{name}" if value is True else f"--no-{name}" if value is False else f"--{name}={value}")
    return options


STEPS = {
    "data": step_data,
    "train": step_train,
    "generate": step_generate,
    "loop": step_loop,
    "layouts": step_layouts,
    "epoch_hours": step_epoch_hours,
    "signal": step_signal,
}


def worker_command(kit: Kit, worker: str, result_file: Path) -> list[str]:
    return python(
        "-m",
        "benchmarks.gpu.workers",
        worker,
        "--work",
        kit.work,
        "--result",
        result_file,
        *(["--tiny"] if kit.tiny else []),
    )


def environment_note(kit: Kit) -> None:
    """The versions the figures were taken with, the requirements the machine does not meet and its device
    (benchmarks/gpu/environment.py): the first row of every part."""
    command = python("-m", "benchmarks.gpu.environment", *([] if kit.tiny else ["--import"]))  # carried wheels import?
    outcome = kit.run("environment", command, 120)
    lines = (kit.logs / "environment.log").read_text(errors="replace").splitlines()
    versions = [line for line in lines if line.startswith(("python ", "unmet: "))]
    device = next((line.removeprefix("device: ") for line in lines if line.startswith("device: ")), None)
    kit.record(
        "env",
        "versions",
        outcome,
        versions=" | ".join(versions) or log_tail(kit.logs / "environment.log", 2),
        **({"device": device} if device else {}),
    )


def run_part(plan: dict, part: str, out: Path, work: Path, tiny: bool) -> list[dict]:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    for stale in [
        *(out / name for name in ("results.jsonl", "results.md", "logs.tar.gz")),
        *out.glob("trace-*.json.gz"),
    ]:
        stale.unlink(missing_ok=True)
    kit = Kit(plan, part, out, work, tiny, started + plan["seconds"])
    # An earlier call's logs went back with that call; kept, they would be packed and read (scores, traces) as this one's
    shutil.rmtree(kit.logs, ignore_errors=True)
    kit.logs.mkdir(parents=True)
    environment_note(kit)
    for spec in plan["parts"][part]:
        try:
            STEPS[spec["step"]](kit, spec)
        except Exception as err:  # noqa: BLE001 - a broken step is recorded; the next one still runs
            kit.record(spec["step"], spec["step"], Outcome("failed", error=f"{type(err).__name__}: {err}"))
    return kit.rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="1", help="which list of steps in plan.yaml's [parts]")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "gpu-kit-out")), help="results (default $OUT)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        help=f"releases, builds, logs (default {WORK}, with --tiny {TINY_WORK}: "
        "a tiny run never leaves its builds where the full plan looks)",
    )
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny model, small releases: the kit's own test")
    parser.add_argument(
        "--seconds",
        type=float,
        help="start no step past this (default: the plan's `seconds`); for a shorter run, e.g. part 3's",
    )
    args = parser.parse_args(argv)
    plan = load_plan(args.tiny)
    if args.seconds:
        plan["seconds"] = args.seconds
    rows = run_part(plan, args.part, args.out, args.work or (TINY_WORK if args.tiny else WORK), args.tiny)
    print((args.out / "results.md").read_text())
    failed = [row["name"] for row in rows if row["status"] in ("failed", "timeout")]
    print(
        f"part {args.part}: {len(rows)} rows, {len(failed)} failed or timed out{': ' + ', '.join(failed) if failed else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
