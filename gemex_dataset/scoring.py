"""GEMeX scores per question type, as in the paper's Tables 5 and 6 (section 4.2).

No official scorer exists; these are the reference definitions. All scores are 0-100.

- A-score (closed, single, multi): exact match of what is read off the reply
  (`builders.scoring.extraction`) against the reference: yes/no for closed (from "Yes."/"No."), the
  letter for single, the set of letters for multi (all and only the right letters). A reply
  from which nothing can be read, or a missing prediction, is wrong and counted
  (``failed_extraction``, ``missing``). Open questions have no A-score.
- V-score (every type): per question, predicted and reference boxes (both in the stored
  image's pixels) are matched one to one by the Hungarian algorithm on IoU
  (`scipy.optimize.linear_sum_assignment`, maximising total IoU); the question scores the sum of
  the matched IoUs divided by the larger of the two box counts, so an unmatched box on either
  side scores 0 and extra guesses are penalised. A reply without boxes scores 0. The V-score is
  the mean over questions. A build whose images could not be read (``--image-mode none``
  without images) has no image size and no pixel boxes: its questions are then compared in the
  release's 224 frame (predicted boxes as written against ``boxes_224``) when the model writes
  ``frame224`` boxes, and are otherwise left out of the V-score and counted (``V_skipped``);
  questions without any reference box are left out too.
- AR-scores: answer + reason of the reply (`builders.scoring.extraction.answer_and_reason`) against
  the reference's ``answer + " " + reason``: ROUGE-L, BLEU-1, BERTScore
  (`builders.scoring.text_metrics`, definitions and the model there; not the paper's RoBERTa-large), and
  optionally the LLM judge (`builders.scoring.judge`: candidate / reference). Means over questions.
- ``all``: the same numbers over every question of the split (A over the three closed types).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from builders.box_frame import frame224_to_pixels, to_model_frame
from builders.pixel_budget import PixelBudget
from builders.scoring import extraction
from gemex_dataset.features import QUESTION_TYPES

ANSWERED_TYPES = ("closed_ended", "single_choice", "multi_choice")
TEXT_METRICS = ("rougeL", "bleu1", "bertscore")
QUESTION_ID = re.compile(
    r"^(?P<split>[^/]+)/.+/(?P<question_type>open_ended|closed_ended|single_choice|multi_choice)/\d+$"
)
"""A built GEMeX question id, `<split>/<dicom_id>/<question_type>/<n>` (`gemex_dataset.rows`)."""
COLUMNS = (
    "question_id",
    "question_type",
    "question",
    "choices",
    "answer",
    "answer_letters",
    "reason",
    "boxes",
    "boxes_224",
    "image_width",
    "image_height",
)
"""The columns the scorer reads from a built split (never the image)."""


def question_type_name(value: int | str) -> str:
    return QUESTION_TYPES[value] if isinstance(value, int) else str(value)


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def matched_iou(predicted: Sequence[Sequence[float]], reference: Sequence[Sequence[float]]) -> float:
    """Hungarian-matched IoU of one question, divided by the larger box count (0-1)."""
    if not predicted or not reference:
        return 0.0
    iou = np.array([[box_iou(p, r) for r in reference] for p in predicted])
    rows, cols = linear_sum_assignment(iou, maximize=True)
    return float(iou[rows, cols].sum() / max(len(predicted), len(reference)))


def reference_answer(row: Mapping) -> str | frozenset[str] | None:
    """What a reply must match for the A-score: "yes"/"no", a letter, or a set of letters."""
    kind = question_type_name(row["question_type"])
    if kind == "closed_ended":
        return extraction.extract_yes_no(row["answer"])
    if kind == "single_choice":
        letters = row.get("answer_letters") or [row["answer"].strip()]
        return letters[0]
    if kind == "multi_choice":
        letters = row.get("answer_letters") or json.loads(row["answer"])
        return frozenset(letters)
    return None


def predicted_answer(row: Mapping, reply: str) -> str | frozenset[str] | None:
    kind = question_type_name(row["question_type"])
    if kind == "closed_ended":
        return extraction.extract_yes_no(reply)
    if kind == "single_choice":
        return extraction.extract_letter(reply, row["choices"])
    if kind == "multi_choice":
        return extraction.extract_letter_set(reply, row["choices"])
    return None


def reference_text(row: Mapping) -> str:
    return f"{row['answer']} {row['reason']}".strip()


@dataclass
class QuestionScore:
    question_id: str
    question_type: str
    missing: bool
    correct: bool | None
    """None for open questions (no A-score)."""
    failed_extraction: bool
    extracted: str | list[str] | None
    """What was read off the reply: "yes"/"no", a letter, sorted letters, or None."""
    iou: float | None
    v_skipped: bool
    candidate: str
    reference: str
    question: str = ""
    text: dict[str, float] = field(default_factory=dict)


def score_question(
    row: Mapping, reply: str | None, box_convention: str = "pixels", budget: PixelBudget | None = None
) -> QuestionScore:
    """A-, V- and the inputs of the AR-scores for one question (text metrics are added in batch)."""
    kind = question_type_name(row["question_type"])
    text = reply or ""
    correct = failed = got = None
    if kind in ANSWERED_TYPES:
        got = predicted_answer(row, text) if reply is not None else None
        failed = reply is not None and got is None
        correct = got is not None and got == reference_answer(row)
    iou, v_skipped = None, False
    width, height = row.get("image_width"), row.get("image_height")
    if row.get("boxes") and width and height:
        predicted = extraction.extract_boxes(text, width, height, box_convention, budget)
        iou = matched_iou(predicted, [list(b) for b in row["boxes"]])
    elif row.get("boxes_224") and box_convention == "frame224":
        predicted = [extraction.ordered_box(b) for b in extraction.extract_raw_boxes(text)]
        iou = matched_iou(predicted, [list(b) for b in row["boxes_224"]])
    elif row.get("boxes_224"):
        v_skipped = True
    return QuestionScore(
        question_id=row["question_id"],
        question_type=kind,
        missing=reply is None,
        correct=correct,
        failed_extraction=bool(failed),
        extracted=sorted(got) if isinstance(got, frozenset) else got,
        iou=iou,
        v_skipped=v_skipped,
        candidate=extraction.answer_and_reason(text),
        reference=reference_text(row),
        question=row.get("question", ""),
    )


def _mean(values: Sequence[float]) -> float | None:
    return 100 * sum(values) / len(values) if values else None


def summarise(
    scores: Sequence[QuestionScore],
    metrics: Sequence[str],
    judge_scores: Mapping[str, tuple[float | None, int]] | None = None,
) -> dict:
    """The table: one entry per question type in the paper's order, then ``all``."""
    table = {}
    groups = [(kind, [s for s in scores if s.question_type == kind]) for kind in QUESTION_TYPES] + [
        ("all", list(scores))
    ]
    for name, group in groups:
        if not group:
            continue
        answered = [s for s in group if s.correct is not None]
        boxed = [s.iou for s in group if s.iou is not None]
        entry = {
            "questions": len(group),
            "missing": sum(s.missing for s in group),
            "failed_extraction": sum(s.failed_extraction for s in group),
            "A": _mean([float(s.correct) for s in answered]),
            "V": _mean(boxed),
            "V_skipped": sum(s.v_skipped for s in group),
        }
        for metric in metrics:
            entry[metric] = _mean([s.text[metric] for s in group])
        if judge_scores is not None and name in judge_scores:
            entry["judge"], entry["judge_failed"] = judge_scores[name]
        table[name] = entry
    return table


