import random

import pytest

from rexvqa_dataset.scoring import TASKS, majority_replies, random_replies, reference_reply, score_rexvqa

from .scoring_fixtures import rexvqa_rows


def test_perfect_predictions_score_100_everywhere():
    rows = rexvqa_rows(200)
    result = score_rexvqa(rows, {r["question_id"]: reference_reply(r) for r in rows})
    assert result["overall"]["accuracy"] == 100.0 and result["overall"]["failed_extraction"] == 0
    assert all(b["accuracy"] == 100.0 for b in result["per_task"].values())
    assert all(b["accuracy"] == 100.0 for b in result["per_category"].values())
    assert list(result["per_task"]) == [t for t in TASKS if t in result["per_task"]]


def test_seeded_random_guesser_lands_near_a_quarter():
    rows = rexvqa_rows(4000, seed=1)
    accuracy = score_rexvqa(rows, random_replies(rows, seed=5))["overall"]["accuracy"]
    print(f"random guesser accuracy {accuracy:.2f}% (chance 25%)")
    assert accuracy == pytest.approx(25, abs=2.5)


def test_shuffled_predictions_score_far_below_perfect():
    rows = rexvqa_rows(400, seed=2)
    replies = [reference_reply(r) for r in rows]
    random.Random(0).shuffle(replies)
    accuracy = score_rexvqa(rows, {r["question_id"]: p for r, p in zip(rows, replies)})["overall"]["accuracy"]
    print(f"shuffled accuracy {accuracy:.2f}%")
    assert accuracy < 40


def test_failed_extractions_and_missing_are_wrong_and_counted():
    rows = rexvqa_rows(4)
    replies = {
        rows[0]["question_id"]: "A or B",
        rows[1]["question_id"]: "I am not sure",
        rows[2]["question_id"]: f"The answer is {rows[2]['answer']}.",
    }
    overall = score_rexvqa(rows, replies)["overall"]
    assert overall == {"questions": 4, "accuracy": 25.0, "correct": 1, "failed_extraction": 2, "missing": 1}


def test_unknown_task_is_reported_under_its_own_name():
    rows = rexvqa_rows(6)
    rows[0]["task_name_raw"] = "Temporal Assessment"
    result = score_rexvqa(rows, {})
    assert "Temporal Assessment" in result["per_task"] and list(result["per_task"])[-1] == "Temporal Assessment"


def test_majority_baseline():
    rows = rexvqa_rows(300, seed=3)
    top = max("ABCD", key=lambda c: sum(r["answer"] == c for r in rows))
    expected = 100 * sum(r["answer"] == top for r in rows) / len(rows)
    assert score_rexvqa(rows, majority_replies(rows))["overall"]["accuracy"] == pytest.approx(expected)
