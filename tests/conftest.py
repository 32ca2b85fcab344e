import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # A worker per core (`pytest -n auto`): torch's and BLAS's thread pools, sized to every core, would
    # otherwise put each worker's (and its subprocesses') threads on the other's core to spin there.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--samples", default=None, help="the real public samples folder (../shared/samples) for the conformance tests"
    )


def pytest_collection_modifyitems(config, items):
    """The files holding the suite's longest tests (marked `slow`) run first: under pytest-xdist
    (`-n auto --dist loadfile`, as CI runs it) a worker that started one last would end the run alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def samples_dir(request) -> Path:
    value = request.config.getoption("--samples") or os.environ.get("CXR_VQA_SAMPLES")
    if not value:
        pytest.skip("conformance test skipped: pass --samples ../shared/samples (or set CXR_VQA_SAMPLES) to run it")
    path = Path(value)
    if not path.is_dir():
        pytest.fail(f"--samples {path}: no such folder")
    return path


@pytest.fixture(scope="session")
def gemex_release(tmp_path_factory):
    from gemex_dataset.synthetic.release import generate

    return generate(tmp_path_factory.mktemp("gemex-release"), num_images=16, seed=7)


@pytest.fixture(scope="session")
def gemex_embed(gemex_release, tmp_path_factory):
    """A built GEMeX folder in embed mode, and its report."""
    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex

    out = tmp_path_factory.mktemp("gemex-built") / "gemex"
    report = build_gemex(
        BuildSettings(
            source=gemex_release.root / "per_type", out=out, images=gemex_release.image_root, image_mode="embed"
        )
    )
    return out, report


@pytest.fixture(scope="session")
def gemex_embed_112(gemex_release, tmp_path_factory) -> Path:
    """A GEMeX embed build at 112 px whose per-image conversations are cut at 300 tokens (the tiny models'
    short context), shared read-only by the training tests."""
    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex

    out = tmp_path_factory.mktemp("gemex-112") / "gemex"
    build_gemex(
        BuildSettings(
            source=gemex_release.root / "per_type",
            out=out,
            images=gemex_release.image_root,
            image_mode="embed",
            image_size=112,
            conversation_tokens=300,
        )
    )
    return out


@pytest.fixture(scope="session")
def rexvqa_release(tmp_path_factory):
    """A 12-study ReXVQA release with images (seed 3), shared read-only by the modules that build or read it."""
    from rexvqa_dataset.synthetic.release import generate

    return generate(tmp_path_factory.mktemp("rexvqa-release"), num_studies=12, seed=3)


@pytest.fixture(params=["threads", "worker processes"])
def header_readers(request, monkeypatch):
    """Where a build reads image headers: on threads (a few per chunk, as in these small releases) or
    in worker processes (thousands per chunk; here for any number). Checks after the test that the
    build really read them there."""
    from builders.assembly.image_source import ImageSource

    started = []
    if request.param == "worker processes":
        monkeypatch.setattr(ImageSource, "PROCESS_MIN", 1)
    start = ImageSource.worker_processes
    monkeypatch.setattr(ImageSource, "worker_processes", lambda self: started.append(self) or start(self))
    yield request.param
    assert bool(started) == (request.param == "worker processes")
