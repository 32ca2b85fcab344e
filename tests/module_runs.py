"""Several `python -m <module> ARGS...` runs in one fresh interpreter, each as `python -m` runs it.

A test that checks what a script's command line prints and how it exits needs a process that is
not pytest's (no test's imports, patches or state), but not one per script: each recipe's
interpreter spends seconds importing torch, transformers and TRL. Here one child imports them once
and runs every module through `runpy` under `__main__`, as `python -m` does, with its own argv,
standard output and standard error, and the exit status the interpreter would give:
`SystemExit`'s code, 1 and the message for a text, 1 and the traceback for an uncaught exception.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ModuleRun:
    module: str
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_modules(
    runs: list[tuple[str, list[str]]], cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600
) -> list[ModuleRun]:
    """Each (module, args) run in turn in one child interpreter started in `cwd` with `env`
    (default: this one's, with the checkout on PYTHONPATH)."""
    env = env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-m", "tests.module_runs"],
        input=json.dumps(runs),
        cwd=cwd,
        env={**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"the module runner itself failed:\n{child.stderr[-3000:]}")
    return [ModuleRun(**result) for result in json.loads(child.stdout.splitlines()[-1])]


def run_as_main(module: str, args: list[str]) -> dict:
    """One module run as `python -m module args...`: its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    saved_argv = sys.argv
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
                if exit_.code is not None and not isinstance(exit_.code, int):
                    print(exit_.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - the interpreter's own last resort: print the traceback, exit 1
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved_argv
    return {"module": module, "args": args, "returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    results = [run_as_main(module, args) for module, args in json.load(sys.stdin)]
    sys.stdout.write("\n" + json.dumps(results) + "\n")
