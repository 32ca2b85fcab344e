"""Side environments for other trainers (LLaMA-Factory, ms-swift), whose pins are not ours.

Each is a virtual environment made from a pins file in `tests/trainer_envs/` and kept under
``$CXR_VQA_SIDE_ENVS`` (default ``~/.cache/cxr-vqa/side-envs``), in a folder named by a hash of the
file: made once (minutes), reused by every run while the pins stay the same. The file's first line
is installed alone (the local CPU torch), and no later install may replace it; a line starting
``--no-deps`` is installed without its dependencies.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

PINS = Path(__file__).parent / "trainer_envs"
COMPLETE = ".complete"


def cache_root() -> Path:
    return Path(os.environ.get("CXR_VQA_SIDE_ENVS", Path.home() / ".cache" / "cxr-vqa" / "side-envs"))


def requirements(pins: Path) -> list[str]:
    return [line.strip() for line in pins.read_text().splitlines() if line.strip() and not line.startswith("#")]


def side_env(tool: str) -> Path:
    """The python of `tool`'s environment, made first when missing (one maker at a time, by a file lock)."""
    pins = PINS / f"{tool}.txt"
    folder = cache_root() / f"{tool}-{hashlib.sha256(pins.read_bytes()).hexdigest()[:16]}"
    python = folder / "bin" / "python"
    if (folder / COMPLETE).is_file():
        return python
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / COMPLETE).is_file():
            make(folder, requirements(pins))
    return python


def make(folder: Path, lines: list[str]) -> None:
    """A fresh environment at `folder` holding `lines`; the failing pip's last lines in the error."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    first, rest = lines[0], lines[1:]
    constraint = folder / "constraints.txt"
    constraint.write_text(first + "\n")
    steps = [[first]]
    steps += [["--no-deps", *line.split()[1:]] for line in rest if line.startswith("--no-deps")]
    steps.append(["-c", str(constraint), *(line for line in rest if not line.startswith("--no-deps"))])
    for step in steps:
        done = subprocess.run([*pip, *step], capture_output=True, text=True, check=False)
        if done.returncode:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"{folder}: pip install {' '.join(step)} failed:\n{tail}")
    (folder / COMPLETE).write_text("\n".join(lines) + "\n")


def run_in(tool: str, script: str, *args: str, cwd: Path | None = None, env: dict | None = None) -> str:
    """`tests/trainer_envs/<script>` run by `tool`'s python, without our package on its path; its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(side_env(tool)), str(PINS / script), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1", **(env or {})},
        check=False,
        timeout=600,
    )
    if done.returncode:
        raise AssertionError(f"{script} failed in {tool}'s environment:\n{done.stderr[-3000:]}")
    return done.stdout
