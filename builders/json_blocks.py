"""JSON Lines read by Arrow's JSON reader, a block of whole lines at a time.

Arrow parses a block on every core into columns typed by an explicit schema, many times
faster than a record at a time in Python. It is as strict as Python's `json` or stricter
(a bad token, bad UTF-8 or a value of another type fails the block), but a failure names no
line: a block Arrow refuses, or whose rows cannot be matched one to one with its lines (a
blank line, two objects on one line), is handed back as lines for the record-by-record
reader, which says exactly what is wrong where.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj

BLOCK_BYTES = 16 << 20
"""Bytes of whole lines parsed at a time: large enough for Arrow's threads, small enough for flat memory."""
_BLANK_AFTER_A_LINE = re.compile(rb"\n[ \t\r]*\n")


@dataclass
class LineBlock:
    """Whole lines of a file: their bytes and the number of the first (from 1)."""

    data: bytes
    first_line: int

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, bytes) of each line, its end kept, as iterating the file in binary gives them."""
        start, number = 0, self.first_line
        while start < len(self.data):
            end = self.data.find(b"\n", start)
            end = len(self.data) if end == -1 else end + 1
            yield number, self.data[start:end]
            start, number = end, number + 1

    @cached_property
    def line_count(self) -> int:
        return self.data.count(b"\n") + (not self.data.endswith(b"\n"))


def line_blocks(
    path: Path, block_bytes: int = BLOCK_BYTES, read_bytes: Callable[[bytes], object] | None = None
) -> Iterator[LineBlock]:
    """The file's lines in blocks of about `block_bytes`, each cut after a line's end; `read_bytes`
    is given every byte read, in order (a hash of the file taken as it is read)."""
    first_line, carry = 1, b""
    with open(path, "rb") as f:
        while chunk := f.read(block_bytes):
            if read_bytes is not None:
                read_bytes(chunk)
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            block, carry = LineBlock(data[:cut], first_line), data[cut:]
            first_line += block.line_count
            yield block
    if carry:
        yield LineBlock(carry, first_line)


def _has_blank_line(data: bytes) -> bool:
    """Whether a line (other than an unended last one) holds only JSON whitespace: Arrow skips such lines."""
    first_end = data.find(b"\n")
    blank_first = first_end >= 0 and not data[:first_end].strip(b" \t\r")
    return blank_first or _BLANK_AFTER_A_LINE.search(data) is not None


def read_block(block: LineBlock, schema: pa.Schema) -> pa.Table | None:
    """The block's records as columns of `schema` (other keys ignored), one row per line; None where
    Arrow refuses the block or its rows are not one per line."""
    if _has_blank_line(block.data):
        return None
    try:
        table = pj.read_json(
            pa.BufferReader(block.data),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
        table.validate(full=True)  # the reader does not check that strings are UTF-8
    except (pa.ArrowException, ValueError):
        return None
    return table if table.num_rows == block.line_count else None
