"""Which gating each dataset asks for on the Hub: its own prompt and access form, from its build.

`cxr-vqa publish --gated` writes these into a card built without them (a synthetic build's);
a build of real data writes its own into its card.
"""

from __future__ import annotations

from builders.hub.publish import Gating
from gemex_dataset import build as gemex
from rexvqa_dataset import build as rexvqa

GATING: dict[str, Gating] = {
    "gemex": (gemex.GATED_PROMPT, gemex.GATED_FIELDS),
    "rexvqa": (rexvqa.GATED_PROMPT, rexvqa.GATED_FIELDS),
}
