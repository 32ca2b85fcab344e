"""One row of the fidelity table: a figure measured on a synthetic release beside the paper's and the
public records' value, and the range it must fall in."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.tables import markdown_table as table


@dataclass(frozen=True)
class Figure:
    """A measured figure of a synthetic release and the range it is accepted in.

    `paper` is the value the paper reports (with `paper_source`, e.g. "GEMeX Table 3"), `public` the
    value measured on the public sample records (../shared/samples) when they are present, else None.
    """

    dataset: str
    figure: str
    synthetic: float
    paper: float | None
    paper_source: str
    public: float | None
    low: float
    high: float

    @property
    def within(self) -> bool:
        return self.low <= self.synthetic <= self.high


def markdown_table(figures: list[Figure]) -> str:
    """The figures as one markdown table, out-of-range rows marked."""

    def cell(value: float | None) -> str:
        return "" if value is None else f"{value:.4g}"

    head = ["dataset", "figure", "synthetic", "paper", "source", "public", "range", "ok"]
    return table(
        head,
        (
            [f.dataset, f.figure, cell(f.synthetic), cell(f.paper), f.paper_source, cell(f.public)]
            + [f"{cell(f.low)}-{cell(f.high)}", "yes" if f.within else "NO"]
            for f in figures
        ),
    )
