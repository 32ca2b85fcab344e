"""A build's images: released paths resolved under the image root, then loaded in the build's mode.

Two ways of loading, for two kinds of work:

- Embedding decodes and encodes pixels, which Pillow does outside the GIL: threads, an image at
  a time, a few ahead of the one being written (`ImageSource.load_ahead`).
- Reading headers (`reference`, and `none` given `--images`) is mostly Pillow's Python code,
  under the GIL: threads beside the build's own Python work made each header read slower, not
  faster. A chunk's headers are read in worker processes instead, while the build writes the
  chunk before (`ImageSource.chunks_with_images`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from builders.assembly.settings import BuildSettings
from builders.images import ImageError, StoredImage, embed_image, header_image, reference_image, resolve_image_path
from builders.provenance import Provenance

log = logging.getLogger("cxr_vqa")
Loaded = StoredImage | ImageError
Batch = tuple[list[str], Future[list[Loaded]]]  # released paths, and the future of their images
Chunk = TypeVar("Chunk")


@dataclass(frozen=True)
class ImageReader:
    """How one build reads its images. Picklable, so that a worker process reads them exactly as the build would."""

    root: str
    mode: str  # an image mode: embed, reference or none
    image_ext: str | None = None
    allowed_root: str | None = None
    max_side: int | None = None
    keep_16bit: bool = False

    @classmethod
    def for_build(cls, settings: BuildSettings, allowed_root: Path | None = None) -> ImageReader:
        return cls(
            os.path.abspath(settings.images),
            settings.image_mode,
            settings.image_ext,
            None if allowed_root is None else str(allowed_root),
            settings.image_size,
            settings.keep_16bit,
        )

    def path(self, relative: str) -> str:
        return resolve_image_path(self.root, relative, self.image_ext, self.allowed_root)

    def read(self, relative: str) -> Loaded:
        """The image for one released path, or why it cannot be used."""
        try:
            path = self.path(relative)
            if self.mode == "embed":
                return embed_image(path, self.max_side, self.keep_16bit)
            if self.mode == "reference":
                return reference_image(path)
            return header_image(path)
        except ImageError as err:
            return err

    def read_all(self, relatives: list[str]) -> list[Loaded]:
        return [self.read(relative) for relative in relatives]


WATCH_SECONDS = 0.2
"""How often a worker checks that its build is still alive."""


def _start_worker(build_pid: int) -> None:
    """Ctrl-C reaches every process of the terminal's group: the build reports it, its workers stay quiet.
    A killed build cannot stop its workers, so each watches for the build to be gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_build, args=(build_pid,), name="build-watch", daemon=True).start()


def _exit_with_build(build_pid: int) -> None:
    """Leave once the build has died. A worker is the build's child (spawned), and is handed to
    another parent the moment the build exits, killed or not yet reaped."""
    while os.getppid() == build_pid:
        time.sleep(WATCH_SECONDS)
    os._exit(1)


