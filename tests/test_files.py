"""Atomic writes (`builders.files`): a killed writer leaves the old file or none, never a half one.

The kills are real: `cxr-vqa evaluate` and `cxr-vqa preview` run as subprocesses that stop
themselves just before their rename (`CXR_VQA_STOP_AT=atomic-write`) and are SIGKILLed there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from builders.files import atomic_write, write_text

from .test_build_faults import wait_until_stopped


def cxr_vqa(*argv: str, stop_at: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "CXR_VQA_STOP_AT"}
    if stop_at:
        env["CXR_VQA_STOP_AT"] = stop_at
    return subprocess.Popen(
        [sys.executable, "-m", "cxr_vqa.cli", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def killed_at_the_rename(*argv: str) -> int:
    process = cxr_vqa(*argv, stop_at="atomic-write")
    wait_until_stopped(process)
    process.kill()
    process.wait()
    return process.pid


def completed(*argv: str) -> None:
    process = cxr_vqa(*argv)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr


def test_a_killed_evaluate_leaves_the_old_results_or_none(gemex_embed, tmp_path):
    dataset = str(gemex_embed[0])
    scores = tmp_path / "scores.json"
    evaluate = ["evaluate", dataset, "--benchmark", "gemex", "--text-metrics", "", "--out", str(scores)]

    pid = killed_at_the_rename(*evaluate, "--baseline", "majority")
    assert not scores.exists()
    assert [p.name for p in tmp_path.iterdir()] == [f".scores.json.tmp-{pid}"]

    completed(*evaluate, "--baseline", "majority")
    assert [p.name for p in tmp_path.iterdir()] == ["scores.json"]
    before = scores.read_bytes()
    assert json.loads(before)["settings"]["baseline"] == "majority"

    killed_at_the_rename(*evaluate, "--baseline", "random")
    assert scores.read_bytes() == before


def test_a_killed_preview_leaves_no_page(gemex_embed, tmp_path):
    page = tmp_path / "preview.html"
    killed_at_the_rename("preview", str(gemex_embed[0]), "--n", "2", "--out", str(page))
    assert not page.exists()
    completed("preview", str(gemex_embed[0]), "--n", "2", "--out", str(page))
    assert page.read_text().rstrip().endswith("</html>")
    assert [p.name for p in tmp_path.iterdir()] == ["preview.html"]


def test_an_error_while_writing_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    write_text(target, '{"old": true}\n')
    with pytest.raises(RuntimeError, match="stopped"), atomic_write(target) as file:
        file.write('{"new": ')
        raise RuntimeError("stopped half way")
    assert target.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_full_disk_while_writing_a_preview_is_one_line_and_leaves_the_old_file(gemex_embed, tmp_path):
    """RLIMIT_FSIZE of 8 KiB: the kernel refuses the page's writes (EFBIG), as a full disk would."""
    import resource

    page = tmp_path / "preview.html"
    write_text(page, "<p>old</p>\n")
    process = subprocess.run(
        [sys.executable, "-m", "cxr_vqa.cli", "preview", str(gemex_embed[0]), "--n", "4", "--out", str(page)],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 10, 8 << 10)),
        env={k: v for k, v in os.environ.items() if k != "CXR_VQA_STOP_AT"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert process.returncode == 1
    assert process.stderr.splitlines() == [f"cxr-vqa: error: {page}: the disk is full: File too large"]
    assert page.read_text() == "<p>old</p>\n"
    assert [p.name for p in tmp_path.iterdir()] == ["preview.html"]
