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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.assembly.sft import ConversationFormat, chat_messages_array, format_choices, format_choices_array
from builders.box_frame import to_model_frame
from builders.columns import join_lists
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


def messages_array(rows: pa.Table, pixel_boxes: np.ndarray) -> pa.Array:
    """`to_messages` of every row at once (pixels convention, with the answer).

    `rows` holds the staged columns; `pixel_boxes` (one per item of `boxes_224`, in order) are
    the rows' boxes in the stored image's pixels.
    """
    qtype = rows["question_type"].to_numpy()
    instruction = pa.array([type_prompt(k) for k in range(len(QUESTION_TYPES))]).take(pa.array(qtype))
    is_choice = np.isin(qtype, [QUESTION_TYPES.index(name) for name in CHOICE_TYPES])
    question = _with_choices(rows["question"].combine_chunks(), rows["choices"].combine_chunks(), is_choice)
    target = pc.binary_join_element_wise(
        "<answer> ",
        _answers(rows, qtype),
        " <reason> ",
        rows["reason"],
        " <location> ",
        _locations(rows["boxes_224"].combine_chunks(), pixel_boxes),
        "",
    )
    return chat_messages_array(instruction, question, np.ones(len(qtype), dtype=np.int64), target)


def _with_choices(question: pa.Array, choices: pa.Array, is_choice: np.ndarray) -> pa.Array:
    """`question_text`: choice questions with non-empty choices get `` <choices>: [A: x, B: y]``."""
    written = pc.binary_join_element_wise(question, " <choices>: ", format_choices_array(choices), "")
    return pc.if_else(
        pa.array(is_choice & (pc.list_value_length(choices).fill_null(0).to_numpy() > 0)), written, question
    )


def _answers(rows: pa.Table, qtype: np.ndarray) -> pa.Array:
    """`answer_text`: multi-choice letters as a Python list repr, a single choice's letter, else the answer as stored."""
    letters, answer = rows["answer_letters"].combine_chunks(), rows["answer"].combine_chunks()
    count = pc.list_value_length(letters).fill_null(0).to_numpy()
    multi, single = qtype == QUESTION_TYPES.index("multi_choice"), qtype == QUESTION_TYPES.index("single_choice")
    flat = pc.list_flatten(letters)
    quoted = pc.binary_join_element_wise("'", flat, "'", "")
    first = (
        flat.take(pa.array(np.r_[0, np.cumsum(count)][:-1], mask=count == 0))
        if len(flat)
        else pa.nulls(len(count), pa.string())
    )
    written = pc.if_else(
        pa.array(multi),
        join_lists(quoted, count, "[", ", ", "]"),
        pc.if_else(pa.array(single & (count > 0)), first, answer),
    )
    unlettered = np.flatnonzero(multi & (count == 0))
    if len(unlettered):  # no answer letters staged: read them from the answer text, as `answer_text` does
        fixed = written.to_pylist()
        for k in unlettered.tolist():
            fixed[k] = answer_text({"question_type": int(qtype[k]), "answer_letters": [], "answer": answer[k].as_py()})
        written = pa.array(fixed, pa.string())
    return written


def _locations(boxes_224: pa.Array, pixel_boxes: np.ndarray) -> pa.Array:
    """`location_text` in pixels: ``[[x1, y1, x2, y2], ...]`` of integers (Python's round, half to even)."""
    corners = pc.cast(pa.array(np.rint(pixel_boxes).astype(np.int64).ravel()), pa.string())
    boxes = join_lists(corners, np.full(len(pixel_boxes), 4), "[", ", ", "]")
    return join_lists(boxes, pc.list_value_length(boxes_224).fill_null(0).to_numpy(), "[", ", ", "]")
