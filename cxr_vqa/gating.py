"""Which gating each dataset asks for on the Hub: its own prompt and access form, from its card's release facts.

`cxr-vqa publish --gated` writes these into a card built without them (a synthetic build's);
a build of real data writes its own into its card.
"""

from __future__ import annotations

from builders.assembly.card import release_facts
from builders.hub.publish import Gating

GATING: dict[str, Gating] = {
    dataset: (release_facts(dataset)["gated_prompt"], release_facts(dataset)["gated_fields"])
    for dataset in ("gemex", "rexvqa")
}
