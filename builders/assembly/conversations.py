"""One conversation per image: the `sft_per_image` (GEMeX) and `sft_per_study` (ReXVQA) configs.

The `sft` config asks one question per row, so an image with ten questions goes through the
vision tower and the language model ten times, and a non-streaming `load_dataset` copies it
ten times into its Arrow cache. A conversation row asks all of an image's (a study's)
questions as user/assistant turns, with the same instructions and replies as `sft`
(`builders.assembly.sft.conversation`), the image parts in the first user turn only.

Turn order is shuffled by a seed and the image's key (`turn_order`), so it carries no signal
(release order puts question types in a fixed order) and does not depend on how the build
cut its chunks. A conversation whose text would pass `text_tokens` (estimated at
`CHARS_PER_TOKEN` characters a token) is cut into several rows of the same image, balanced
by text length (`balanced_parts`); every question is in exactly one row.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from datasets import Features

from builders.assembly.sft import conversation, system_text

CHARS_PER_TOKEN = 4
"""English text in the Qwen2/Llama tokenizers: about four characters a token."""
TEXT_TOKENS = 2048
"""Default text tokens of one conversation row. With the default pixel budget (1,003,520 pixels: 1,280
image tokens for Qwen2.5-VL's 28-pixel patches) a row stays under 4,096 tokens with room for the chat
template's few tokens a turn; about 10 GEMeX questions of ~150 tokens each fit, so most images are one row."""
TURN_SEED = 0
"""Default seed of the turn order."""


def turn_order(seed: int, key: str, turns: int) -> np.ndarray:
    """A permutation of `turns`, fixed by `seed` and the image's (study's) `key` alone."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, digest]).permutation(turns)


def balanced_parts(costs: list[int], per_row: int, limit: int) -> list[list[int]]:
    """Turns (by position) cut into runs whose `per_row + sum(costs)` stays within `limit`, as few and as even as can be.

    The runs are cut where the running total crosses equal shares; more runs are tried until
    each fits, down to one turn a row (a turn longer than `limit` alone keeps its own row).
    """
    total = sum(costs)
    if not costs:
        return []
    parts = max(1, math.ceil(total / max(limit - per_row, 1)))
    middle = np.cumsum(costs) - np.asarray(costs) / 2
    while True:
        if parts >= len(costs):
            return [[k] for k in range(len(costs))]
        owner = np.minimum((middle * parts / max(total, 1)).astype(np.int64), parts - 1)
        runs = [np.flatnonzero(owner == p).tolist() for p in range(parts)]
        runs = [run for run in runs if run]
        if all(per_row + sum(costs[k] for k in run) <= limit for run in runs):
            return runs
        parts += 1


@dataclass(frozen=True)
class ConversationLayout:
    """How one dataset's question rows become conversation rows.

    `key` groups the question rows (`image_path`, `study_id`); `group_columns` gives a group's
    image-level columns (image, path, ids); `turn_columns` are the per-question typed fields kept
    in `turns` (one struct a turn, in turn order) so that a recipe can rebuild the turns in another
    model family's box convention; `group_id` names a group from one of its rows.
    """

    config: str
    key: str
    features: Features
    turn_columns: tuple[str, ...]
    group_columns: Callable[[list[dict]], dict]
    group_id: Callable[[dict], str]
    seed: int = TURN_SEED
    text_tokens: int = TEXT_TOKENS

    def rows(self, questions: list[dict]) -> list[dict]:
        """The conversation rows of one image's (study's) question rows, which must carry `messages`."""
        if not questions:
            return []
        shared = self.group_columns(questions)
        name = self.group_id(questions[0])
        ordered = [questions[k] for k in turn_order(self.seed, name, len(questions))]
        instructions = {system_text(q["messages"]) for q in ordered}
        per_row = len(next(iter(instructions)) or "") if len(instructions) == 1 else 0
        costs = [_turn_chars(q["messages"], with_instruction=not per_row) for q in ordered]
        runs = balanced_parts(costs, per_row, self.text_tokens * CHARS_PER_TOKEN)
        out = []
        for part, run in enumerate(runs):
            turns = [ordered[k] for k in run]
            out.append({"conversation_id": f"{name}/{part}", **shared,
                        "question_ids": [q["question_id"] for q in turns],
                        "turns": [{c: q[c] for c in self.turn_columns} for q in turns],
                        "messages": conversation([q["messages"] for q in turns])})
        return out

    def table_rows(self, table: pa.Table) -> list[dict]:
        """The conversation rows of a chunk of question rows sorted by `key` (whole groups)."""
        groups: dict[str, list[dict]] = {}
        for row in table.to_pylist():
            groups.setdefault(row[self.key], []).append(row)
        return [row for questions in groups.values() for row in self.rows(questions)]


def _turn_chars(messages: list[dict], with_instruction: bool) -> int:
    return sum(len(part["text"] or "") for m in messages if with_instruction or m["role"] != "system" for part in m["content"])
