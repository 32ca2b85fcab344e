"""GEMeX task functions for lmms-eval (the YAML files name them with ``!function``).

lmms-eval runs this file anew for each task it loads, so ``DATASET``, ``BOX_CONVENTION`` and the
pixel budget (``PIXEL_BUDGET``) are read from the environment when the task is loaded. Each metric's aggregation scores all of the
task's replies with `gemex_dataset.scoring.score_gemex`, the function behind ``cxr-vqa evaluate``.
"""

from __future__ import annotations

from builders.pixel_budget import from_environment
from builders.scoring.text_metrics import installed_metrics
from gemex_dataset import scoring
from training_recipes.lmms_eval_tasks import harness

DATASET = harness.dataset_source("CXR_VQA_GEMEX", "GEMeX")
doc_to_visual, doc_to_text, doc_to_messages = harness.prompt_functions("gemex")
BOX_CONVENTION = harness.box_convention()
PIXEL_BUDGET = from_environment()
TEXT_METRICS = installed_metrics()[0]
"""ROUGE-L, BLEU-1 and BERTScore, those whose extras are installed (as ``cxr-vqa evaluate``)."""


def metric_names(question_type: int | str) -> list[str]:
    """A-score for the three answered types, V-score and the installed text metrics for all."""
    answered = scoring.question_type_name(question_type) in scoring.ANSWERED_TYPES
    return (["A"] if answered else []) + ["V"] + TEXT_METRICS


def process_results(doc: dict, results: list[str]) -> dict:
    item = harness.scored_item(doc, results, scoring.COLUMNS)
    return dict.fromkeys(metric_names(doc["question_type"]), item)


def score(items: list[dict], metric: str) -> float | None:
    rows, replies = harness.rows_and_replies(items)
    text_metrics = [metric] if metric in scoring.TEXT_METRICS else []
    bert = harness.bert_scorer() if metric == "bertscore" else None
    table = scoring.score_gemex(
        rows, replies, box_convention=BOX_CONVENTION, metrics=text_metrics, bert_scorer=bert, budget=PIXEL_BUDGET
    )["table"]
    return table["all"][metric]


def a_score(items: list[dict]) -> float | None:
    return score(items, "A")


def v_score(items: list[dict]) -> float | None:
    return score(items, "V")


def rouge_l(items: list[dict]) -> float | None:
    return score(items, "rougeL")


def bleu_1(items: list[dict]) -> float | None:
    return score(items, "bleu1")


def bertscore(items: list[dict]) -> float | None:
    return score(items, "bertscore")


AGGREGATIONS = {"A": a_score, "V": v_score, "rougeL": rouge_l, "bleu1": bleu_1, "bertscore": bertscore}


def metric_list(names: list[str]) -> list[dict]:
    return [{"metric": name, "aggregation": AGGREGATIONS[name], "higher_is_better": True} for name in names]


ANSWERED_METRICS = metric_list(metric_names("closed_ended"))
OPEN_METRICS = metric_list(metric_names("open_ended"))
