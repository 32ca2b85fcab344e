"""How a build reads its images: the same on threads and in worker processes, a chunk ahead."""

from __future__ import annotations

import pickle
import threading

import pytest

from builders.assembly.image_source import ImageReader, ImageSource
from builders.assembly.settings import BuildSettings
from builders.images import ImageError


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A small synthetic GEMeX release with one truncated image of its own."""
    from gemex_dataset.synthetic.release import generate

    release = generate(tmp_path_factory.mktemp("release"), num_images=8, seed=11)
    complete = sorted(release.image_root.rglob("*.jpg"))[0]
    data = complete.read_bytes()
    complete.with_name("truncated.jpg").write_bytes(data[: len(data) // 2])
    return release


def source(release, tmp_path, mode: str = "reference") -> ImageSource:
    return ImageSource(
        BuildSettings(source=release.root, out=tmp_path / "out", images=release.image_root, image_mode=mode)
    )


def released_paths(release) -> list[str]:
    """The release's image paths as its annotations name them (one truncated image among them), and two that cannot be used."""
    paths = sorted(p.relative_to(release.image_root).as_posix() for p in release.image_root.rglob("*.jpg"))
    return paths + ["p10/missing.jpg", "../outside.jpg"]


def described(images: list) -> list:
    return [(type(i).__name__, i.path, i.problem, i.reason) if isinstance(i, ImageError) else i for i in images]


def test_a_reader_survives_pickling_as_it_must_to_reach_a_worker_process(release, tmp_path):
    reader = source(release, tmp_path).reader
    copy = pickle.loads(pickle.dumps(reader))
    assert copy == reader and isinstance(copy, ImageReader)
    path = released_paths(release)[0]
    assert copy.read(path) == reader.read(path)


@pytest.mark.parametrize("mode", ["reference", "none"])
def test_worker_processes_read_what_threads_read_and_count_the_same_provenance(release, tmp_path, mode):
    paths = released_paths(release)
    on_threads, in_processes = source(release, tmp_path, mode), source(release, tmp_path, mode)
    in_processes.PROCESS_MIN = 1
    try:
        [(_, threaded)] = on_threads.chunks_with_images([paths], list)
        [(_, processed)] = in_processes.chunks_with_images([paths], list)
        assert in_processes.processes is not None and on_threads.processes is None
    finally:
        on_threads.close()
        in_processes.close()
    assert described(processed) == described(threaded)
    reasons = [i.reason for i in threaded if isinstance(i, ImageError)]
    assert reasons == (["truncated", "missing", "path_escape"] if mode == "reference" else ["missing", "path_escape"])
    assert in_processes.provenance.summary() == on_threads.provenance.summary()
    assert on_threads.provenance.images == len(paths) - len(reasons)


def test_the_next_chunks_images_are_being_read_while_a_chunk_is_used(release, tmp_path):
    paths = released_paths(release)[:9]
    chunks = [paths[0:3], paths[3:6], paths[6:9]]
    pulled = []

    def each_chunk():
        for k, chunk in enumerate(chunks):
            pulled.append(k)
            yield chunk

    images = source(release, tmp_path)
    try:
        for k, (chunk, loaded) in enumerate(images.chunks_with_images(each_chunk(), list)):
            assert chunk == chunks[k] and [image.path for image in loaded] == [images.path(p) for p in chunk]
            assert pulled == list(range(min(k + 2, len(chunks))))  # the next chunk was taken, its images submitted
    finally:
        images.close()


def test_embedded_images_are_not_held_a_chunk_at_a_time(release, tmp_path):
    images = source(release, tmp_path, "embed")
    with pytest.raises(ValueError, match="load_ahead"):
        next(images.chunks_with_images([["a.jpg"]], list))
    images.close()


def test_batches_no_worker_has_started_are_read_by_the_build_itself(release, tmp_path):
    """The build would otherwise wait on busy workers: here the only reader thread is held the whole time."""
    paths = released_paths(release)
    images = source(release, tmp_path)
    held = threading.Event()
    images.threads.submit(held.wait)
    release_later = threading.Timer(20, held.set)  # waiting on the thread would end here, too late
    release_later.start()
    try:
        [(_, loaded)] = images.chunks_with_images([paths], list)
        assert not held.is_set()  # read while the reader thread was still held
        assert described(loaded) == described(images.reader.read_all(paths))
    finally:
        release_later.cancel()
        held.set()
        images.close()
