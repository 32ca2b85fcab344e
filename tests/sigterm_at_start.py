"""`python tests/sigterm_at_start.py <sft.py arguments>`, run under `python -m training_recipes.runtime.launch`:
before anything of the recipe is imported, rank 0 sends SIGTERM to `launch`, and each process waits
until the SIGTERM `launch` passes on to it is pending (held by the blocked mask it started with; a
process that does not block it dies of it here), then runs `tests/row_recorder.py` with the arguments."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path

import psutil

RECORDER = str(Path(__file__).with_name("row_recorder.py"))


def supervisor() -> psutil.Process:
    return next(p for p in psutil.Process().parents() if "training_recipes.runtime.launch" in p.cmdline())


if __name__ == "__main__":
    if os.environ.get("RANK", "0") == "0":
        supervisor().send_signal(signal.SIGTERM)
    for _ in range(1200):  # a minute at most: the run then goes on and its test fails
        if signal.SIGTERM in signal.sigpending():
            break
        time.sleep(0.05)
    sys.argv = [RECORDER, *sys.argv[1:]]
    runpy.run_path(RECORDER, run_name="__main__")
