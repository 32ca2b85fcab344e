"""What a trained reply holds (`sft.py --reply`, `training_recipes.data.REPLIES`): the answer alone, the
answer and GEMeX's boxes, or all of it; per question and per conversation, the prompt untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import load_dataset

from gemex_dataset.prompts import answer_text, location_text
from tests.tiny_builds import synthetic_embed_builds
from training_recipes.data import ConversationSettings, replied, to_messages

CONFIGS = {"gemex": ("closed_ended", "sft_per_image"), "rexvqa": ("default", "sft_per_study")}


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    return synthetic_embed_builds(tmp_path_factory.mktemp("replies"), 8, 8, ())


def rows(build: Path, config: str, tmp_path: Path) -> list[dict]:
    loaded = load_dataset(str(build), config, split="train", cache_dir=str(tmp_path / "cache"))
    return loaded.remove_columns([c for c in ("image", "images") if c in loaded.column_names]).to_list()


def texts(messages: list[dict], role: str) -> list[str]:
    return ["".join(p["text"] for p in m["content"] if p["type"] == "text") for m in messages if m["role"] == role]


def answer_only(dataset: str, row: dict) -> str:
    if dataset == "gemex":
        return f"<answer> {answer_text(row)} <reason>  <location> []"
    return f"<answer> {row['answer']} <reason>"


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_an_answer_reply_is_the_answer_alone_and_the_prompt_is_unchanged(builds, dataset, tmp_path):
    per_question, per_conversation = CONFIGS[dataset]
    full, answer = ConversationSettings(), ConversationSettings(reply="answer")
    questions = rows(builds[dataset], per_question, tmp_path)
    assert questions
    for row in questions:
        ours, theirs = to_messages(row, dataset, answer), to_messages(row, dataset, full)
        assert texts(ours, "assistant") == [answer_only(dataset, row)]
        assert [m for m in ours if m["role"] != "assistant"] == [m for m in theirs if m["role"] != "assistant"]
        assert to_messages(row, dataset, answer, with_answer=False) == to_messages(row, dataset, full, False)
    for row in rows(builds[dataset], per_conversation, tmp_path):
        shared = {k: v for k, v in row.items() if k not in ("turns", "question_ids", "messages")}
        replies = texts(to_messages(row, dataset, answer), "assistant")
        assert replies == [answer_only(dataset, {**shared, **turn}) for turn in row["turns"]]


def test_an_answer_boxes_reply_keeps_gemex_boxes_and_empties_the_reason(builds, tmp_path):
    for row in rows(builds["gemex"], "closed_ended", tmp_path):
        (reply,) = texts(to_messages(row, "gemex", ConversationSettings(reply="answer_boxes")), "assistant")
        assert reply == f"<answer> {answer_text(row)} <reason>  <location> {location_text(row)}"
        assert row["boxes"] and row["reason"]


def test_a_full_reply_is_the_row_and_an_unknown_reply_is_refused():
    row = {"answer": "Yes.", "reason": "A mark.", "boxes": [[1, 2, 3, 4]]}
    assert replied(row, "full") is row
    assert replied(row, "answer") == {"answer": "Yes.", "reason": "", "boxes": []}
    with pytest.raises(ValueError, match="reply 'reason'"):
        replied(row, "reason")
