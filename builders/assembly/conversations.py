"""One conversation per image: the `sft_per_image` (GEMeX) and `sft_per_study` (ReXVQA) configs.

The `sft` config asks one question per row, so an image with ten questions goes through the
vision tower and the language model ten times, and a non-streaming `load_dataset` copies it
ten times into its Arrow cache. A conversation row asks all of an image's (a study's)
questions as user/assistant turns, with the same instructions and replies as `sft`
(`builders.assembly.sft.conversation`), the image parts in the first user turn only: one per image of
the row (the image, or the study's images each once), whatever the questions themselves list.

Turn order is shuffled by a seed and the image's key (`turn_order`), so it carries no signal
(release order puts question types in a fixed order) and does not depend on how the build
cut its chunks. A conversation whose text would pass `text_tokens` (estimated at
`CHARS_PER_TOKEN` characters a token) is cut into several rows of the same image, as few as
fit, balanced by text length (`balanced_parts`); a question too long for any row has one of
its own, and every question is in exactly one row.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from datasets import Features, List, Value

from builders.assembly.sft import MESSAGES, conversation, image_count, system_text

CHARS_PER_TOKEN = 4
"""English text in the Qwen2/Llama tokenizers: about four characters a token."""
TEXT_TOKENS = 2048
"""Default text tokens of one conversation row. With the default pixel budget (`builders.pixel_budget`: 501,760
pixels, at most 640 image tokens for Qwen2.5-VL's 28-pixel patches) a row stays under 3,000 tokens with room for the chat
template's few tokens a turn; about 10 GEMeX questions of ~150 tokens each fit, so most images are one row."""
TURN_SEED = 0
"""Default seed of the turn order."""


def conversation_features(
    questions: Features, group_columns: tuple[str, ...], turn_columns: tuple[str, ...]
) -> Features:
    """A conversation config's columns, typed as the question rows' (`questions`): its id, the group's columns,
    `question_ids`, `turns` (one struct of `turn_columns` a turn) and `messages`."""
    return Features(
        {
            "conversation_id": Value("string"),
            **{c: questions[c] for c in group_columns},
            "question_ids": List(Value("string")),
            "turns": List({c: questions[c] for c in turn_columns}),
            "messages": MESSAGES,
        }
    )


def conversation_column_docs(
    column_docs: dict[str, str], group_columns: tuple[str, ...], turn_columns: tuple[str, ...], group: str, key: str
) -> dict[str, str]:
    """The card's line for each column of `conversation_features`; a group (`image`, `study`) is named by `key`."""
    return {
        "conversation_id": f"`<split>/<{key}>/<k>`: the {group}'s k-th conversation row (k > 0 only where its conversation was cut at the length limit)",
        **{c: column_docs[c] for c in group_columns},
        "question_ids": "the `question_id`s of the row's turns, in turn order",
        "turns": f"per turn, in turn order, the question's typed columns ({', '.join(turn_columns)})",
        "messages": f"the {group}'s questions as TRL chat turns, its image parts in the first user turn",
    }


def turn_order(seed: int, key: str, turns: int) -> list[int]:
    """A permutation of `turns`, fixed by `seed` and the image's (study's) `key` alone (Python's `random`
    seeded by the string through SHA-512: the same on every run and machine)."""
    order = list(range(turns))
    random.Random(f"{seed}/{key}").shuffle(order)
    return order


def balanced_parts(costs: list[int], per_row: int, limit: int) -> list[list[int]]:
    """Turns (by position) cut into rows whose `per_row + sum(costs)` stays within `limit`, as few and as even as can be.

    A turn too long for any row has a row of its own; the others stay together where they fit in
    one row, else are cut into the fewest runs (in turn order) that fit (`_fitting_runs`). Each
    row keeps its turns in turn order, and the rows go in the order of their first turns. For n
    turns in k rows the search costs O(n + k log n log limit).
    """
    if not costs:
        return []
    cost = np.asarray(costs, dtype=np.int64)
    budget = limit - per_row
    too_long = cost > budget
    rest = np.flatnonzero(~too_long)
    rows = [[k] for k in np.flatnonzero(too_long).tolist()]
    if rest.size:
        rows += [rest[run].tolist() for run in _fitting_runs(cost[rest], budget)]
    return sorted(rows, key=lambda row: row[0])


def _fitting_runs(cost: np.ndarray, budget: int) -> list[np.ndarray]:
    """Positions of `cost` (each within `budget`) cut into the fewest runs whose sums stay within `budget`.

    The runs are cut where the running total crosses equal shares, where those runs fit; else
    where the largest run is as small as the fewest runs allow (the smallest cap, found by
    bisection, that greedy filling meets in that many runs).
    """
    positions = np.arange(cost.size)
    total = int(cost.sum())
    if total <= budget:
        return [positions]
    ends = np.cumsum(cost)
    parts = len(_filled_run_ends(ends, budget))
    middle = ends - cost / 2
    owner = np.minimum((middle * parts / total).astype(np.int64), parts - 1)
    cuts = np.flatnonzero(np.diff(owner)) + 1
    if np.add.reduceat(cost, np.r_[0, cuts]).max() <= budget:
        return np.split(positions, cuts)
    low, high = max(int(cost.max()), math.ceil(total / parts)), budget
    while low < high:
        cap = (low + high) // 2
        if len(_filled_run_ends(ends, cap)) <= parts:
            high = cap
        else:
            low = cap + 1
    return np.split(positions, _filled_run_ends(ends, low)[:-1])


def _filled_run_ends(ends: np.ndarray, cap: int) -> list[int]:
    """Where each run ends (exclusive) when runs are filled in turn up to `cap`; `ends` are the running
    totals of costs that are each within `cap`, so every run takes at least one."""
    run_ends, start = [], 0
    while start < ends.size:
        before = int(ends[start - 1]) if start else 0
        start = int(np.searchsorted(ends, before + cap, side="right"))
        run_ends.append(start)
    return run_ends


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
            out.append(
                {
                    "conversation_id": f"{name}/{part}",
                    **shared,
                    "question_ids": [q["question_id"] for q in turns],
                    "turns": [{c: q[c] for c in self.turn_columns} for q in turns],
                    "messages": conversation([q["messages"] for q in turns], image_count(shared)),
                }
            )
        return out

    def table_rows(self, table: pa.Table) -> list[dict]:
        """The conversation rows of a chunk of question rows sorted by `key` (whole groups); only the columns
        a conversation row is made of are converted to Python."""
        made_of = {
            self.key,
            "question_id",
            "messages",
            *self.turn_columns,
            *(c for c in self.features if c not in ("conversation_id", "question_ids", "turns")),
        }
        groups: dict[str, list[dict]] = {}
        for row in table.select([c for c in table.column_names if c in made_of]).to_pylist():
            groups.setdefault(row[self.key], []).append(row)
        return [row for questions in groups.values() for row in self.rows(questions)]


def _turn_chars(messages: list[dict], with_instruction: bool) -> int:
    return sum(
        len(part["text"] or "") for m in messages if with_instruction or m["role"] != "system" for part in m["content"]
    )
