"""Prompt and target text for GEMeX and ReXVQA rows; no torch needed."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from builders.pixel_budget import PixelBudget
from gemex_dataset import prompts as gemex
from gemex_dataset.features import QUESTION_TYPES
from rexvqa_dataset import prompts as rexvqa


def gemex_row(question_type="multi_choice", **overrides):
    row = {
        "question_id": "q1",
        "image_width": 448,
        "image_height": 448,
        "question_type": QUESTION_TYPES.index(question_type),
        "question": "Which regions may require further investigation?",
        "choices": ["Right hemidiaphragm", "Left lung", "Spine", "Cardiac region"],
        "answer": '["A", "C"]',
        "answer_letters": ["A", "C"],
        "reason": "The right hemidiaphragm shows minimal air.",
        "regions": ["right hemidiaphragm", "spine"],
        "boxes": [[96.0, 232.0, 236.0, 270.0], [196.0, 0.0, 262.0, 444.0]],
    }
    row.update(overrides)
    return row


def rexvqa_row(**overrides):
    row = {
        "question_id": "r1",
        "images": ["a.png", "b.png"],
        "question": "Is there a pleural effusion?",
        "options": ["Yes, left", "Yes, right", "No", "Cannot tell"],
        "answer": "C",
        "answer_index": 2,
        "explanation": "The costophrenic angles are sharp.",
        "task_name": "Presence Assessment",
        "category": "Lung and Pleural Opacity",
    }
    row.update(overrides)
    return row


def test_type_prompts_are_the_released_ones_for_int_str_and_llava_names():
    assert gemex.type_prompt(0).startswith(
        "Input an open-ended question, and the assistant will output its answer with"
    )
    assert gemex.type_prompt("closed_ended") == gemex.type_prompt(1)
    assert "(yes or no)" in gemex.type_prompt("closed_ended_questions")
    assert "(an option)" in gemex.type_prompt("single_choice")
    assert "(some options)" in gemex.type_prompt(3)
    with pytest.raises(ValueError):
        gemex.type_prompt("essay")


def test_multi_choice_row_reads_like_the_authors_llava_turns():
    # The public sample's human and gpt turns (formats.md, layout 2), with boxes given here in a
    # 448 x 448 image, i.e. twice the 224 frame.
    messages = gemex.to_messages(gemex_row(), box_convention="frame224")
    system, user, assistant = messages
    assert system == {"role": "system", "content": [{"type": "text", "text": gemex.type_prompt("multi_choice")}]}
    assert user["content"][0] == {"type": "image", "text": None}
    assert user["content"][1]["text"] == (
        "Which regions may require further investigation? "
        "<choices>: [A: Right hemidiaphragm, B: Left lung, C: Spine, D: Cardiac region]"
    )
    assert assistant["content"][0]["text"] == (
        "<answer> ['A', 'C'] <reason> The right hemidiaphragm shows minimal air. "
        "<location> [[48, 116, 118, 135], [98, 0, 131, 222]]"
    )


@pytest.mark.parametrize(
    "question_type, answer, letters, expected",
    [
        ("open_ended", "Possible trauma.", [], "<answer> Possible trauma. <reason>"),
        ("closed_ended", "No.", [], "<answer> No. <reason>"),
        ("single_choice", "B", ["B"], "<answer> B <reason>"),
        ("multi_choice", '["A", "B", "D"]', [], "<answer> ['A', 'B', 'D'] <reason>"),
    ],
)
def test_answer_is_written_per_type(question_type, answer, letters, expected):
    row = gemex_row(question_type, answer=answer, answer_letters=letters)
    assert gemex.target_text(row).startswith(expected)


def test_open_and_closed_questions_list_no_options():
    row = gemex_row("closed_ended", choices=[], question="Is there any evidence of a left pneumothorax?")
    assert gemex.to_messages(row)[1]["content"][1]["text"] == "Is there any evidence of a left pneumothorax?"


def test_boxes_follow_the_model_family_convention():
    row = gemex_row(image_width=1000, image_height=500, boxes=[[100.0, 50.0, 500.0, 250.0]])
    assert gemex.location_text(row, "pixels") == "[[100, 50, 500, 250]]"
    assert gemex.location_text(row, "norm1000") == "[[100, 100, 500, 500]]"
    rw, rh = PixelBudget().resized_size(1000, 500)
    expected = [round(100 * rw / 1000), round(50 * rh / 500), round(500 * rw / 1000), round(250 * rh / 500)]
    assert gemex.location_text(row, "qwen2.5-vl") == str([expected])
    small = PixelBudget(max_pixels=56 * 56 * 4).resized_size(1000, 500)
    assert gemex.location_text(row, "qwen2.5-vl", PixelBudget(max_pixels=56 * 56 * 4)) == str(
        [
            [
                round(100 * small[0] / 1000),
                round(50 * small[1] / 500),
                round(500 * small[0] / 1000),
                round(250 * small[1] / 500),
            ]
        ]
    )


def test_prompt_without_answer_is_the_training_prompt_minus_the_reply():
    row = gemex_row()
    assert gemex.to_messages(row, with_answer=False) == gemex.to_messages(row)[:-1]
    assert rexvqa.to_messages(rexvqa_row(), with_answer=False) == rexvqa.to_messages(rexvqa_row())[:-1]


def test_folded_system_prompt_leads_the_user_text():
    messages = gemex.to_messages(gemex_row(), fold_system=True)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"][1]["text"].startswith(gemex.type_prompt("multi_choice") + "\n")


def test_rexvqa_has_one_image_part_per_study_image_and_letter_target():
    system, user, assistant = rexvqa.to_messages(rexvqa_row())
    assert system["content"][0]["text"] == rexvqa.INSTRUCTION
    assert [p["type"] for p in user["content"]] == ["image", "image", "text"]
    assert user["content"][-1]["text"] == (
        "Is there a pleural effusion? <choices>: [A: Yes, left, B: Yes, right, C: No, D: Cannot tell]"
    )
    assert assistant["content"][0]["text"] == "<answer> C <reason> The costophrenic angles are sharp."
    assert rexvqa.target_text(rexvqa_row(answer="", answer_index=3)).startswith("<answer> D ")


def test_messages_are_one_uniform_arrow_struct():
    rows = [gemex.to_messages(gemex_row(t)) for t in QUESTION_TYPES] + [rexvqa.to_messages(rexvqa_row())]
    column = pa.array(rows)
    part = column.type.value_type.field("content").type.value_type
    assert sorted(part.names) == ["text", "type"]
    assert column.to_pylist() == rows


def test_prompt_modules_import_no_torch():
    code = "import sys, gemex_dataset.prompts, rexvqa_dataset.prompts; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    assert subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=False).returncode == 0
