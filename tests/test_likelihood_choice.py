"""ReXVQA's checklist reply (`sft.py --reply checklist`) and `generate.py --choose_by likelihood`: each offered
option's reply scored by the model, the likeliest written as the prediction `cxr-vqa evaluate` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

import torch

from builders.scoring.extraction import extract_letter
from rexvqa_dataset.prompts import checklist_text
from training_recipes import generate, tiny_model
from training_recipes.data import ConversationSettings, conversation_format, row_images, to_messages
from training_recipes.runtime.processors import RecipeError

from . import tiny_builds

OPTIONS = ["Chest tube", "Pleural effusion", "Cardiomegaly", "Pneumothorax"]


@pytest.fixture(scope="module")
def rexvqa_dir(tmp_path_factory) -> Path:
    return tiny_builds.built_rexvqa(tmp_path_factory.mktemp("rexvqa"), n=4)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return tiny_model.save_tiny_vlm("idefics3", tmp_path_factory.mktemp("probe") / "tiny", seed=3)


def test_a_checklist_says_which_options_the_study_shows_before_the_letter():
    presence = {"options": OPTIONS, "answer": "B", "answer_index": 1, "task_name_raw": "Presence Assessment"}
    assert checklist_text(presence) == (
        "<reason> A: Chest tube no, B: Pleural effusion yes, C: Cardiomegaly no, D: Pneumothorax no <answer> B"
    )
    negation = {**presence, "task_name_raw": "Negation Assessment"}
    assert checklist_text(negation) == (
        "<reason> A: Chest tube yes, B: Pleural effusion no, C: Cardiomegaly yes, D: Pneumothorax yes <answer> B"
    )
    assert extract_letter(checklist_text(negation), OPTIONS) == "B"


def test_a_checklist_is_refused_for_gemex_in_one_line():
    with pytest.raises(ValueError, match=r"checklist.*ReXVQA.*not gemex"):
        conversation_format("gemex", "checklist")


def conversations_of(processor, rows: list[dict], settings: ConversationSettings) -> tuple[list, list[int], list[int]]:
    """Every row's candidate conversations, each with its prompt's token count and its row's index."""
    conversations, prompt_lengths, owners = [], [], []
    for index, row in enumerate(rows):
        images = row_images(row, "rexvqa", settings)
        for candidate in generate.candidate_rows(row):
            conversations.append(generate.with_images(to_messages(candidate, "rexvqa", settings), images))
            prompt = generate.with_images(to_messages(row, "rexvqa", settings, with_answer=False), images)
            tokens = processor.apply_chat_template(
                [prompt], add_generation_prompt=True, tokenize=True, return_dict=True
            )
            prompt_lengths.append(len(tokens["input_ids"][0]))
            owners.append(index)
    return conversations, prompt_lengths, owners


def alone(model, processor, conversation: list[dict], prompt_tokens: int) -> float:
    """The reply's summed log-probability with the conversation by itself, no padding."""
    inputs = processor.apply_chat_template([conversation], tokenize=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0, :-1].float().log_softmax(-1)
    ids = inputs["input_ids"][0, 1:]
    return float(logits.gather(-1, ids[:, None])[prompt_tokens - 1 :].sum())


@pytest.mark.parametrize("reply", ["checklist", "answer"])
def test_each_reply_is_scored_as_it_is_alone_and_the_likeliest_is_written(rexvqa_dir, probe, reply):
    model, processor = generate.load_model(str(probe), "float32", "cpu")
    rows = list(tiny_builds.load_built(rexvqa_dir))
    assert len({len(row["images"]) for row in rows}) == 2  # prompts of two lengths share a left-padded batch
    settings = ConversationSettings(reply=reply)
    conversations, prompt_lengths, owners = conversations_of(processor, rows, settings)
    batched = generate.reply_log_likelihoods(model, processor, conversations, prompt_lengths)
    expected = [alone(model, processor, c, n) for c, n in zip(conversations, prompt_lengths)]
    assert batched.tolist() == pytest.approx(expected, abs=1e-3)
    assert len(set(expected)) > len(rows)  # the candidates' replies differ in the model's eyes

    chosen = generate.likeliest_replies(model, processor, rows, "rexvqa", settings)
    for index, text in enumerate(chosen):
        scores = {c[-1]["content"][0]["text"]: s for c, s, o in zip(conversations, expected, owners) if o == index}
        assert len(scores) == 4 and text == max(scores, key=scores.get)


def test_likelihood_is_refused_where_a_reply_cannot_be_written_for_every_option(rexvqa_dir, probe):
    model, processor = generate.load_model(str(probe), "float32", "cpu")
    rows = list(tiny_builds.load_built(rexvqa_dir))
    with pytest.raises(RecipeError, match="--reply answer or checklist, not rexvqa with --reply full"):
        generate.likeliest_replies(model, processor, rows, "rexvqa", ConversationSettings(reply="full"))
    with pytest.raises(RecipeError, match="not gemex"):
        generate.likeliest_replies(model, processor, rows, "gemex", ConversationSettings(reply="answer"))


def test_the_script_writes_the_likeliest_reply_of_every_question(rexvqa_dir, probe, tmp_path):
    out = tmp_path / "predictions.jsonl"
    args = ["--model_name_or_path", str(probe), "--dataset_path", str(rexvqa_dir), "--split", "train"]
    args += ["--output_file", str(out), "--choose_by", "likelihood", "--reply", "checklist", "--batch_size", "3"]
    assert generate.main(args) == 4
    rows = {row["question_id"]: row for row in tiny_builds.load_built(rexvqa_dir)}
    predictions = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(p["question_id"] for p in predictions) == sorted(rows)
    for prediction in predictions:
        row = rows[prediction["question_id"]]
        letter = extract_letter(prediction["prediction"], row["options"])
        assert prediction["prediction"] == checklist_text({**row, "answer": letter})