def add_text_metrics(scores: list[QuestionScore], metrics: Sequence[str], bert_scorer, progress: bool) -> None:
    """Each score's text metrics (answer and reason against the reference), clipped to [0, 1]."""
    from builders.scoring import text_metrics

    candidates = [s.candidate for s in scores]
    references = [s.reference for s in scores]
    metric_functions: dict[str, Callable] = {"rougeL": text_metrics.rouge_l, "bleu1": text_metrics.bleu_1}
    for metric in metrics:
        if metric == "bertscore":
            scorer = bert_scorer or text_metrics.BertScorer()
            values = scorer.score(candidates, references, progress=progress)
        elif metric in metric_functions:
            values = metric_functions[metric](candidates, references)
        else:
            raise ValueError(f"unknown text metric {metric!r}; expected one of {', '.join(TEXT_METRICS)}")
        for score, value in zip(scores, values):
            score.text[metric] = min(max(value, 0.0), 1.0)


def judged_by_type(scores: list[QuestionScore], judge, workers: int, progress: bool) -> dict:
    """The judge's relative score per question type and over all, asking `workers` questions at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from builders.scoring.judge import relative_score

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        calls = pool.map(lambda s: judge.judge(s.question, s.reference, s.candidate), scores)
        if progress:
            from tqdm.auto import tqdm

            calls = tqdm(calls, total=len(scores), desc="LLM judge", unit="q")
        judged = list(calls)
    judge_scores = {
        kind: relative_score([j for j, s in zip(judged, scores) if s.question_type == kind]) for kind in QUESTION_TYPES
    }
    judge_scores["all"] = relative_score(judged)
    return judge_scores


def score_gemex(
    rows: Sequence[Mapping],
    predictions: Mapping[str, str],
    *,
    box_convention: str = "pixels",
    metrics: Sequence[str] = TEXT_METRICS,
    bert_scorer=None,
    judge=None,
    judge_workers: int = 4,
    progress: bool = False,
    budget: PixelBudget | None = None,
) -> dict:
    """Score predictions (question_id -> raw reply) over `rows`; a row without a prediction is wrong.

    `budget` is the resize ``qwen2.5-vl`` boxes are read in (`builders.box_frame`). `bert_scorer` is a `builders.scoring.text_metrics.BertScorer` (made on demand when ``bertscore`` is in
    `metrics`); `judge` a `builders.scoring.judge.ChatJudge` or None, asked `judge_workers` questions at a time. Returns ``{"table": ..., "per_question": ...}``.
    """
    iterator = rows
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(rows, desc="GEMeX questions", unit="q")
    scores = [score_question(row, predictions.get(row["question_id"]), box_convention, budget) for row in iterator]
    add_text_metrics(scores, metrics, bert_scorer, progress)
    judge_scores = None if judge is None else judged_by_type(scores, judge, judge_workers, progress)
    table = summarise(scores, metrics, judge_scores)
    per_question = [
        {
            "question_id": s.question_id,
            "question_type": s.question_type,
            "missing": s.missing,
            "extracted": s.extracted,
            "correct": s.correct,
            "failed_extraction": s.failed_extraction,
            "iou": s.iou,
            "v_skipped": s.v_skipped,
            **s.text,
        }
        for s in scores
    ]
    return {"table": table, "per_question": per_question}


def format_boxes(
    row: Mapping, boxes_224: Sequence[Sequence[int]], box_convention: str, budget: PixelBudget | None = None
) -> str:
    """Boxes given in the release's 224 frame, written as a model in `box_convention` would write them
    (a row without an image size can only be written in the 224 frame); `budget` as `score_gemex`'s."""
    width, height = row.get("image_width"), row.get("image_height")
    if box_convention == "frame224" or not (width and height):
        return json.dumps([[int(v) for v in box] for box in boxes_224])
    pixels = [frame224_to_pixels(box, width, height)[0] for box in boxes_224]
    if box_convention == "pixels":
        return json.dumps([[round(float(v), 2) for v in box] for box in pixels])
    return json.dumps([to_model_frame(box, width, height, box_convention, budget) for box in pixels])


