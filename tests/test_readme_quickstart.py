"""The README's quickstart, run exactly as written: its shell block is read from README.md and run
line by line in an empty folder, `cxr-vqa` being this checkout's command line. It ends in a model
that answers held-out questions above the majority answer: what the quickstart is there to show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
    """The commands of the first shell block under the README's "Quickstart" heading."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the quickstart has no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_the_quickstart_is_a_handful_of_commands_from_synthesize_to_evaluate():
    commands = quickstart_commands()
    assert 4 <= len(commands) <= 8
    assert commands[0].startswith("cxr-vqa synthesize ") and commands[-1].startswith("cxr-vqa evaluate ")
    assert any("benchmarks.probe_model" in c for c in commands) and any("training_recipes.sft" in c for c in commands)


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, line in (
        ("cxr-vqa", f'exec "{sys.executable}" -m cxr_vqa.cli "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
        "TQDM_DISABLE": "1",
    }
    work = tmp_path / "work"
    work.mkdir()
    outputs = []
    for line in quickstart_commands():
        result = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        outputs.append(result.stdout)
    assert (work / "runs" / "probe").is_dir() and (work / "predictions.jsonl").stat().st_size > 0
    table = outputs[-1]
    assert "| Type | Questions | A | Majority A | V |" in table
    questions = len((work / "predictions.jsonl").read_text().splitlines())
    found = re.search(rf"\| all \| {questions} \| ([0-9.]+) \| ([0-9.]+) \|", table)
    assert found, table
    accuracy, majority = map(float, found.groups())
    assert accuracy > majority, f"the quickstart's model does not answer above the majority:\n{table}"


def test_every_page_the_readme_links_to_exists():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
