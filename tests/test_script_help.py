"""Every script's `--help` prints its usage and exits 0 (training_recipes/*.py, benchmarks/*.py,
benchmarks/gpu/*.py); a module without a command line imports cleanly. Each runs as the docs and the
GPU kit run it: `python -m <module>` from the repository's root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("training_recipes/*.py", "benchmarks/*.py", "benchmarks/gpu/*.py")
    for p in ROOT.glob(pattern)
    if p.name != "__init__.py"
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs(script):
    path = ROOT / script
    module = ".".join(Path(script).with_suffix("").parts)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if "__main__" in path.read_text():
        assert "usage" in done.stdout.lower(), done.stdout[-500:]
