"""The one seam where fault tests stop a real process: named points on the way a build writes.

`CXR_VQA_STOP_AT=<point>` makes the process stop itself (SIGSTOP) the first time it reaches
`point`; the test then kills it, or signals it and lets it go on, and checks what the disk holds.
Unset (as outside tests) it costs one dictionary look-up a point. The points, in the order a build
meets them (`STOP_POINTS`), are each reached by one call of `stop_point`.
"""

from __future__ import annotations

import os
import signal

STOP_AT_ENV = "CXR_VQA_STOP_AT"
STOP_POINTS = {
    "start-up": "the command line not yet parsed, nothing read (`cxr_vqa.cli.main`)",
    "reading": "a build's first record about to be staged (`builders.assembly.staging`)",
    "shards": "a split's shards written, not yet closed and checksummed (`DatasetBuild.finish_split`)",
    "card": "every split written, the card and report not yet (`DatasetBuild`)",
    "renaming": "the output whole in its hidden folder, an existing output moved aside (`builders.assembly.lifecycle`)",
    "written": "the output renamed into place, the one it replaced not yet removed (`builders.assembly.lifecycle`)",
    "atomic-write": "a file written and synced under its temporary name, not yet renamed (`builders.files`)",
}
"""Each point, and what is on disk when a process stops there."""


def stop_point(point: str) -> None:
    """Stop this process here (SIGSTOP) when `CXR_VQA_STOP_AT` names `point`; otherwise nothing."""
    if point not in STOP_POINTS:
        raise ValueError(f"unknown stop point {point!r}; one of {', '.join(STOP_POINTS)}")
    if os.environ.get(STOP_AT_ENV) == point:
        os.environ.pop(STOP_AT_ENV)
        os.kill(os.getpid(), signal.SIGSTOP)
