"""A small synthetic GEMeX release keeps the key figures in their ranges (benchmarks/fidelity_gemex.py),
and a text-only classifier does no better than the answer prior."""

from collections import Counter

import pytest

from benchmarks.fidelity_gemex import SAMPLES, figures, iou, read_split, text_only_baseline
from gemex_dataset.synthetic.release import distinct_question, generate


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
        "distinct reasons share, train",
    ):
        figure = measured[name]
        assert figure.within, figure


def test_text_only_classifier_stays_near_the_prior(release):
    baseline = text_only_baseline(release)
    assert {f.figure.rsplit(", ", 1)[1] for f in baseline} == {"closed_ended", "single_choice", "multi_choice"}
    assert all(f.within for f in baseline), baseline


@pytest.mark.skipif(not (SAMPLES / "test").is_dir(), reason="needs the public GEMeX samples")
def test_one_box_a_region_fits_the_public_boxes(release):
    figure = {f.figure: f for f in figures(release)}["public box IoU with its region's mean box, train"]
    assert figure.within, figure


def test_iou_of_boxes():
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0


def test_no_question_stands_twice_on_an_image_of_one_type(tmp_path):
    root = generate(tmp_path / "gemex", num_images=1000, seed=1, layouts=("per_type",), images=False).root
    for split in ("train", "valid", "test"):
        for qtype, records in read_split(root / "per_type", split).items():
            repeats = Counter((r["image_path"], r["question"]) for r in records)
            assert max(repeats.values()) == 1, (split, qtype, repeats.most_common(1))


def test_a_repeated_wording_is_asked_again():
    asked = iter([{"question": "Is it?"}, {"question": "Is it?"}, {"question": "Is there?"}])
    assert distinct_question(lambda: next(asked), {"Is it?"})["question"] == "Is there?"
