"""A build's life on disk: one build per output at a time, nothing left behind by a dead one.

A build of `out` holds an exclusive `flock` on the hidden `.<out>.lock` beside it, with its
pid written inside, from start to rename. While it holds the lock no other build of `out` is
alive, so every `.<out>.partial-<pid>` folder found then belongs to a killed build and is
removed; a `.<out>.previous-<pid>` folder with no `out` beside it is an output a killed build
had moved aside to swap in its own, and is put back.

`CXR_VQA_STOP_AT=<point>` makes the process stop itself (SIGSTOP) when it reaches `point`
(`start-up`, `reading`, `shards`, `card`, `renaming`, `atomic-write`), so fault tests can kill a real
build at a known place.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from builders.assembly.report import BuildError

STOP_AT_ENV = "CXR_VQA_STOP_AT"
STOP_POINTS = ("start-up", "reading", "shards", "card", "renaming", "atomic-write")
log = logging.getLogger("cxr_vqa")


def stop_point(point: str) -> None:
    """Stop this process here (SIGSTOP) when `CXR_VQA_STOP_AT` names `point`; otherwise nothing."""
    if os.environ.get(STOP_AT_ENV) == point:
        os.environ.pop(STOP_AT_ENV)
        os.kill(os.getpid(), signal.SIGSTOP)


class OutputBusy(BuildError):
    """Another live build holds the output's lock."""


def lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def partial_path(out: Path, pid: int | None = None) -> Path:
    return out.parent / f".{out.name}.partial-{os.getpid() if pid is None else pid}"


def previous_path(out: Path, pid: int | None = None) -> Path:
    return out.parent / f".{out.name}.previous-{os.getpid() if pid is None else pid}"


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold `out`'s lock for the block; fail at once, naming the holder's pid, if a live build holds it.

    The lock file is removed on release. A build that opened it just before, and then
    locks a file no longer at that path, sees the inode changed and opens it afresh.
    """
    path = lock_path(out)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise OutputBusy(f"{out} is being built by process {holder} (lock {path}); wait for it or stop it") from None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _pid_of(folder: Path) -> int | None:
    tail = folder.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def clean_dead_builds(out: Path) -> list[str]:
    """Remove what killed builds of `out` left beside it; to be called with `out`'s lock held.

    Returns one line per folder removed or restored, for the build report.
    """
    actions = []
    previous = sorted(out.parent.glob(f".{out.name}.previous-*"), key=lambda folder: folder.stat().st_mtime)
    if previous and not out.exists():
        restored = previous.pop()
        restored.rename(out)
        actions.append(f"restored {out.name} from {restored.name}, moved aside by build {_pid_of(restored)} killed while renaming")
    for folder in [*previous, *sorted(out.parent.glob(f".{out.name}.partial-*"))]:
        if folder == partial_path(out):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        actions.append(f"removed {folder.name}, left by build {_pid_of(folder)} that was killed")
    for line in actions:
        log.warning("cxr-vqa: %s", line)
    return actions


@contextmanager
def staged_output(out: Path, overwrite: bool) -> Iterator[tuple[Path, list[str]]]:
    """A fresh folder to build in, renamed to `out` when the block finishes without error.

    Yields the folder and the lines saying what dead builds' leftovers were cleaned. Any
    exception (a signal included) removes the folder; `out` is then as it was.
    """
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        cleaned = clean_dead_builds(out)
        if out.exists() and not overwrite:
            raise BuildError(f"{out} already exists; pass --overwrite to replace it")
        partial = partial_path(out)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            yield partial, cleaned
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        previous = previous_path(out)
        if out.exists():
            out.rename(previous)
        stop_point("renaming")
        partial.rename(out)
        shutil.rmtree(previous, ignore_errors=True)
