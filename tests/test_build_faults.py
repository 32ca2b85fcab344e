"""Real faults on real `cxr-vqa build` processes: kills at named points, signals, a full disk, a race.

`CXR_VQA_STOP_AT=<point>` makes the build stop itself there (`builders.stop_points`);
the test then kills or signals the stopped process, so each fault lands where it is named.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def build_args(release, out: Path, *extra: str) -> list[str]:
    return [
        "build",
        "gemex",
        "--source",
        str(release.root / "per_type"),
        "--images",
        str(release.image_root),
        "--out",
        str(out),
        "--image-mode",
        "embed",
        *extra,
    ]


def build_command(release, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cxr_vqa.cli", *build_args(release, out, *extra)]


@pytest.fixture
def cxr_vqa(capsys, caplog):
    """`cxr-vqa ARGV` run by `main` in this process, for what the command decides where no process
    boundary is under test: (exit status, what the command's process writes on stderr). That is the
    lines it prints and its warnings, which Python's last-resort handler writes there (here the test
    run's log capture takes them)."""
    from cxr_vqa.cli import main

    def run(argv: list[str]) -> tuple[int, str]:
        capsys.readouterr()
        caplog.clear()
        status = main(argv)
        warnings = "".join(f"{record.getMessage()}\n" for record in caplog.records if record.levelno >= logging.WARNING)
        return status, warnings + capsys.readouterr().err

    return run


def build_here(cxr_vqa, release, out: Path, *extra: str) -> tuple[int, str]:
    """`cxr-vqa build` in this process: for a build before or after the one whose process is under test."""
    return cxr_vqa(build_args(release, out, *extra))


def quiet_env() -> dict[str, str]:
    """The environment with no stop point and no progress bars where tqdm decides by default."""
    return {k: v for k, v in os.environ.items() if k != "CXR_VQA_STOP_AT"} | {"TQDM_DISABLE": "1"}


def messages(stderr: str) -> list[str]:
    """What the command said on stderr, progress bars left out."""
    return [line for line in re.split(r"[\r\n]", stderr) if line.strip() and not re.match(r"[^|]*: *\d+%\|", line)]


def as_from_a_terminal(preexec_fn=None):
    """Give the child Ctrl-C's default action, as a terminal does.

    A test run started in the background of a non-interactive shell inherits SIGINT ignored, and
    Python keeps an ignored SIGINT ignored, so the build would never see the interrupt under test.
    """

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()

    return prepare


def start(release, out: Path, stop_at: str | None = None, *extra: str, preexec_fn=None, **popen) -> subprocess.Popen:
    env = quiet_env()
    if stop_at:
        env["CXR_VQA_STOP_AT"] = stop_at
    return subprocess.Popen(
        build_command(release, out, *extra),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal(preexec_fn),
        **popen,
    )


def wait_until_stopped(process: subprocess.Popen) -> None:
    """Wait for the process to stop itself at its stop point (state `T` in /proc)."""
    stat = Path(f"/proc/{process.pid}/stat")
    for _ in range(6000):
        if process.poll() is not None:
            pytest.fail(f"the build ended (status {process.returncode}) before its stop point: {process.stderr.read()}")
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.01)
    process.kill()
    pytest.fail("the build never reached its stop point")


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


def build(release, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        build_command(release, out, *extra), env=quiet_env(), capture_output=True, text=True, timeout=300, check=False
    )


def looks_like_a_dataset(folder: Path) -> bool:
    return (
        (folder / "README.md").exists()
        or (folder / "build_report.json").exists()
        or any(folder.glob("data/**/*.parquet"))
    )


@pytest.mark.parametrize("point", ["reading", "shards", "card"])
def test_a_build_killed_at_any_point_leaves_no_dataset_and_the_rerun_cleans_up(gemex_release, tmp_path, point, cxr_vqa):
    out = tmp_path / "gemex"
    process = start(gemex_release, out, point)
    wait_until_stopped(process)
    process.kill()
    process.wait()
    assert not out.exists()
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == [".gemex.lock", f".gemex.partial-{process.pid}"]
    assert not looks_like_a_dataset(tmp_path / leftovers[1]) or point == "card"

    status, stderr = build_here(cxr_vqa, gemex_release, out)
    assert status == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"]
    assert f"removed .gemex.partial-{process.pid}, left by build {process.pid} that was killed" in stderr
    notices = json.loads((out / "build_report.json").read_text())["notices"]
    assert any(f".gemex.partial-{process.pid}" in notice for notice in notices)


