"""Synthetic rows with the real column names of built GEMeX and ReXVQA splits, for the scoring tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from builders.box_frame import frame224_to_pixels, letterbox
from gemex_dataset.features import QUESTION_TYPES
from rexvqa_dataset.features import TASKS

WORDS = [
    "opacity",
    "effusion",
    "heart",
    "lung",
    "base",
    "left",
    "right",
    "apex",
    "mediastinum",
    "enlarged",
    "clear",
    "blunted",
    "angle",
    "consolidation",
    "edema",
    "atelectasis",
    "pneumothorax",
    "normal",
    "size",
    "stable",
    "mild",
    "moderate",
    "small",
    "large",
]
IMAGE_SIZES = ((2544, 3056), (3056, 2544), (2000, 2000), (1024, 1280))
CATEGORIES = ("Lung and Pleural Opacity", "Negation", "Cardiac", "Exam/Patient Information")


def _sentence(rng: random.Random, n: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _box_224(rng: random.Random, width: int, height: int) -> list[int]:
    r, left, top = letterbox(width, height)
    x_max, y_max = left + int(width * r), top + int(height * r)
    x1, y1 = rng.randint(left, x_max - 40), rng.randint(top, y_max - 40)
    return [x1, y1, rng.randint(x1 + 10, min(x1 + 120, x_max)), rng.randint(y1 + 10, min(y1 + 120, y_max))]


def gemex_rows(per_type: int = 20, seed: int = 0, options: int | None = None, types=QUESTION_TYPES) -> list[dict]:
    """`per_type` questions of each type; choice questions get `options` options (2-4 at random if None)."""
    rng = random.Random(seed)
    rows = []
    for kind in types:
        for i in range(per_type):
            width, height = rng.choice(IMAGE_SIZES)
            boxes_224 = [_box_224(rng, width, height) for _ in range(rng.randint(1, 3))]
            n_options = options or rng.randint(2, 4)
            choices, letters = [], []
            if kind == "closed_ended":
                answer = rng.choice(["Yes.", "No."])
            elif kind == "single_choice":
                choices = [f"{_sentence(rng, 3)[:-1]} {k}" for k in range(n_options)]
                letters = [rng.choice("ABCD"[:n_options])]
                answer = letters[0]
            elif kind == "multi_choice":
                choices = [f"{_sentence(rng, 3)[:-1]} {k}" for k in range(n_options)]
                letters = sorted(rng.sample("ABCD"[:n_options], rng.randint(1, n_options)))
                answer = json.dumps(letters)
            else:
                answer = _sentence(rng, 8)
            rows.append(
                {
                    "question_id": f"{kind}-{seed}-{i}",
                    "question_type": QUESTION_TYPES.index(kind),
                    "question": f"Question {i} about the {rng.choice(WORDS)}?",
                    "choices": choices,
                    "answer": answer,
                    "answer_letters": letters,
                    "reason": _sentence(rng),
                    "boxes": [frame224_to_pixels(b, width, height)[0] for b in boxes_224],
                    "boxes_224": boxes_224,
                    "image_width": width,
                    "image_height": height,
                }
            )
    return rows


def rexvqa_rows(n: int = 50, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        index = rng.randrange(4)
        task = rng.randrange(len(TASKS))
        rows.append(
            {
                "question_id": f"rex-{seed}-{i}",
                "question": f"Question {i}: which finding is present?",
                "options": [_sentence(rng, 4)[:-1] for _ in range(4)],
                "answer": "ABCD"[index],
                "answer_index": index,
                "task_name": task,
                "task_name_raw": TASKS[task],
                "category": rng.choice(CATEGORIES),
                "subcategory": "Sub",
                "split": "test",
            }
        )
    return rows


def write_jsonl(path: str | Path, predictions: list[tuple[str, str]]) -> None:
    """A predictions file in the JSONL layout `read_predictions` takes: one `{question_id, prediction}` a line."""
    lines = (json.dumps({"question_id": q, "prediction": p}, ensure_ascii=False) + "\n" for q, p in predictions)
    Path(path).write_text("".join(lines), encoding="utf-8")
