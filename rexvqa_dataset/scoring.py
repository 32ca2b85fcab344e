"""ReXVQA scores as the ReXrank leaderboard reports them.

No official scorer code exists; these are the reference definitions:

- a letter is read off each reply by `builders.scoring.extraction.extract_letter` with the question's
  four options (a letter cue, a lone letter, or the text of exactly one option); a reply giving
  no letter or several letters is a *failed extraction*, scored wrong and counted;
- a question of the split without a prediction is *missing*, scored wrong and counted;
- accuracy is the percentage correct (0-100, the unit of the ReXVQA paper's tables and of every
  GEMeX score), overall, per task and per category. Tasks are grouped by ``task_name_raw`` (the task as stored), so a task outside the
  five known ones is reported under its own name rather than lost; known tasks come first in
  the paper's order.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

from builders.scoring.extraction import LETTERS, extract_letter
from rexvqa_dataset.features import TASKS

COLUMNS = ("question_id", "question", "options", "answer", "task_name_raw", "category", "subcategory")
"""The columns the scorer reads from a built split (never the images)."""


def task_of(row: Mapping) -> str:
    raw = row.get("task_name_raw")
    if raw:
        return raw
    task = row.get("task_name")
    return TASKS[task] if isinstance(task, int) else str(task)


def _accuracy_block(outcomes: Sequence[tuple[bool, bool, bool]]) -> dict:
    """outcomes: (correct, failed_extraction, missing) per question."""
    n = len(outcomes)
    return {
        "questions": n,
        "accuracy": 100 * sum(o[0] for o in outcomes) / n if n else None,
        "correct": sum(o[0] for o in outcomes),
        "failed_extraction": sum(o[1] for o in outcomes),
        "missing": sum(o[2] for o in outcomes),
    }


def score_rexvqa(rows: Sequence[Mapping], predictions: Mapping[str, str], progress: bool = False) -> dict:
    """Overall, per-task and per-category accuracy of predictions (question_id -> raw reply)."""
    iterator = rows
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(rows, desc="ReXVQA questions", unit="q")
    per_question = []
    for row in iterator:
        reply = predictions.get(row["question_id"])
        letter = extract_letter(reply, row["options"]) if reply is not None else None
        per_question.append(
            {
                "question_id": row["question_id"],
                "task": task_of(row),
                "category": row.get("category") or "",
                "extracted": letter,
                "correct": letter is not None and letter == row["answer"],
                "failed_extraction": reply is not None and letter is None,
                "missing": reply is None,
            }
        )

    def block(items):
        return _accuracy_block([(q["correct"], q["failed_extraction"], q["missing"]) for q in items])

    tasks = [t for t in TASKS if any(q["task"] == t for q in per_question)]
    tasks += sorted({q["task"] for q in per_question} - set(TASKS))
    categories = sorted({q["category"] for q in per_question})
    return {
        "overall": block(per_question),
        "per_task": {t: block([q for q in per_question if q["task"] == t]) for t in tasks},
        "per_category": {c: block([q for q in per_question if q["category"] == c]) for c in categories},
        "per_question": per_question,
    }


def reference_reply(row: Mapping) -> str:
    return f"{row['answer']}. {row['options'][LETTERS.index(row['answer'])]}"


def random_replies(rows: Sequence[Mapping], seed: int = 0) -> dict[str, str]:
    """A seeded chance baseline: a uniform letter among each question's options."""
    rng = random.Random(seed)
    return {row["question_id"]: rng.choice(LETTERS[: len(row["options"])]) for row in rows}


def majority_replies(rows: Sequence[Mapping]) -> dict[str, str]:
    """The split's most common answer letter for every question (ties: first seen)."""
    letter = Counter(row["answer"] for row in rows).most_common(1)[0][0] if rows else "A"
    return {row["question_id"]: letter for row in rows}
