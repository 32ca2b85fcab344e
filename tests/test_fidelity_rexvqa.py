"""benchmarks/fidelity_rexvqa.py on a small synthetic release: the key figures in their ranges, no text leak."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import fidelity_rexvqa
from rexvqa_dataset.features import TASKS
from rexvqa_dataset.synthetic.release import generate


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return generate(
        tmp_path_factory.mktemp("fidelity") / "rexvqa", num_studies=600, seed=0, downscale=16, images=False
    ).root


def by_name(figures) -> dict:
    return {f.figure: f for f in figures}


def test_every_figure_is_within_its_range(release):
    figures = fidelity_rexvqa.figures(release)
    assert len(figures) == 19
    assert [f.figure for f in figures if not f.within] == []


def test_key_figures(release):
    figures = by_name(fidelity_rexvqa.figures(release))
    assert figures["negation answers absent from the report, %"].synthetic == 100
    assert abs(figures["task share %: Negation Assessment"].synthetic - 36.5) < 3
    assert abs(figures["test split, % of questions"].synthetic - 6.2) < 1.5
    assert figures["categories"].synthetic >= 30
    assert figures["PatientID/AccessionNumber GRDN+12 [A-Z0-9], %"].synthetic == 100
    assert abs(figures["subcategory = correct option, points above chance"].synthetic) < 3


def test_text_only_classifier_stays_near_the_priors(release):
    figures = by_name(fidelity_rexvqa.text_only_baseline(release))
    accuracy = figures["text-only classifier accuracy on test, %"]
    assert accuracy.within and accuracy.synthetic < 25 + 10 + 5


def test_public_column_reads_the_samples_when_present():
    public = fidelity_rexvqa.public_figures()
    if not fidelity_rexvqa.public_paths():
        assert public == {}
    else:
        assert public["ids"] == 100 and public["uids"] == 100 and 1 <= public["images"] <= 4


def test_a_pixel_only_classifier_reads_the_location_off_the_images(tmp_path):
    """The images carry the labels: a release of mostly location questions, so 200 small studies teach it."""
    shares = dict.fromkeys(TASKS, 0.025) | {"Location and Distribution Assessment": 0.9}
    release = generate(tmp_path / "rexvqa", num_studies=200, seed=0, downscale=16, task_shares=shares).root
    (probe,) = fidelity_rexvqa.image_probe(release)
    assert probe.within, probe
