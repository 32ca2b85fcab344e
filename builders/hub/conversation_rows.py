"""`cxr-vqa validate`'s rule `conversations`: the one-conversation-per-image config asks the `sft` questions, each once.

A config whose shards carry `question_ids` (GEMeX `sft_per_image`, ReXVQA `sft_per_study`) must,
split by split, hold every question of `sft` in exactly one row, with as many replies as
`question_ids` and each reply the text `sft` trains on for that question. Read a column at a
time (ids and messages; no image), compared as Arrow tables sorted by question id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from builders.columns import offsets


def assistant_replies(messages: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Every assistant turn's text, rows in order, and how many each row has."""
    messages = messages.combine_chunks() if isinstance(messages, pa.ChunkedArray) else messages
    turns = pc.list_flatten(messages)
    row_of_turn = pc.list_parent_indices(messages).to_numpy()
    is_reply = pc.equal(pc.struct_field(turns, "role"), "assistant").to_numpy(zero_copy_only=False)
    replies = turns.filter(pa.array(is_reply))
    content = pc.struct_field(replies, "content")
    parts = pc.list_flatten(content)
    texts = pa.ListArray.from_arrays(offsets(pc.list_value_length(content).to_numpy()), pc.struct_field(parts, "text").fill_null(""))
    per_row = np.bincount(row_of_turn[is_reply], minlength=len(messages))
    return pc.binary_join(texts, ""), per_row


def split_problems(name: str, split: str, conversation_paths: list[Path], question_paths: list[Path]) -> list[str]:
    """Each way `name`'s rows of `split` differ from the `sft` questions of `split`, in a line."""
    if not question_paths:
        return [f"config {name!r} split {split!r}: sft has no such split"]
    asked = pq.read_table(question_paths, columns=["question_id", "messages"])
    expected, _ = assistant_replies(asked["messages"])
    rows = pq.read_table(conversation_paths, columns=["question_ids", "messages"])
    replies, per_row = assistant_replies(rows["messages"])
    ids = rows["question_ids"].combine_chunks()
    counts = pc.list_value_length(ids).to_numpy()
    if (per_row != counts).any():
        row = int(np.flatnonzero(per_row != counts)[0])
        return [f"config {name!r} split {split!r}: row {row} has {per_row[row]} replies for {counts[row]} question_ids"]
    theirs = pa.table({"question_id": pc.list_flatten(ids), "reply": replies}).sort_by("question_id")
    mine = pa.table({"question_id": asked["question_id"].combine_chunks(), "reply": expected}).sort_by("question_id")
    if theirs.num_rows != mine.num_rows or not theirs["question_id"].equals(mine["question_id"]):
        repeated = theirs.num_rows - pc.count_distinct(theirs["question_id"]).as_py()
        missing = set(mine["question_id"].to_pylist()) - set(theirs["question_id"].to_pylist())
        return [f"config {name!r} split {split!r}: {theirs.num_rows} turns for {mine.num_rows} sft questions"
                f" ({repeated} asked twice, {len(missing)} missing{', e.g. ' + min(missing) if missing else ''})"]
    differ = np.flatnonzero(~pc.equal(theirs["reply"], mine["reply"]).to_numpy(zero_copy_only=False))
    if len(differ):
        first = theirs["question_id"][int(differ[0])].as_py()
        return [f"config {name!r} split {split!r}: {len(differ)} replies differ from sft's (e.g. {first})"]
    return []
