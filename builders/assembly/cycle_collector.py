"""Python's cycle collector during a build: run rarely, over the objects the build makes."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def rare_collections(first_generation: int = 100_000) -> Iterator[None]:
    """Python's cycle collector run every `first_generation` allocations (not 700), objects made before frozen.

    A build makes millions of short-lived dicts and lists (a record, its row) and few cycles;
    at the default threshold the collector's passes over every live object cost as much as
    the build's own work, more as the heap grows.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(first_generation, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