class ImageSource:
    """Loads a build's images (`ImageReader`) and counts each one in its provenance."""

    AHEAD = 16
    """Images loaded ahead of the one being used: enough to keep the readers busy, few enough to keep memory flat."""
    PREFETCH = 64
    """Images whose files the kernel is asked to read into the page cache ahead of their loading (embed mode)."""
    PROCESS_MIN = 1024
    """Fewest headers in one request that are read in worker processes: starting them (about half
    a second) pays off only where there are thousands of images; fewer are read on threads."""
    PROCESS_BATCH = 256
    """Headers one worker reads per task: large enough that the pickling is a small part of it."""

    def __init__(self, settings: BuildSettings, allowed_root: Path | None = None, provenance: Provenance | None = None):
        self.reader = ImageReader.for_build(settings, allowed_root)
        self.num_proc = settings.num_proc
        self.provenance = provenance or Provenance()
        self.threads = ThreadPoolExecutor(settings.num_proc, thread_name_prefix="image-reader")
        self.processes: ProcessPoolExecutor | None = None
        self.workers_failed: str | None = None  # why headers went back to threads, for the build report

    def path(self, relative: str) -> str:
        return self.reader.path(relative)

    def counted(self, image: Loaded) -> Loaded:
        if isinstance(image, StoredImage):
            self.provenance.image(image.path, image.tag)
        return image

    def load(self, relative: str) -> Loaded:
        """The image for one released path, or why it cannot be used."""
        return self.counted(self.reader.read(relative))

    def prefetch(self, relative: str) -> None:
        """Ask the kernel to start reading the file into the page cache (`POSIX_FADV_WILLNEED`).

        The disk then reads ahead with no thread waiting on it, and the load that follows reads
        from memory; a file that cannot be opened (or a FIFO) is left for `load` to report.
        """
        try:
            fd = os.open(self.path(relative), os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ImageError):
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # a folder or a pipe: nothing to read ahead
        finally:
            os.close(fd)

    def load_ahead(self, relatives: Iterable[str]) -> Iterator[Loaded]:
        """The images of `relatives`, in order, each read while the ones before it are being used."""
        relatives = list(relatives)
        prefetch = self.PREFETCH > 0 and self.reader.mode == "embed" and hasattr(os, "posix_fadvise")
        for relative in relatives[: self.PREFETCH] if prefetch else []:
            self.prefetch(relative)
        in_flight = deque(self.threads.submit(self.load, r) for r in relatives[: self.AHEAD])
        for k in range(len(relatives)):
            image = in_flight.popleft().result()
            if k + self.AHEAD < len(relatives):
                in_flight.append(self.threads.submit(self.load, relatives[k + self.AHEAD]))
            if prefetch and k + self.PREFETCH < len(relatives):
                self.prefetch(relatives[k + self.PREFETCH])
            yield image

    def chunks_with_images(
        self, chunks: Iterable[Chunk], paths_of: Callable[[Chunk], list[str]]
    ) -> Iterator[tuple[Chunk, list[Loaded]]]:
        """Each chunk with the images of its `paths_of`, loaded, in that order; the next chunk's load while this one is used.

        For headers only: a chunk's images are all held at once, which embedded bytes must not be.
        """
        if self.reader.mode == "embed":
            raise ValueError("chunks_with_images reads headers; embedded images load an image at a time (load_ahead)")
        pending: tuple[Chunk, list[Batch]] | None = None
        for chunk in chunks:
            started = (chunk, self.start_loading(paths_of(chunk)))
            if pending is not None:
                yield pending[0], self.finish_loading(pending[1])
            pending = started
        if pending is not None:
            yield pending[0], self.finish_loading(pending[1])

    def start_loading(self, relatives: list[str]) -> list[Batch]:
        """`relatives` in batches, each submitted: to threads for a few, to worker processes for many."""
        processes = self.worker_processes() if len(relatives) >= self.PROCESS_MIN else None
        executor = processes or self.threads
        size = self.PROCESS_BATCH if processes else max(1, -(-len(relatives) // self.num_proc))
        return [
            (batch, executor.submit(self.reader.read_all, batch))
            for batch in (relatives[k : k + size] for k in range(0, len(relatives), size))
        ]

    def finish_loading(self, batches: list[Batch]) -> list[Loaded]:
        """The images of `batches`, in order. The build would otherwise wait here, so it reads the
        batches no worker has started yet itself, from the last one back, while the workers go on from the first."""
        read_here = {
            k: self.reader.read_all(batch)
            for k, (batch, future) in reversed(list(enumerate(batches)))
            if future.cancel()
        }
        return [
            self.counted(image)
            for k, (batch, future) in enumerate(batches)
            for image in (read_here[k] if k in read_here else self.worker_result(batch, future))
        ]

    def worker_result(self, batch: list[str], future: Future[list[Loaded]]) -> list[Loaded]:
        """A batch's images from its worker; read here if a worker process was killed."""
        try:
            return future.result()
        except BrokenProcessPool as err:
            self.workers_stopped(err)
            return self.reader.read_all(batch)

    def worker_processes(self) -> ProcessPoolExecutor | None:
        """The worker processes, started on first use; None (headers then go to threads) if they cannot start.

        A first task waits for them to be up: a script that calls a build without an `if __name__
        == "__main__":` guard is run again by each spawned worker, whose copy of the build finds
        the output locked and ends, breaking the pool before any real batch is queued.
        """
        if self.processes is None and not self.workers_failed:
            # Spawned, not forked: the build has threads of its own (and Arrow's), which a forked
            # child would inherit half-copied; and not from a fork server, whose children are not the build's.
            self.processes = ProcessPoolExecutor(
                self.num_proc,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
            try:
                self.processes.submit(os.getpid).result()
            except BrokenProcessPool as err:
                self.workers_stopped(err)
        return None if self.workers_failed else self.processes

    def workers_stopped(self, err: BrokenProcessPool) -> None:
        if not self.workers_failed:
            self.workers_failed = f"image headers read on threads: the worker processes stopped ({err})"
            log.warning("cxr-vqa: %s", self.workers_failed)

    def close(self) -> None:
        self.threads.shutdown(cancel_futures=True)
        if self.processes is not None:
            self.processes.shutdown(cancel_futures=True)
