"""The Markdown tables the benchmarks print (and `benchmarks/README.md` holds)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A header row, its rule and one line per row of cells."""
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(row) + " |" for row in rows]
    )
