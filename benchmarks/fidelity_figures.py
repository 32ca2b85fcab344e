"""One measured figure of a synthetic release beside the paper's and the public records' value.

Shared by `fidelity_gemex.py`, `fidelity_rexvqa.py` and `fidelity.py` (the table of both).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Figure:
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