def test_a_build_killed_while_renaming_gives_back_the_previous_output(gemex_release, tmp_path, cxr_vqa):
    """Killed between moving the old output aside and moving the new one in: the next build restores the old one."""
    out = tmp_path / "gemex"
    assert build_here(cxr_vqa, gemex_release, out)[0] == 0
    before = (out / "build_report.json").read_bytes()
    process = start(gemex_release, out, "renaming", "--overwrite", "--image-size", "64")
    wait_until_stopped(process)
    process.kill()
    process.wait()
    assert not looks_like_a_dataset(out)
    assert {p.name for p in tmp_path.iterdir()} == {
        ".gemex.lock",
        f".gemex.partial-{process.pid}",
        f".gemex.previous-{process.pid}",
    }

    status, stderr = build_here(cxr_vqa, gemex_release, out)
    assert status == 1 and "already exists" in stderr
    assert "restored gemex" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"]
    assert (out / "build_report.json").read_bytes() == before


def test_a_second_build_into_the_same_out_fails_at_once_naming_the_first(gemex_release, tmp_path, cxr_vqa):
    out = tmp_path / "gemex"
    first = start(gemex_release, out, "reading")
    wait_until_stopped(first)
    second_status, second_stderr = build_here(cxr_vqa, gemex_release, out, "--overwrite")
    first.send_signal(signal.SIGCONT)
    status, stderr = finish(first)
    assert second_status == 1
    assert len(messages(second_stderr)) == 1 and f"being built by process {first.pid}" in second_stderr
    assert status == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"]


@pytest.mark.parametrize(
    "signum, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_sigint_and_sigterm_end_with_one_line_and_remove_the_partial_folder(
    gemex_release, tmp_path, signum, status, word
):
    out = tmp_path / "gemex"
    process = start(gemex_release, out, "shards")
    wait_until_stopped(process)
    process.send_signal(signum)
    process.send_signal(signal.SIGCONT)
    returncode, stderr = finish(process)
    assert returncode == status
    assert len(messages(stderr)) == 1 and word in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_start_up_prints_one_line(gemex_release, tmp_path):
    process = start(gemex_release, tmp_path / "gemex", "start-up")
    wait_until_stopped(process)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGCONT)
    returncode, stderr = finish(process)
    assert returncode == 130
    assert len(messages(stderr)) == 1 and "interrupted" in stderr
    assert list(tmp_path.iterdir()) == []


def shard_checksums(out: Path) -> dict[str, str]:
    from builders.assembly.shards import sha256

    return {str(p.relative_to(out)): sha256(p) for p in sorted(out.glob("data/**/*.parquet"))}


def test_a_file_size_limit_ends_the_build_cleanly_and_keeps_the_previous_output(gemex_release, tmp_path, cxr_vqa):
    """RLIMIT_FSIZE makes the kernel refuse writes past 64 KiB (EFBIG), as a full disk refuses them."""
    out = tmp_path / "gemex"
    assert build_here(cxr_vqa, gemex_release, out, "--image-mode", "none")[0] == 0
    before = shard_checksums(out)

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    process = start(gemex_release, out, None, "--overwrite", preexec_fn=limit_file_size)
    returncode, stderr = finish(process)
    assert returncode == 1
    assert len(messages(stderr)) == 1 and "the disk is full" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"]
    assert shard_checksums(out) == before


