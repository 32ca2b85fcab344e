"""ReXVQA task functions for lmms-eval (the YAML files name them with ``!function``).

``DATASET`` is read from the environment when lmms-eval loads a task. Accuracy is
`rexvqa_dataset.scoring.score_rexvqa`'s, the function behind ``cxr-vqa evaluate``; the per-task
numbers are the ``rexvqa_<task>`` tasks, the per-category ones are logged with each aggregation.
Every image of a study is passed, in order.
"""

from __future__ import annotations

from loguru import logger

from rexvqa_dataset import scoring
from training_recipes.lmms_eval_tasks import harness

DATASET = harness.dataset_source("CXR_VQA_REXVQA", "ReXVQA")
doc_to_visual, doc_to_text, doc_to_messages = harness.prompt_functions("rexvqa")
COLUMNS = scoring.COLUMNS + ("task_name",)


def process_results(doc: dict, results: list[str]) -> dict:
    return {"accuracy": harness.scored_item(doc, results, COLUMNS)}


def accuracy(items: list[dict]) -> float | None:
    rows, replies = harness.rows_and_replies(items)
    result = scoring.score_rexvqa(rows, replies)
    for category, block in result["per_category"].items():
        logger.info(f"ReXVQA {category}: accuracy {block['accuracy']:.2f}% over {block['questions']} question(s)")
    return result["overall"]["accuracy"]
