"""`cxr-vqa validate`'s rule `conversations`: the one-conversation-per-image config asks the `sft` questions, each once.

A config whose shards carry `question_ids` (GEMeX `sft_per_image`, ReXVQA `sft_per_study`) must,
split by split, hold every question of `sft` in exactly one row, with as many replies as
`question_ids` and each reply the text `sft` trains on for that question. Read a column at a
time (ids and messages; no image), each reply kept as a digest, compared as Arrow tables sorted by
question id.
"""

from __future__ import annotations

import hashlib
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
    texts = pa.ListArray.from_arrays(
        offsets(pc.list_value_length(content).to_numpy()), pc.struct_field(parts, "text").fill_null("")
    )
    per_row = np.bincount(row_of_turn[is_reply], minlength=len(messages))
    return pc.binary_join(texts, ""), per_row


def reply_digests(paths: list[Path], id_column: str) -> tuple[pa.Table, list[str]]:
    """(question_id, digest of its reply) of every turn in `paths`, read a batch at a time, and the rows whose
    reply count is not their question count. The replies are held only as 8-byte digests: a GEMeX train split
    has 1.6 M of them."""
    ids, digests, problems = [], [], []
    row = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=8192, columns=[id_column, "messages"]):
            replies, per_row = assistant_replies(batch.column("messages"))
            asked = batch.column(id_column)
            counts = (
                pc.list_value_length(asked).to_numpy()
                if pa.types.is_list(asked.type)
                else np.ones(len(asked), dtype=np.int64)
            )
            for k in np.flatnonzero(per_row != counts)[:1].tolist():
                problems.append(f"row {row + k} has {per_row[k]} replies for {counts[k]} question_ids")
            ids.append(pc.list_flatten(asked) if pa.types.is_list(asked.type) else asked)
            digests.append(
                pa.array(
                    [hashlib.blake2b(text.encode(), digest_size=8).digest() for text in replies.to_pylist()],
                    pa.binary(8),
                )
            )
            row += batch.num_rows
    if not ids:
        return pa.table({"question_id": pa.array([], pa.string()), "reply": pa.array([], pa.binary(8))}), problems
    return pa.table({"question_id": pa.concat_arrays(ids), "reply": pa.concat_arrays(digests)}).sort_by(
        "question_id"
    ), problems


def split_problems(name: str, split: str, conversation_paths: list[Path], question_paths: list[Path]) -> list[str]:
    """Each way `name`'s rows of `split` differ from the `sft` questions of `split`, in a line."""
    where = f"config {name!r} split {split!r}"
    if not question_paths:
        return [f"{where}: sft has no such split"]
    mine, _ = reply_digests(question_paths, "question_id")
    theirs, miscounted = reply_digests(conversation_paths, "question_ids")
    if miscounted:
        return [f"{where}: {miscounted[0]}"]
    if theirs.num_rows != mine.num_rows or not theirs["question_id"].equals(mine["question_id"]):
        repeated = theirs.num_rows - pc.count_distinct(theirs["question_id"]).as_py()
        missing = pc.filter(mine["question_id"], pc.invert(pc.is_in(mine["question_id"], theirs["question_id"])))
        return [
            f"{where}: {theirs.num_rows} turns for {mine.num_rows} sft questions ({repeated} asked twice, "
            f"{len(missing)} missing{', e.g. ' + missing[0].as_py() if len(missing) else ''})"
        ]
    differ = np.flatnonzero(~pc.equal(theirs["reply"], mine["reply"]).to_numpy(zero_copy_only=False))
    if len(differ):
        return [
            f"{where}: {len(differ)} replies differ from sft's (e.g. {theirs['question_id'][int(differ[0])].as_py()})"
        ]
    return []