def test_a_full_tmpfs_ends_the_build_cleanly_and_keeps_the_previous_output(gemex_release, tmp_path):
    """A 640 KiB tmpfs in a private mount namespace: room for an annotations-only build, not for the images."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode
    ):
        pytest.skip("no user/mount namespaces here to mount a small tmpfs")
    disk, results = tmp_path / "disk", tmp_path / "results"
    disk.mkdir()
    results.mkdir()
    none_build = " ".join(build_command(gemex_release, disk / "gemex", "--image-mode", "none"))
    embed_build = " ".join(build_command(gemex_release, disk / "gemex", "--overwrite"))
    script = (
        f"mount -t tmpfs -o size=640k tmpfs {disk} && {none_build} >/dev/null && "
        f"cp -r {disk}/gemex {results}/before; {embed_build} 2>{results}/stderr; echo $? >{results}/status; "
        f"ls -A {disk} >{results}/listing; cp -r {disk}/gemex {results}/after"
    )
    subprocess.run(["unshare", "-rm", "sh", "-c", script], env=quiet_env(), timeout=300, check=False)
    if not (results / "before").exists():
        pytest.skip("mounting a tmpfs is not permitted here")
    stderr = (results / "stderr").read_text()
    assert (results / "status").read_text().strip() == "1"
    assert len(messages(stderr)) == 1 and "the disk is full" in stderr
    assert (results / "listing").read_text().split() == ["gemex"]
    assert shard_checksums(results / "after") == shard_checksums(results / "before")


@pytest.mark.parametrize("mode", ["embed", "reference", "none"])
def test_a_fifo_among_the_images_is_rejected_and_does_not_hang_the_build(gemex_release, tmp_path, mode):
    images = tmp_path / "files"
    shutil.copytree(gemex_release.image_root, images)
    victim = sorted(images.rglob("*.jpg"))[0]
    victim.unlink()
    os.mkfifo(victim)
    out = tmp_path / "gemex"
    command = build_command(gemex_release, out, "--image-mode", mode)
    command[command.index("--images") + 1] = str(images)
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "build_report.json").read_text())
    fifo_rejects = [r for r in report["rejects"] if "not a regular file (a FIFO)" in r["reason"]]
    if mode == "none":  # annotations only: the rows stay, their boxes in the 224 frame
        assert (
            not fifo_rejects
            and report["notices"]["images unreadable in --image-mode none (boxes left in the 224 frame only)"] == 1
        )
    else:
        assert fifo_rejects and all(str(victim) in r["reason"] and r["field"] == "image_path" for r in fifo_rejects)
    assert report["records_read"] == report["rows_written"] + report["rejected"]


@pytest.fixture(scope="module")
def release_of_thousands(tmp_path_factory):
    """A GEMeX release whose train split is one chunk of over a thousand images: a build reads their headers in worker processes."""
    from gemex_dataset.synthetic.release import generate

    return generate(tmp_path_factory.mktemp("gemex-thousands"), num_images=1100, seed=3, downscale=16)


def descendants(pid: int) -> dict[int, str]:
    """The processes started by `pid` and by its children, with their command lines."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {
        child: (
            Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if Path(f"/proc/{child}/cmdline").exists()
            else ""
        )
        for child in found
    }


def running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stopped_with_header_workers(release, out: Path, **popen) -> tuple[subprocess.Popen, dict[int, str]]:
    """A reference build stopped after its train split, its worker processes (spawned) started."""
    process = start(release, out, "shards", "--image-mode", "reference", **popen)
    wait_until_stopped(process)
    workers = descendants(process.pid)
    assert any("multiprocessing.spawn" in command for command in workers.values()), workers
    return process, workers


def wait_for_exit(pids) -> list[int]:
    """The pids still running after a few seconds."""
    for _ in range(100):
        if not any(map(running, pids)):
            return []
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]


def test_a_killed_build_leaves_no_header_reading_process_behind(release_of_thousands, tmp_path):
    process, workers = stopped_with_header_workers(release_of_thousands, tmp_path / "gemex")
    process.kill()
    process.communicate(timeout=60)  # its output pipes close: no worker holds them open
    assert wait_for_exit(workers) == [], workers
    rerun = build(release_of_thousands, tmp_path / "gemex", "--image-mode", "reference")
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"]


