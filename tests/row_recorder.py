"""Records what each process of a recipe run reads, decodes and trains on, for the resume and
multi-process tests: `python tests/row_recorder.py <sft.py arguments>` (or under `accelerate launch`)
runs `training_recipes.sft.main` with every event appended, as it happens, to
`$ROW_LOG/events-<rank>.jsonl` (so a killed run leaves what it had done), from whichever process
(the rank's own, or one of its data loader workers) it happens in:

- `{"event": "batch", "ids": [[question ids of a row], ...], "pid", "ppid"}`: a collated micro-batch;
- `{"event": "read", "ids", "pid"}`: a stored row read and converted to a conversation;
- `{"event": "decoded", "pid"}`: an image decoded.

With `$KILL_AT_STEP`, the process kills itself with SIGKILL when that optimizer step ends; with
`$KILL_IN_SAVE` (`STEP:before_optimizer` or `STEP:before_callbacks`), inside the save of that step,
after the weights or after the Trainer's whole save (its own rotation included), before the recipe's;
with `$SIGTERM_IN_FINAL_SAVE`, it sends itself SIGTERM as the final `save_model` starts. Several runs
in one launch (one start-up): argument lists separated by `::`, run `i` recorded under `$ROW_LOG/<i>`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from transformers import Trainer
from transformers.trainer_callback import CallbackHandler
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

from training_recipes import data, sft


def recorded_process(argv: list[str], log_dir: Path, **env: str) -> subprocess.Popen:
    """`sft.main(argv)` in a process of its own, recorded under `log_dir`, with this file's kill switches
    (`KILL_AT_STEP=3`, ...) given as `env`."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "ROW_LOG": str(log_dir),
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, __file__, *argv],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def events_file(log_dir: Path) -> Path:
    return log_dir / f"events-{os.environ.get('RANK', '0')}.jsonl"


def record(log_dir: Path, event: str, **fields) -> None:
    with events_file(log_dir).open("a") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def events(log_dir: Path, rank: int = 0, kind: str | None = None) -> list[dict]:
    path = log_dir / f"events-{rank}.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in found if kind is None or e["event"] == kind]


def batches(log_dir: Path, rank: int = 0) -> list[list[str]]:
    """The micro-batches the process prepared, in order, each as its rows' question ids (a row's joined by '+')."""
    return [["+".join(ids) for ids in e["ids"]] for e in events(log_dir, rank, "batch")]


LOG = {"dir": Path(".")}
"""Where the events of the current run go (several runs in one process each switch it)."""


def install(
    log_dir: Path,
    kill_at_step: int | None = None,
    patch=setattr,
    kill_in_save: str | None = None,
    sigterm_in_final_save: bool = False,
) -> None:
    """Patch the recipe's data path and collator to record into `log_dir` (`patch`: `setattr`, or a
    test's `monkeypatch.setattr` to undo it afterwards)."""
    LOG["dir"] = log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    collate, decode, ids_of = DataCollatorForVisionLanguageModeling.torch_call, data.decode_image, data.question_ids

    def recording_collate(self, examples):
        record(LOG["dir"], "batch", ids=[e["question_ids"] for e in examples], ppid=os.getppid())
        return collate(self, examples)

    def recording_decode(*args, **kwargs):
        record(LOG["dir"], "decoded")
        return decode(*args, **kwargs)

    def recording_ids(row):
        ids = ids_of(row)
        record(LOG["dir"], "read", ids=ids)
        return ids

    patch(DataCollatorForVisionLanguageModeling, "torch_call", recording_collate)
    patch(data, "decode_image", recording_decode)
    patch(data, "question_ids", recording_ids)
    if kill_at_step is not None:
        step_end = CallbackHandler.on_step_end

        def killing_step_end(self, args, state, control, **kwargs):
            if state.global_step == kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            return step_end(self, args, state, control, **kwargs)

        patch(CallbackHandler, "on_step_end", killing_step_end)
    if kill_in_save is not None:
        step, where = kill_in_save.split(":")
        if where == "before_optimizer":  # the weights saved, the optimizer not yet
            save = Trainer._save_optimizer_and_scheduler

            def killing_save(self, output_dir):
                if self.state.global_step == int(step):
                    os.kill(os.getpid(), signal.SIGKILL)
                return save(self, output_dir)

            patch(Trainer, "_save_optimizer_and_scheduler", killing_save)
        else:  # "before_callbacks": the Trainer's save done, no callback's `on_save` run yet
            on_save = CallbackHandler.on_save

            def killing_on_save(self, args, state, control, **kwargs):
                if state.global_step == int(step):
                    os.kill(os.getpid(), signal.SIGKILL)
                return on_save(self, args, state, control, **kwargs)

            patch(CallbackHandler, "on_save", killing_on_save)
    if sigterm_in_final_save:
        save_model = Trainer.save_model

        def signalled_save_model(self, output_dir=None, _internal_call=False):
            if not _internal_call:
                os.kill(os.getpid(), signal.SIGTERM)
            return save_model(self, output_dir, _internal_call)

        patch(Trainer, "save_model", signalled_save_model)


if __name__ == "__main__":
    kill, root = os.environ.get("KILL_AT_STEP"), Path(os.environ["ROW_LOG"])
    runs = " ".join(sys.argv[1:]).split(" :: ") if "::" in sys.argv else [None]
    install(
        root,
        int(kill) if kill else None,
        kill_in_save=os.environ.get("KILL_IN_SAVE"),
        sigterm_in_final_save=bool(os.environ.get("SIGTERM_IN_FINAL_SAVE")),
    )
    for i, run in enumerate(runs):
        if run is not None:
            LOG["dir"] = root / str(i)
            LOG["dir"].mkdir(parents=True, exist_ok=True)
        sft.main(run.split() if run is not None else sys.argv[1:])
