"""Every script's `--help` prints its usage and exits 0 (training_recipes/*.py, benchmarks/*.py,
benchmarks/gpu/*.py); a module without a command line imports cleanly. Each runs as the docs and the
GPU kit run it, `python -m <module>` from the repository's root, all in one fresh interpreter
(`tests.module_runs`) rather than one each: they share their seconds of torch and transformers imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.module_runs import ROOT, ModuleRun, run_modules

SCRIPTS = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("training_recipes/*.py", "benchmarks/*.py", "benchmarks/gpu/*.py")
    for p in ROOT.glob(pattern)
    if p.name != "__init__.py"
)


def module_of(script: str) -> str:
    return ".".join(Path(script).with_suffix("").parts)


@pytest.fixture(scope="module")
def help_runs() -> dict[str, ModuleRun]:
    return {run.module: run for run in run_modules([(module_of(script), ["--help"]) for script in SCRIPTS])}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs(script, help_runs):
    done = help_runs[module_of(script)]
    assert done.returncode == 0, done.stderr[-2000:]
    if "__main__" in (ROOT / script).read_text():
        assert "usage" in done.stdout.lower(), done.stdout[-500:]