def test_ctrl_c_reaches_the_header_workers_too_and_the_build_still_ends_with_one_line(release_of_thousands, tmp_path):
    """The terminal signals its whole process group: the workers ignore it, the build says it was interrupted."""
    process, workers = stopped_with_header_workers(release_of_thousands, tmp_path / "gemex", start_new_session=True)
    os.killpg(process.pid, signal.SIGINT)
    process.send_signal(signal.SIGCONT)
    returncode, stderr = finish(process)
    assert returncode == 130
    assert len(messages(stderr)) == 1 and "interrupted" in stderr and "Traceback" not in stderr, stderr
    assert wait_for_exit(workers) == []
    assert list(tmp_path.iterdir()) == []


def test_a_script_without_a_main_guard_still_builds_reading_headers_on_threads(release_of_thousands, tmp_path):
    """Each spawned worker runs such a script again: its copy of the build finds the output locked
    and ends, the worker with it, before any batch is queued; the build reads its headers on threads."""
    out = tmp_path / "gemex"
    script = tmp_path / "build_it.py"
    script.write_text(
        "from builders.assembly.settings import BuildSettings\n"
        "from gemex_dataset.build import build_gemex\n"
        f"build_gemex(BuildSettings(source={str(release_of_thousands.root / 'per_type')!r}, out={str(out)!r}, "
        f"images={str(release_of_thousands.image_root)!r}, image_mode='reference'))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=quiet_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "build_report.json").read_text())
    assert any(
        notice.startswith("image headers read on threads: the worker processes stopped") for notice in report["notices"]
    )
    assert report["records_read"] == report["rows_written"] + report["rejected"] and report["rejected"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build_it.py", "gemex"]


def test_a_signal_raised_once_the_output_is_in_place_says_the_build_completed(
    gemex_release, tmp_path, monkeypatch, cxr_vqa
):
    """Ctrl-C sent just after the rename but raised by Python a few steps later (its flag set on another
    thread), as the output's lock is released: the build had completed, and the line says so."""
    from builders.assembly import lifecycle

    lock = lifecycle.output_lock

    @contextlib.contextmanager
    def interrupted_on_release(out):
        with lock(out):
            yield
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle, "output_lock", interrupted_on_release)
    out = tmp_path / "gemex"
    status, stderr = cxr_vqa(build_args(gemex_release, out, "--image-mode", "none"))
    assert status == 130
    assert messages(stderr) == [
        f"cxr-vqa: interrupted (Ctrl-C); it came after the output was complete: {out} is "
        f"written whole (its report: {out / 'build_report.json'})"
    ]
    assert (out / "build_report.json").is_file()


@pytest.mark.parametrize("removed_first", [True, False], ids=["after-unlink", "at-unlink"])
def test_a_signal_raised_as_the_lock_is_released_leaves_no_lock_file(tmp_path, monkeypatch, removed_first):
    """Python raises a late Ctrl-C just after, or instead of, the lock file's removal: it is removed still."""
    from builders.assembly import lifecycle

    unlink = os.unlink
    raised = []

    def interrupted_unlink(path, *args, **kwargs):
        if removed_first or raised:
            unlink(path, *args, **kwargs)
        if not raised:
            raised.append(path)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), lifecycle.output_lock(tmp_path / "gemex"):
        monkeypatch.setattr(lifecycle.os, "unlink", interrupted_unlink)
    monkeypatch.undo()
    assert raised and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_after_the_output_is_written_says_the_build_completed(
    gemex_release, tmp_path, signum, status, cxr_vqa
):
    """The output renamed into place, then Ctrl-C: one line saying so, the output whole."""
    out = tmp_path / "gemex"
    process = start(gemex_release, out, "written", "--image-mode", "none")
    wait_until_stopped(process)
    process.send_signal(signum)
    process.send_signal(signal.SIGCONT)
    returncode, stderr = finish(process)
    assert returncode == status
    assert (
        messages(stderr) == [messages(stderr)[0]] and "after the output was complete" in stderr and str(out) in stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"]
    assert build_here(cxr_vqa, gemex_release, out, "--image-mode", "none", "--overwrite")[0] == 0


# -- what --out may replace -----------------------------------------------------


def copy_release(release, dest: Path) -> Path:
    shutil.copytree(release.root, dest)
    return dest


@pytest.mark.parametrize("where", ["source", "parent", "dot"])
def test_overwrite_never_replaces_the_raw_release(gemex_release, tmp_path, where, cxr_vqa, monkeypatch):
    raw = copy_release(gemex_release, tmp_path / "raw")
    before = sorted(str(p.relative_to(raw)) for p in raw.rglob("*"))
    source = raw / "per_type"
    out = {"source": source, "parent": raw, "dot": Path(".")}[where]
    if where == "dot":
        monkeypatch.chdir(source)
    status, stderr = cxr_vqa(
        ["build", "gemex", "--source", str(source), "--out", str(out), "--image-mode", "none", "--overwrite"]
    )
    assert status == 1 and len(messages(stderr)) == 1, stderr
    assert "would replace the raw release" in stderr
    assert sorted(str(p.relative_to(raw)) for p in raw.rglob("*")) == before


def test_overwrite_replaces_only_a_folder_a_build_wrote(gemex_release, tmp_path, cxr_vqa):
    out = tmp_path / "gemex"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    status, stderr = cxr_vqa(build_args(gemex_release, out, "--image-mode", "none", "--overwrite"))
    assert status == 1 and "replaces only a folder a build wrote" in stderr
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    out.rmdir()
    assert cxr_vqa(build_args(gemex_release, out, "--image-mode", "none"))[0] == 0
    assert cxr_vqa(build_args(gemex_release, out, "--image-mode", "none", "--overwrite"))[0] == 0


def test_an_out_that_is_a_file_is_refused_and_leaves_nothing_behind(gemex_release, tmp_path, cxr_vqa):
    out = tmp_path / "gemex"
    out.write_text("a file")
    for _ in range(2):
        status, stderr = cxr_vqa(build_args(gemex_release, out, "--image-mode", "none", "--overwrite"))
        assert status == 1 and "is not one" in stderr and "killed" not in stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex"] and out.read_text() == "a file"


def test_glob_characters_in_out_touch_no_other_build(gemex_release, tmp_path, cxr_vqa):
    """`gemex[2v]` as a glob matches `gemex2`: another live build's partial folder must survive."""
    other = tmp_path / "gemex2"
    first = start(gemex_release, other, "reading", "--image-mode", "none")
    wait_until_stopped(first)
    result, stderr = build_here(cxr_vqa, gemex_release, tmp_path / "gemex[2v]", "--image-mode", "none")
    assert result == 0, stderr
    assert "removed" not in stderr
    first.send_signal(signal.SIGCONT)
    status, stderr = finish(first)
    assert status == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemex2", "gemex[2v]"]


def test_an_out_inside_the_source_is_not_read_back(gemex_release, tmp_path, cxr_vqa):
    """A rebuild with --out inside --source reads the release, not the previous build's report or card."""
    raw = copy_release(gemex_release, tmp_path / "raw")
    out = raw / "llava" / "built"
    argv = ["build", "gemex", "--source", str(raw / "llava"), "--out", str(out), "--image-mode", "none"]
    status, stderr = cxr_vqa(argv)
    assert status == 0, stderr
    report = json.loads((out / "build_report.json").read_text())
    status, stderr = cxr_vqa([*argv, "--overwrite"])
    assert status == 0, stderr
    again = json.loads((out / "build_report.json").read_text())
    assert (again["records_read"], again["rejected"], again["rows"]) == (
        report["records_read"],
        report["rejected"],
        report["rows"],
    )
    assert not any("built" in reject["file"] for reject in again["rejects"])


def test_a_synthetic_release_built_from_its_root_stays_synthetic(gemex_release, tmp_path, cxr_vqa):
    """The root holds SYNTHETIC_MANIFEST.json: it describes the annotation files and is not one of them."""
    out = tmp_path / "gemex"
    status, stderr = cxr_vqa(
        ["build", "gemex", "--source", str(gemex_release.root), "--out", str(out), "--image-mode", "none"]
    )
    assert status == 0, stderr
    report = json.loads((out / "build_report.json").read_text())
    assert not any("SYNTHETIC_MANIFEST" in reject["file"] for reject in report["rejects"])
    assert report["provenance"]["synthetic"] is True, report["provenance"]
