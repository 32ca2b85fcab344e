"""The pixel budget: how many pixels of a radiograph a model with a pixel-count resize sees.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL resize every image to an area within ``[min_pixels,
max_pixels]`` (sides multiples of 28, or 32 for Qwen3-VL) and spend one token per 28 x 28 (32 x 32)
pixels. Their released processors allow 12.8 M (16.8 M) pixels, so a 2,539 x 3,050 MIMIC-CXR image
costs about 9,900 tokens, in each of its questions. The recipes (`training_recipes/sft.py`,
`generate.py`, the lmms-eval tasks) and `cxr-vqa evaluate`'s box conversion all read their bounds
from here, so a model is trained, asked and scored at one budget.

Why ``MAX_PIXELS = 640 * 28 * 28`` (501,760, about 0.5 M): a 2,539 x 3,050 image becomes
644 x 756 (621 tokens), about 0.55 mm a pixel for MIMIC-CXR's 0.139 mm spacing. A 6 mm nodule is
then ~11 pixels across and a central line (2-3 mm) 4-5 pixels wide; at the 336 px the GEMeX paper
trains at (~1.2 mm a pixel) they are 5 and 2, below what a 14-pixel ViT patch resolves. It is
more than the 512-518 px square inputs of CheXagent, MAIRA-2 or RAD-DINO (~0.26 M pixels) and a
sixteenth of the processor's own cost (`benchmarks/token_bill.py`). ``MIN_PIXELS`` is Qwen's own
56 x 56: the budget caps, it never upscales a small stored image (``--image-size`` builds) into
tokens it has no pixels for.

Imports no torch: the build package and the scorers import it too.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

MAX_PIXELS = 640 * 28 * 28
MIN_PIXELS = 56 * 56
MAX_ASPECT_RATIO = 200
"""The most an image's long side may be times its short side. Qwen's resize (`smart_resize`) refuses a wider
ratio; below it, a side rounded up to one patch cannot carry the area past `max_pixels` at the default budget.
The build refuses a wider image (`builders.images`), and `qwen25vl_resized_size` does as Qwen's does."""
PROCESSOR_MAX_PIXELS = 16384 * 28 * 28
"""Qwen2.5-VL's released processor limit (12,845,056), what the recipes used before the budget."""

HELP = {
    "max_pixels": f"Pixel budget: the most pixels of an image the model sees (Qwen families; default {MAX_PIXELS:,}, "
    "about 0.5 M, chosen for chest X-rays: README 'Pixel budget'). Training, generation and box scoring use the same.",
    "min_pixels": f"The fewest pixels of an image after the resize (default {MIN_PIXELS:,}: small images are not upscaled).",
}


@dataclass(frozen=True)
class PixelBudget:
    """Bounds on an image's area after the resize, in pixels."""

    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"pixel budget: need 0 < min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}"
            )

    def resize_kwargs(self, factor: int) -> dict[str, int]:
        """The arguments of `builders.box_frame.qwen25vl_resized_size` for a processor whose sides are multiples of `factor`."""
        return {"factor": factor, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels}


class AspectRatioError(ValueError):
    """An image too narrow for the budget: its long side more than `MAX_ASPECT_RATIO` times its short side."""


def aspect_ratio_problem(width: int, height: int) -> str | None:
    """Why an image of `width` x `height` pixels cannot be resized to a pixel budget, in a phrase; None when it can."""
    long_side, short_side = max(width, height), min(width, height)
    if short_side >= 1 and long_side <= MAX_ASPECT_RATIO * short_side:
        return None
    return (
        f"{width} x {height} pixels: aspect ratio {long_side / max(short_side, 1):,.1f}:1 is above {MAX_ASPECT_RATIO}:1, "
        "which Qwen-family processors refuse (no pixel budget holds it)"
    )


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--max-pixels``/``--min-pixels`` (also spelled with underscores, as the recipes spell them)."""
    parser.add_argument(
        "--max-pixels", "--max_pixels", dest="max_pixels", type=int, default=MAX_PIXELS, help=HELP["max_pixels"]
    )
    parser.add_argument(
        "--min-pixels", "--min_pixels", dest="min_pixels", type=int, default=MIN_PIXELS, help=HELP["min_pixels"]
    )


def from_arguments(args: argparse.Namespace) -> PixelBudget:
    return PixelBudget(min_pixels=args.min_pixels, max_pixels=args.max_pixels)
