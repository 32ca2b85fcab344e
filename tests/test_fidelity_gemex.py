"""A small synthetic GEMeX release keeps the key figures in their ranges (benchmarks/fidelity_gemex.py),
and a text-only classifier does no better than the answer prior."""

import pytest

from benchmarks.fidelity_gemex import figures, text_only_baseline
from gemex_dataset.synthetic import generate


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return generate(
        tmp_path_factory.mktemp("fidelity") / "gemex",
        num_images=300,
        seed=1,
        downscale=32,
        layouts=("per_type",),
        images=False,
    ).root


def test_key_figures_within_their_ranges(release):
    measured = {f.figure: f for f in figures(release)}
    for name in (
        "boxes per question, open_ended",
        "boxes per question, multi_choice",
        "content type abnormality share",
        "content type finding share",
        "train questions per image",
        "multi-choice correct options, mean",
        "single-choice with 4 options share",
        "closed-ended Yes. share",
        "region bilateral lung share",
        "region cardiac region share",
        "distinct question share",
        "reason length median",
        "healthy image share",
        "most boxes on a question",
    ):
        figure = measured[name]
        assert figure.within, figure


def test_text_only_classifier_stays_near_the_prior(release):
    baseline = text_only_baseline(release)
    assert {f.figure.rsplit(", ", 1)[1] for f in baseline} == {"closed_ended", "single_choice", "multi_choice"}
    assert all(f.within for f in baseline), baseline
