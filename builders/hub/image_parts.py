"""`cxr-vqa validate`'s rule `image-parts`: a row's `messages` hold one image part per image the row shows.

TRL's vision collators pair the `{"type": "image"}` parts of the stored `messages` with the row's
`images` (or its one `image`) in order; a row with more parts than images fails in the processor,
one with fewer trains on the wrong pictures. Read a batch at a time and only the leaves counted
(each image's `path`, each part's `type`): no image bytes, no text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

IMAGE_COLUMNS = ("images", "image")
"""A row's images: a list (ReXVQA) or one image (GEMeX)."""
_PART_TYPES = "messages.list.element.content.list.element.type"


def image_parts(messages: pa.Array) -> np.ndarray:
    """How many `{"type": "image"}` parts each row's messages hold, over all its turns."""
    turns = pc.list_flatten(messages)
    parts = pc.list_flatten(pc.struct_field(turns, "content"))
    is_image = pc.fill_null(pc.equal(pc.struct_field(parts, "type"), "image"), False).to_numpy(zero_copy_only=False)
    turn_of_part = pc.list_parent_indices(pc.struct_field(turns, "content")).to_numpy()
    row_of_turn = pc.list_parent_indices(messages).to_numpy()
    return np.bincount(row_of_turn[turn_of_part[is_image]], minlength=len(messages))


def shown_images(column: pa.Array) -> np.ndarray:
    """How many images each row shows: the length of a list of images, 1 for a single image that is there."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return column.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)


def file_problem(path: Path) -> str | None:
    """The first row of a shard whose image parts are not its images, in a line; None when every row agrees
    (or the shard has no `messages` or no image column)."""
    names = pq.read_schema(path).names
    column = next((c for c in IMAGE_COLUMNS if c in names), None)
    if column is None or "messages" not in names:
        return None
    leaf = f"{column}.list.element.path" if column == "images" else f"{column}.path"
    try:
        return _first_mismatch(pq.ParquetFile(path).iter_batches(batch_size=8192, columns=[leaf, _PART_TYPES]), column)
    except (pa.ArrowException, OSError):  # damaged pages: the checksum check names the file
        return None


def _first_mismatch(batches, column: str) -> str | None:
    row = 0
    for batch in batches:
        messages = batch.column("messages")
        shown = shown_images(batch.column(column))
        parts = image_parts(messages.combine_chunks() if isinstance(messages, pa.ChunkedArray) else messages)
        wrong = np.flatnonzero(parts != shown)
        if len(wrong):
            k = int(wrong[0])
            return (
                f"row {row + k} shows {shown[k]} image(s) in `{column}` but its messages hold {parts[k]} image part(s)"
                f"{f' ({len(wrong)} such rows in the first {row + batch.num_rows})' if len(wrong) > 1 else ''}: "
                "TRL pairs the parts with the images in order"
            )
        row += batch.num_rows
    return None
