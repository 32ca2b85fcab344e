"""Launch the recipe so that a SIGTERM ends in a complete checkpoint and exit status 0, whatever the launcher.

The recipe saves and exits 0 on SIGTERM (`training_recipes.runtime.preemption`), but launchers stand between
the signal and it:

- `accelerate launch` with one process dies at once (status 143) and leaves the trainer running
  without it; with several it is torch elastic, as `torchrun` is.
- `torchrun` (torch elastic) passes SIGTERM on, exits 1 and SIGKILLs the processes 30 s later, saved or not.
- `srun` passes the signal to each task and waits for them: run the recipe itself as the task
  (`srun python training_recipes/sft.py ...`, one task a GPU); `adopt_slurm_environment` gives each
  task the rank, world size and address torch reads.

`python -m training_recipes.runtime.launch LAUNCHER ARGS...` runs `accelerate launch` or `torchrun` in a
session of its own (a terminal's Ctrl-C, `timeout` or a container stop reach this process, not the
launcher) and passes SIGTERM, SIGINT or SIGHUP on as SIGTERM to the launcher's own children, the
recipe's processes, only; they save, exit 0, and the launcher with them. Its exit status is the launcher's.
The launcher starts with SIGTERM blocked, and its processes inherit the mask: a SIGTERM passed on
before the recipe has installed its handler (while it still imports torch) stays pending until
`Preemption.listening` installs the handler and unblocks it, so a stop at any moment ends in a
checkpoint (a command that never unblocks SIGTERM never receives it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import psutil

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_MASTER_PORT = 29500


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (`gpu[03-04,07],cpu1` -> `gpu03`)."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        raise ValueError(f"SLURM node list {nodelist!r}: no host in it")
    prefix, ranges = match.groups()
    return prefix + (re.split(r"[-,]", ranges)[0] if ranges else "")


def adopt_slurm_environment(environ: os._Environ | dict = os.environ) -> bool:
    """In a task of a multi-task `srun` step that no other launcher set up, the variables torch's
    `env://` rendezvous reads, from SLURM's: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
    `MASTER_ADDR` (the step's first node) and `MASTER_PORT` (29500 unless set). True when it did."""
    tasks = int(environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if tasks <= 1 or "RANK" in environ or "SLURM_PROCID" not in environ:
        return False
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "localhost")
    local_tasks = environ.get("SLURM_STEP_TASKS_PER_NODE", str(tasks)).split("(")[0].split(",")[0]
    environ.update(
        {
            "RANK": environ["SLURM_PROCID"],
            "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
            "WORLD_SIZE": str(tasks),
            "LOCAL_WORLD_SIZE": local_tasks,
            "MASTER_ADDR": environ.get("MASTER_ADDR", first_host(nodelist)),
            "MASTER_PORT": environ.get("MASTER_PORT", str(DEFAULT_MASTER_PORT)),
        }
    )
    return True


def check_world_size(trainer_world_size: int, environ: os._Environ | dict = os.environ) -> None:
    """Stop (one line) when a launcher started several processes but the Trainer sees one in each: every
    process would train alone, all of them into the same `--output_dir`. An FSDP or multi-GPU accelerate
    config on a machine without GPUs does that (transformers runs a CPU process undistributed unless
    `--use_cpu true`, which trains with DDP over gloo and drops FSDP)."""
    launched = int(environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and trainer_world_size != launched:
        raise SystemExit(
            f"launched as {launched} processes, but the Trainer sees {trainer_world_size}: each would train "
            "alone into the same --output_dir (no GPU? pass --use_cpu true for DDP over gloo; FSDP needs GPUs)"
        )


@contextlib.contextmanager
def sigterm_blocked():
    """SIGTERM blocked in this thread while the block runs; a process started in it inherits the mask."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Supervisor:
    """A launcher run in its own session; stop signals go to its children, the recipe's processes. The
    handlers are in place before the launcher starts, and the launcher starts with SIGTERM blocked."""

    def __init__(self, command: list[str]):
        self.launcher: subprocess.Popen | None = None
        self.stopping = False
        self.signalled: set[int] = set()
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.stop)
        with sigterm_blocked():
            self.launcher = subprocess.Popen(command, start_new_session=True)

    def stop(self, signum, frame) -> None:
        if not self.stopping:
            print(
                f"launch: {signal.Signals(signum).name}: SIGTERM to the recipe's processes, "
                "waiting for their checkpoint",
                file=sys.stderr,
                flush=True,
            )
        self.stopping = True
        self.pass_on()

    def pass_on(self) -> None:
        """SIGTERM to each child of the launcher not yet sent one (a process may start after the signal)."""
        if self.launcher is None:  # signalled before it started: `wait` passes the signal on
            return
        try:
            children = psutil.Process(self.launcher.pid).children()
        except psutil.NoSuchProcess:
            return
        for child in children:
            if child.pid not in self.signalled:
                self.signalled.add(child.pid)
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(signal.SIGTERM)

    def wait(self) -> int:
        while (code := self.launcher.poll()) is None:
            if self.stopping:
                self.pass_on()
            time.sleep(0.5)
        return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training_recipes.runtime.launch",
        description="Run a launcher so that SIGTERM, SIGINT or SIGHUP ends the recipe in a complete "
        "checkpoint and exit status 0: the signal goes, as SIGTERM, to the launcher's children only.",
        epilog="e.g. python -m training_recipes.runtime.launch torchrun --nproc_per_node 8 training_recipes/sft.py ...",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="accelerate launch ... or torchrun ..., as usual")
    command = parser.parse_args(argv).command
    if not command:
        parser.error("give the launcher command (accelerate launch ... or torchrun ...)")
    return Supervisor(command).wait()


if __name__ == "__main__":
    sys.exit(main())