def reference_reply(row: Mapping, box_convention: str = "pixels", budget: PixelBudget | None = None) -> str:
    """The reference written as the paper's target ``<answer> ... <reason> ... <location> [[...]]``.

    In ``pixels`` the stored pixel boxes are written as they are (2 decimals); other conventions
    are written from the released 224-frame boxes.
    """
    if box_convention == "pixels" and row.get("boxes") and row.get("image_width"):
        location = json.dumps([[round(float(v), 2) for v in box] for box in row["boxes"]])
    else:
        location = format_boxes(row, row.get("boxes_224") or [], box_convention, budget)
    return f"<answer> {row['answer']} <reason> {row['reason']} <location> {location}"


def random_replies(
    rows: Sequence[Mapping], seed: int = 0, box_convention: str = "pixels", budget: PixelBudget | None = None
) -> dict[str, str]:
    """A seeded chance baseline: closed a fair yes/no, single a uniform letter, multi a uniform
    non-empty set of letters; its reason and boxes (at the same place of the 224 frame) are those
    of a random question of the same type, so the AR- and V-scores show what an unrelated but
    well-formed reply scores; open questions get that question's answer too."""
    rng = random.Random(seed)
    by_type: dict[str, list[Mapping]] = {}
    for row in rows:
        by_type.setdefault(question_type_name(row["question_type"]), []).append(row)
    replies = {}
    for row in rows:
        kind = question_type_name(row["question_type"])
        donor = rng.choice(by_type[kind])
        letters = extraction.LETTERS[: len(row.get("choices") or [])]
        if kind == "closed_ended":
            answer = rng.choice(["Yes.", "No."])
        elif kind == "single_choice":
            answer = rng.choice(letters)
        elif kind == "multi_choice":
            subsets = [[c for i, c in enumerate(letters) if mask >> i & 1] for mask in range(1, 2 ** len(letters))]
            answer = json.dumps(rng.choice(subsets))
        else:
            answer = donor["answer"]
        location = format_boxes(row, donor.get("boxes_224") or [], box_convention, budget)
        replies[row["question_id"]] = f"<answer> {answer} <reason> {donor['reason']} <location> {location}"
    return replies


def majority_replies(
    rows: Sequence[Mapping], box_convention: str = "pixels", budget: PixelBudget | None = None
) -> dict[str, str]:
    """The most common answer, reason and 224-frame box set of each question type in the split,
    given to every question of that type (ties broken by first occurrence)."""
    replies = {}
    for kind in QUESTION_TYPES:
        group = [row for row in rows if question_type_name(row["question_type"]) == kind]
        if not group:
            continue
        answer = Counter(r["answer"] for r in group).most_common(1)[0][0]
        reason = Counter(r["reason"] for r in group).most_common(1)[0][0]
        boxes = json.loads(Counter(json.dumps(r.get("boxes_224") or []) for r in group).most_common(1)[0][0])
        for row in group:
            replies[row["question_id"]] = (
                f"<answer> {answer} <reason> {reason} <location> {format_boxes(row, boxes, box_convention, budget)}"
            )
    return replies
