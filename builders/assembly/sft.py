"""The `sft` config: rows that TRL's `SFTTrainer` takes as they are.

TRL's conversational vision format is an image column (`image`, or `images` for several)
and a `messages` column of chat turns whose content is a list of `{"type": "image"}` /
`{"type": "text", "text": ...}` parts. The build writes `messages` into the same shards
as the typed columns, made by the same prompt functions the recipes use
(`gemex_dataset.prompts`, `rexvqa_dataset.prompts`), so the `sft` config costs no second
copy of any image: it names the same files as `default`. Both datasets' prompts write choices
the same way (`format_choices`).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from datasets import Features, List, Value

from builders.pixel_budget import PixelBudget

MESSAGES = List({"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})})
"""Chat turns; every content part has both keys (`text` is null for an image part), so the column is one Arrow type."""
MESSAGES_ARROW = Features({"messages": MESSAGES}).arrow_schema.field("messages").type


def question_features(image: dict, columns: dict, image_mode: str) -> Features:
    """A question row's columns: `question_id`, its image column (`image`: name -> feature), the dataset's own
    `columns`, and `messages`. `none` mode reads no image: neither the image column nor `messages` (the
    `sft` config needs the image)."""
    with_images = image_mode != "none"
    return Features(
        {"question_id": Value("string"), **(image if with_images else {}), **columns}
        | ({"messages": MESSAGES} if with_images else {})
    )


def chat_messages(
    instruction: str, question: str, images: int, target: str | None, fold_system: bool = False
) -> list[dict]:
    """System instruction, a user turn of `images` image parts then the question, and the target reply.

    `fold_system` puts the instruction at the start of the user's text instead, for chat
    templates that reject a system role; `target=None` leaves the reply out (generation).
    """
    messages: list[dict] = []
    if fold_system:
        question = f"{instruction}\n{question}"
    else:
        messages.append({"role": "system", "content": [_text(instruction)]})
    messages.append({"role": "user", "content": [_image() for _ in range(images)] + [_text(question)]})
    if target is not None:
        messages.append({"role": "assistant", "content": [_text(target)]})
    return messages


@dataclass(frozen=True)
class ConversationFormat:
    """How a dataset's row reads as a chat: each dataset gives the parts, `messages` assembles them alike."""

    instruction: Callable[[dict], str]
    question_text: Callable[[dict], str]
    image_count: Callable[[dict], int]
    target_text: Callable[[dict, str, PixelBudget | None], str]

    def messages(
        self,
        row: dict,
        box_convention: str = "pixels",
        with_answer: bool = True,
        fold_system: bool = False,
        budget: PixelBudget | None = None,
    ) -> list[dict]:
        """The row in TRL's conversational vision format (the images themselves go in the image column).

        `fold_system` puts the instruction at the start of the user's text instead of a system turn, for
        chat templates that reject a system role. `budget` is the processor's resize, for box conventions
        in the resized image's pixels (``qwen2.5-vl``).
        """
        target = self.target_text(row, box_convention, budget) if with_answer else None
        return chat_messages(self.instruction(row), self.question_text(row), self.image_count(row), target, fold_system)

    def column(self, rows: pa.Table) -> pa.Array:
        """`messages` of every row of a table (pixels convention, with the answer), as the build writes them."""
        prompt_columns = rows.drop_columns([name for name in ("image", "images") if name in rows.column_names])
        return pa.array([self.messages(row) for row in prompt_columns.to_pylist()], MESSAGES_ARROW)


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _image() -> dict:
    return {"type": "image", "text": None}


def image_count(row: dict) -> int:
    """How many images a row shows: the length of its `images` (ReXVQA), or its one `image` (GEMeX).
    A row's messages hold exactly this many image parts (`cxr-vqa validate`'s rule `image-parts`)."""
    if row.get("images") is not None:
        return len(row["images"])
    return int(row.get("image") is not None)


def format_choices(choices: Sequence[str]) -> str:
    """``[A: x, B: y]``, as in the released human turns."""
    return "[" + ", ".join(f"{letter}: {text}" for letter, text in zip(string.ascii_uppercase, choices)) + "]"


def conversation(questions: list[list[dict]], images: int) -> list[dict]:
    """One conversation from several questions' `chat_messages` (each with its reply), in the given order.

    The first user turn carries `images` image parts, one per image of the conversation's row
    (`image_count`), and no other turn any: the questions' own image parts are not copied, since
    questions of one study may show different images, or list one image twice. A system instruction that every question
    shares becomes the one system turn; where they differ (GEMeX's question-type-aware prompts
    on an image with questions of several types), each user turn starts with its own, as
    `fold_system` writes it: a system turn speaks for the whole conversation, and a later
    question of another type must not be answered in the format of the first.
    """
    instructions = [system_text(messages) for messages in questions]
    shared = len(set(instructions)) == 1 and instructions[0] is not None
    turns: list[dict] = [{"role": "system", "content": [_text(instructions[0])]}] if shared else []
    for k, (messages, instruction) in enumerate(zip(questions, instructions)):
        user = next(m for m in messages if m["role"] == "user")
        text = "\n".join(part["text"] for part in user["content"] if part["type"] == "text")
        if instruction is not None and not shared:
            text = f"{instruction}\n{text}"
        turns.append({"role": "user", "content": [*(_image() for _ in range(images if k == 0 else 0)), _text(text)]})
        turns.extend(m for m in messages if m["role"] == "assistant")
    return turns


def system_text(messages: list[dict]) -> str | None:
    system = next((m for m in messages if m["role"] == "system"), None)
    return None if system is None else "".join(part["text"] for part in system["content"] if part["type"] == "text")
