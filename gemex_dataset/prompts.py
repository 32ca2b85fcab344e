"""GEMeX rows as chat conversations: the paper's question-type-aware prompt and its target.

Imports no torch: the dataset build uses these functions too (the `sft` config), and the
recipes use the same ones for training and for generation, so a model is asked at test time
exactly what it was trained on.

The text follows the authors' LLaVA training layout (formats.md, layout 2):

- system: the type prompt of the question's format (paper, Table 4),
- user: the image, then ``{question}`` and, for choice questions,
  `` <choices>: [A: Left lung, B: Normal]``,
- assistant: ``<answer> {answer} <reason> {reason} <location> [[x1, y1, x2, y2], ...]`` with
  multi-choice answers written as Python reprs (``['A', 'C']``) and boxes as integers in the
  model family's convention (`builders.box_frame`).

Every content part is a dict with exactly the keys ``type`` and ``text`` (``text`` is None for
an image part) so a column of messages is one uniform Arrow struct.
"""

from __future__ import annotations

import json

from builders.assembly.sft import ConversationFormat, format_choices
from builders.box_frame import to_model_frame
from builders.pixel_budget import PixelBudget
from gemex_dataset.features import QUESTION_TYPES

TYPE_PROMPTS: dict[str, str] = {
    "open_ended": "Input an open-ended question, and the assistant will output its answer with a detailed "
    "reason and corresponding visual location.",
    "closed_ended": "Input a closed-ended question, and the assistant will output its answer (yes or no) with a "
    "detailed reason and corresponding visual location.",
    "single_choice": "Input a single-choice question, and the assistant will output its answer (an option) with a "
    "detailed reason and corresponding visual location.",
    "multi_choice": "Input a multi-choice question, and the assistant will output its answer (some options) with a "
    "detailed reason and corresponding visual location.",
}
"""The released `type_prompt` strings, verbatim (checked against the public training sample)."""

CHOICE_TYPES = ("single_choice", "multi_choice")


def question_type_name(question_type: int | str) -> str:
    """The format's name from a row's `question_type`: the ClassLabel int of a built row, its name,
    or the LLaVA file's plural `q_type` (``multi_choice_questions``)."""
    if isinstance(question_type, int):
        return QUESTION_TYPES[question_type]
    name = question_type.removesuffix("_questions").removesuffix("_question")
    if name not in QUESTION_TYPES:
        raise ValueError(f"unknown GEMeX question type {question_type!r}; expected one of {', '.join(QUESTION_TYPES)}")
    return name


def type_prompt(question_type: int | str) -> str:
    """The paper's question-type-aware instruction for this format."""
    return TYPE_PROMPTS[question_type_name(question_type)]


def question_text(row: dict) -> str:
    """The user's text: the question, and the lettered options for choice questions."""
    text = row["question"]
    if question_type_name(row["question_type"]) in CHOICE_TYPES and row.get("choices"):
        text += f" <choices>: {format_choices(row['choices'])}"
    return text


def answer_text(row: dict) -> str:
    """The answer as the authors' targets write it: free text, ``Yes.``/``No.``, ``C``, ``['A', 'C']``."""
    kind = question_type_name(row["question_type"])
    letters = list(row.get("answer_letters") or [])
    if kind == "multi_choice":
        if not letters:
            letters = json.loads(row["answer"]) if row["answer"].lstrip().startswith("[") else [row["answer"]]
        return repr([str(letter) for letter in letters])
    if kind == "single_choice" and letters:
        return letters[0]
    return row["answer"]


def location_text(row: dict, box_convention: str = "pixels", budget: PixelBudget | None = None) -> str:
    """``[[x1, y1, x2, y2], ...]`` in integers of `box_convention`; `boxes` are in the stored image's pixels."""
    width, height = row["image_width"], row["image_height"]
    boxes = [to_model_frame(box, width, height, box_convention, budget) for box in row.get("boxes") or []]
    return str(boxes)


def target_text(row: dict, box_convention: str = "pixels", budget: PixelBudget | None = None) -> str:
    """The assistant's reply: ``<answer> ... <reason> ... <location> [[...]]``."""
    return (
        f"<answer> {answer_text(row)} <reason> {row['reason']} <location> {location_text(row, box_convention, budget)}"
    )


def instruction(row: dict) -> str:
    return type_prompt(row["question_type"])


def image_count(row: dict) -> int:
    """One image a question, whether or not the build holds it."""
    return 1


CONVERSATION = ConversationFormat(instruction, question_text, image_count, target_text)
to_messages = CONVERSATION.messages
"""A GEMeX row as TRL's conversational vision format (`ConversationFormat.messages`)."""
