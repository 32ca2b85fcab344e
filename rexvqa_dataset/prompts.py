"""ReXVQA rows as chat conversations: one image part per study image, the four options, and a
target in the same grammar as GEMeX's (``<answer> B <reason> {explanation}``), so that a model
trained on both datasets learns one output format and the letter is easy to read off.

Imports no torch (the dataset build uses it too). Content parts are dicts with exactly the keys
``type`` and ``text`` (``text`` None for image parts): one uniform Arrow struct.
"""

from __future__ import annotations

import string

from builders.assembly.sft import ConversationFormat, format_choices
from builders.pixel_budget import PixelBudget
from rexvqa_dataset.scoring import task_of

INSTRUCTION = (
    "Input a chest X-ray study and a multiple-choice question, and the assistant will output the letter of "
    "the correct option with a detailed reason."
)
"""The fixed system instruction, worded like GEMeX's type prompts."""


def question_text(row: dict) -> str:
    return f"{row['question']} <choices>: {format_choices(row['options'])}"


def answer_letter(row: dict) -> str:
    """The answer letter, from `answer` or else from `answer_index`."""
    answer = (row.get("answer") or "").strip()
    if answer:
        return answer[0].upper()
    return string.ascii_uppercase[int(row["answer_index"])]


def target_text(row: dict, box_convention: str = "pixels", budget: PixelBudget | None = None) -> str:
    """``<answer> B <reason> {explanation}``; ReXVQA has no boxes, so the convention is unused."""
    return f"<answer> {answer_letter(row)} <reason> {row.get('explanation') or ''}".rstrip()


NEGATION = "Negation Assessment"
"""The task whose answer is the one option the study does not show."""


def shows(row: dict, letter: str) -> bool:
    """Whether the study shows option `letter`'s finding: the answer does, except in a negation question, where
    every other option does."""
    return (letter == answer_letter(row)) != (task_of(row) == NEGATION)


def checklist_text(row: dict, box_convention: str = "pixels", budget: PixelBudget | None = None) -> str:
    """``<reason> A: Chest tube no, B: Pleural effusion yes, C: ... no, D: ... no <answer> B``: a verdict on each
    option (whether the study shows it) before the letter those verdicts give, so that every option is read
    against the image in turn; scored by likelihood (`generate.py --choose_by likelihood`)."""
    letters = string.ascii_uppercase[: len(row["options"])]
    verdicts = ", ".join(
        f"{letter}: {option} {'yes' if shows(row, letter) else 'no'}" for letter, option in zip(letters, row["options"])
    )
    return f"<reason> {verdicts} <answer> {answer_letter(row)}"


def image_count(row: dict) -> int:
    """How many images the study has: `images`, or `image_paths` in a build without images."""
    images = row.get("images")
    if images is None:
        images = row.get("image_paths") or []
    return len(images)


def instruction(row: dict) -> str:
    return INSTRUCTION


CONVERSATION = ConversationFormat(instruction, question_text, image_count, target_text)
to_messages = CONVERSATION.messages
"""A ReXVQA row as TRL's conversational vision format, one image part per study image."""
CHECKLIST = ConversationFormat(instruction, question_text, image_count, checklist_text)
"""The same conversation with a checklist reply (`checklist_text`) in place of the letter and explanation."""
