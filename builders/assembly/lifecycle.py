"""A build's life on disk: one build per output at a time, nothing left behind by a dead one.

A build of `out` holds an exclusive `flock` on the hidden `.<out>.lock` beside it, with its
pid written inside, from start to rename. While it holds the lock no other build of `out` is
alive, so every `.<out>.partial-<pid>` folder found then belongs to a killed build and is
removed; a `.<out>.previous-<pid>` folder with no `out` beside it is an output a killed build
had moved aside to swap in its own, and is put back.

`--overwrite` replaces only a folder that a build wrote (`is_build_folder`: its
`build_report.json` says so), never a raw release, a file or `.`; leftovers are found by their
exact name (`leftovers`), never by a glob pattern built from `out`'s name, which may itself hold
`[`, `*` or `?`. An interrupt (Ctrl-C, SIGTERM) that arrives once the output is renamed into place
carries that output as its `written` attribute, so that it can be reported as what it is.

Fault tests stop a real build at a known place (`builders.stop_points`) and kill it there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from builders.assembly.report import BuildError
from builders.files import leftovers
from builders.stop_points import stop_point

REPORT_NAME = "build_report.json"
REPORT_KEYS = {"dataset", "settings", "records_read", "rows_written", "shards"}
"""Keys every report a build saves holds (`BuildReport.to_dict`)."""
log = logging.getLogger("cxr_vqa")


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
                raise OutputBusy(
                    f"{out} is being built by process {holder} (lock {path}); wait for it or stop it"
                ) from None
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
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except BaseException:  # a signal Python raised as the lock is released: remove it still, then go on
            with suppress(FileNotFoundError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)


def _pid_of(folder: Path) -> int | None:
    tail = folder.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def is_build_folder(folder: Path) -> bool:
    """Whether `folder` is a dataset folder a build wrote: its `build_report.json` parses into a build's report."""
    try:
        report = json.loads((Path(folder) / REPORT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(report, dict) and report.keys() >= REPORT_KEYS


def release_files(source: Path) -> list[Path]:
    """Every file under a raw release folder `source` that may be an annotation file, in path order.

    Left out: what builds write (hidden entries such as `.<out>.partial-<pid>/`, `.staging/`,
    locks; any folder a build wrote, `is_build_folder`, so an `--out` inside `--source` is never
    read back) and the synthetic generator's manifest, which describes annotation files and is not one.
    """
    from builders.provenance import MANIFEST_NAME

    found = []
    for folder, subfolders, files in os.walk(source):
        subfolders[:] = [
            name for name in subfolders if not name.startswith(".") and not is_build_folder(Path(folder, name))
        ]
        found += [Path(folder, name) for name in files if not name.startswith(".") and name != MANIFEST_NAME]
    return sorted(path for path in found if path.is_file())


def remove(path: Path) -> bool:
    """Remove a folder or a file; whether it is gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(FileNotFoundError):
            path.unlink()
    return not os.path.lexists(path)


def clean_dead_builds(out: Path) -> list[str]:
    """Remove what killed builds of `out` left beside it; to be called with `out`'s lock held.

    Returns one line per folder removed or restored, for the build report.
    """
    actions = []
    previous = sorted(leftovers(out, "previous"), key=lambda folder: folder.stat().st_mtime)
    if previous and not os.path.lexists(out):
        restored = previous.pop()
        restored.rename(out)
        actions.append(
            f"restored {out.name} from {restored.name}, moved aside by build {_pid_of(restored)} killed while renaming"
        )
    for folder in [*previous, *leftovers(out, "partial")]:
        if folder == partial_path(out):
            continue
        if remove(folder):
            actions.append(f"removed {folder.name}, left by build {_pid_of(folder)} that was killed")
        else:
            actions.append(f"could not remove {folder.name}, left by build {_pid_of(folder)} that was killed")
    for line in actions:
        log.warning("cxr-vqa: %s", line)
    return actions


def not_a_build_folder(folder: Path) -> str | None:
    """Why `folder` is not a dataset folder a build wrote (None when it is one): what `--overwrite` may replace."""
    return None if is_build_folder(folder) else f"no {REPORT_NAME} of a build in it"


Ownership = Callable[[Path], "str | None"]
"""Says why a folder is not one this tool wrote (and may replace), or None when it is."""


def check_replaceable(
    out: Path,
    overwrite: bool,
    owned: Ownership = not_a_build_folder,
    rule: str = "--overwrite replaces only a folder a build wrote",
) -> None:
    """Raise BuildError (one line, saying nothing was changed) unless `out` is absent, or, with `overwrite`,
    a real folder (no link) that `owned` says this tool wrote. To be called before anything is changed."""
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise BuildError(f"{out} already exists; pass --overwrite to replace it")
    why = "a link" if out.is_symlink() else "not a folder" if not out.is_dir() else owned(out)
    if why:
        raise BuildError(f"{rule}, and {out} is not one ({why}): nothing was changed; choose another --out")


_renamed_into_place: set[Path] = set()


def renamed_into_place(out: Path) -> bool:
    """Whether this process's latest `staged_output` of `out` renamed it into place.

    Python handles a signal at its next check, not where the kernel delivered it (on another thread, say
    tqdm's monitor, it may be a few steps later), so a Ctrl-C sent just after the rename can be raised
    once the block has finished; this still tells that the output was whole by then.
    """
    return Path(out).absolute() in _renamed_into_place


@contextmanager
def staged_output(
    out: Path,
    overwrite: bool,
    owned: Ownership = not_a_build_folder,
    rule: str = "--overwrite replaces only a folder a build wrote",
) -> Iterator[tuple[Path, list[str]]]:
    """A fresh folder to build in, renamed to `out` when the block finishes without error.

    Yields the folder and the lines saying what dead builds' leftovers were cleaned. Any
    exception (a signal included) removes the folder; `out` is then as it was. An existing `out`
    is replaced only as `check_replaceable` allows (`owned`: a build's folder unless told otherwise).
    """
    out = Path(out).absolute()
    _renamed_into_place.discard(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        cleaned = clean_dead_builds(out)
        check_replaceable(out, overwrite, owned, rule)
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
        _renamed_into_place.add(out)
        try:
            remove(previous)
            stop_point("written")
        except BaseException as late:
            late.written = out  # what stopped the build came after its output was whole
            raise
