import random

import pytest

from gemex_dataset.scoring import (
    box_iou,
    majority_replies,
    matched_iou,
    random_replies,
    reference_reply,
    score_gemex,
)

from .scoring_fixtures import gemex_rows

FAST = ("rougeL", "bleu1")


def test_iou_and_hungarian_matching():
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(1 / 3)
    assert box_iou([0, 0, 1, 1], [2, 2, 3, 3]) == 0.0
    reference = [[0, 0, 10, 10], [20, 20, 30, 30]]
    assert matched_iou(list(reversed(reference)), reference) == pytest.approx(1.0)
    assert matched_iou(reference[:1], reference) == pytest.approx(0.5)
    assert matched_iou(reference + [[50, 50, 60, 60]], reference) == pytest.approx(2 / 3)
    assert matched_iou([], reference) == 0.0
    predicted = [[0, 0, 10, 12], [0, 0, 10, 10]]
    assert matched_iou(predicted, [[0, 0, 10, 10], [0, 0, 10, 13]]) == pytest.approx((1 + 12 / 13) / 2)


def test_perfect_predictions_score_100_on_every_capped_metric():
    rows = gemex_rows(per_type=15)
    table = score_gemex(rows, {r["question_id"]: reference_reply(r) for r in rows}, metrics=FAST)["table"]
    print({k: {m: round(v, 2) for m, v in e.items() if isinstance(v, float)} for k, e in table.items()})
    for kind, entry in table.items():
        assert entry["failed_extraction"] == 0 and entry["missing"] == 0
        if kind != "open_ended":
            assert entry["A"] == pytest.approx(100)
        for metric in ("V", "rougeL", "bleu1"):
            assert entry[metric] == pytest.approx(100, abs=1e-3), (kind, metric)


@pytest.mark.parametrize("convention", ["norm1000", "qwen2.5-vl", "frame224"])
def test_perfect_boxes_in_other_conventions_lose_only_rounding(convention):
    rows = gemex_rows(per_type=5)
    replies = {r["question_id"]: reference_reply(r, convention) for r in rows}
    table = score_gemex(rows, replies, box_convention=convention, metrics=())["table"]
    assert table["all"]["V"] > 90
    assert score_gemex(rows, replies, box_convention="pixels", metrics=())["table"]["all"]["V"] < 50


def test_seeded_random_guesser_lands_near_chance():
    rows = gemex_rows(per_type=3000, options=4, types=("closed_ended", "single_choice", "multi_choice"), seed=1)
    table = score_gemex(rows, random_replies(rows, seed=7), metrics=())["table"]
    closed, single, multi = (table[k]["A"] for k in ("closed_ended", "single_choice", "multi_choice"))
    print(f"random guesser A: closed {closed:.2f} single {single:.2f} multi {multi:.2f} (paper 48.80, 25.85, 7.50)")
    assert closed == pytest.approx(50, abs=3)
    assert single == pytest.approx(25, abs=2.5)
    assert multi == pytest.approx(100 / 15, abs=1.5)


def test_shuffled_predictions_score_far_below_perfect():
    """Well-formed replies given to the wrong question of the same type: every score must collapse."""
    rows = gemex_rows(per_type=40, options=4, seed=2)
    replies = {}
    rng = random.Random(3)
    for kind in {r["question_type"] for r in rows}:
        group = [r for r in rows if r["question_type"] == kind]
        shuffled = [reference_reply(r) for r in group]
        rng.shuffle(shuffled)
        replies.update({r["question_id"]: reply for r, reply in zip(group, shuffled)})
    table = score_gemex(rows, replies, metrics=FAST)["table"]
    print("shuffled:", {m: round(table["all"][m], 2) for m in ("A", "V", "rougeL", "bleu1")})
    assert table["all"]["failed_extraction"] == 0
    assert (
        table["all"]["A"] < 50 and table["all"]["V"] < 30 and table["all"]["rougeL"] < 50 and table["all"]["bleu1"] < 60
    )


def test_missing_and_unreadable_replies_count_as_wrong():
    rows = gemex_rows(per_type=4, types=("closed_ended", "single_choice"))
    replies = {r["question_id"]: reference_reply(r) for r in rows}
    del replies[rows[0]["question_id"]]
    replies[rows[-1]["question_id"]] = "I cannot tell."
    result = score_gemex(rows, replies, metrics=())
    closed, single = result["table"]["closed_ended"], result["table"]["single_choice"]
    assert closed["missing"] == 1 and closed["A"] == 75 and closed["questions"] == 4
    assert single["failed_extraction"] == 1 and single["A"] == 75
    assert result["per_question"][0]["missing"] and result["per_question"][0]["iou"] == 0


def test_majority_baseline_scores_the_most_common_answer():
    rows = gemex_rows(per_type=200, types=("closed_ended",), seed=4)
    yes = sum(r["answer"] == "Yes." for r in rows) / len(rows)
    table = score_gemex(rows, majority_replies(rows), metrics=())["table"]
    assert table["closed_ended"]["A"] == pytest.approx(100 * max(yes, 1 - yes))


def test_bertscore_of_perfect_predictions_is_100():
    rows = gemex_rows(per_type=2)
    table = score_gemex(rows, {r["question_id"]: reference_reply(r) for r in rows}, metrics=("bertscore",))["table"]
    assert table["all"]["bertscore"] == pytest.approx(100, abs=1e-3)


def test_rows_without_image_size_score_v_in_the_224_frame_or_are_skipped():
    rows = [{**r, "image_width": None, "image_height": None, "boxes": None} for r in gemex_rows(per_type=3)]
    replies = {r["question_id"]: reference_reply(r, "frame224") for r in rows}
    assert score_gemex(rows, replies, box_convention="frame224", metrics=())["table"]["all"]["V"] == pytest.approx(100)
    skipped = score_gemex(rows, replies, box_convention="pixels", metrics=())["table"]["all"]
    assert skipped["V"] is None and skipped["V_skipped"] == len(rows)
