"""Files written whole or not at all: results, predictions, previews, cards.

A file is written under a hidden temporary name in its own folder (`.<name>.tmp-<pid>`),
flushed to disk, then renamed over the target (`os.replace`, atomic on POSIX). A process
killed at any moment leaves either the previous file or no file, never a half-written one
under the real name; the temporary files of dead processes are removed by the next write
to the same target. Fault tests stop a write just before its rename (`builders.stop_points`: `atomic-write`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from builders.stop_points import stop_point


def leftovers(path: Path, kind: str) -> list[Path]:
    """The `.<name>.<kind>-<pid>` entries beside `path`, matched by exact name (no glob: `path`'s name may hold `[`)."""
    prefix = f".{path.name}.{kind}-"
    if not path.parent.is_dir():
        return []
    return sorted(
        entry
        for entry in path.parent.iterdir()
        if entry.name.startswith(prefix) and entry.name[len(prefix) :].isdigit()
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _temp_path(path: Path, pid: int) -> Path:
    return path.parent / f".{path.name}.tmp-{pid}"


def remove_dead_temps(path: Path) -> None:
    """Remove what writers of `path` killed mid-write left behind."""
    for temp in leftovers(path, "tmp"):
        pid = int(temp.name.rsplit("-", 1)[-1])
        if pid != os.getpid() and not _alive(pid):
            temp.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder; the rename is still atomic
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write `path`'s new content at, moved onto `path` when the block ends without error.

    For writers that take a path (Pillow, pyarrow); the writer must have closed the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(path)
    temp = _temp_path(path, os.getpid())
    try:
        yield temp
        with open(temp, "rb+") as written:
            os.fsync(written.fileno())
        stop_point("atomic-write")
        os.replace(temp, path)
    except OSError as err:
        temp.unlink(missing_ok=True)
        if err.filename is None and err.errno is not None:  # a failed write names no file: name the target
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


@contextmanager
def atomic_write(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO]:
    """An open file whose content replaces `path` only once the block has finished without error."""
    with atomic_path(path) as temp:
        mode = "wb" if binary else "w"
        with open(temp, mode, **({} if binary else {"encoding": "utf-8", "newline": ""})) as file:
            yield file


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_write(path) as file:
        file.write(text)
