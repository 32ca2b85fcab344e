"""The pixel budget: how many pixels of a radiograph a model with a pixel-count resize sees.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL resize every image to an area within ``[min_pixels,
max_pixels]`` (sides multiples of 28, or 32 for Qwen3-VL) and spend one token per 28 x 28 (32 x 32)
pixels. Their released processors allow 12.8 M (16.8 M) pixels, so a 2,539 x 3,050 MIMIC-CXR image
costs about 9,900 tokens, in each of its questions. The recipes (`training_recipes/sft.py`,
`generate.py`, the lmms-eval tasks) and `cxr-vqa evaluate`'s box conversion all take a `PixelBudget`
from here, declared once for each way it is given (`add_arguments` for a command line,
`PixelBudgetOptions` for a recipe's dataclass options, `from_environment` for the lmms-eval tasks),
so a model is trained, asked and scored at one budget.

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
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_PIXELS = 640 * 28 * 28
MIN_PIXELS = 56 * 56
MAX_ASPECT_RATIO = 200
"""The most an image's long side may be times its short side. Qwen's resize (`smart_resize`) refuses a wider
ratio; below it, a side rounded up to one patch cannot carry the area past `max_pixels` at the default budget.
The build refuses a wider image (`builders.images`), `PixelBudget.resized_size` refuses one as Qwen's does, and
keeps every image it resizes under this ratio, so that Qwen's processor takes it."""
RESIZE_FACTORS = {"qwen2_vl": 28, "qwen2_5_vl": 28, "qwen3_vl": 32, "qwen3_vl_moe": 32}
"""Each Qwen family's side multiple by `model_type` (patch x merge size): one image token per factor x factor pixels.
The recipes read their processor's own (`training_recipes.data.apply_pixel_budget`); `PixelBudget`'s default is
Qwen2.5-VL's, whose ``qwen2.5-vl`` boxes are in the resized image's pixels."""

HELP = {
    "max_pixels": f"Pixel budget: the most pixels of an image the model sees (Qwen families; default {MAX_PIXELS:,}, "
    "about 0.5 M, chosen for chest X-rays: docs/training.md, 'Pixel budget'). Training, generation and box scoring use the "
    "same: give generation and scoring the training run's.",
    "min_pixels": f"The fewest pixels of an image after the resize (default {MIN_PIXELS:,}: small images are not upscaled).",
}
ENVIRONMENT = {"max_pixels": "CXR_VQA_MAX_PIXELS", "min_pixels": "CXR_VQA_MIN_PIXELS"}
"""The variables that give the budget where no command line does (the lmms-eval tasks)."""


@dataclass(frozen=True)
class PixelBudget:
    """Bounds on an image's area after a Qwen-family resize, in pixels, and that resize's side multiple."""

    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    factor: int = RESIZE_FACTORS["qwen2_5_vl"]

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"pixel budget: need 0 < min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}"
            )

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of an image after Qwen's `smart_resize` to this budget: both sides multiples of
        `factor`, the area kept within [min_pixels, max_pixels], aspect kept as closely as possible. The
        recipes decode images to it and the ``qwen2.5-vl`` boxes are written in it, so an image and its
        boxes follow one resize.

        The area never passes `max_pixels`: where rounding a side up to `factor` would carry it past
        (a narrow image under a small budget), the other side gives way. The resized image's aspect ratio
        stays below `MAX_ASPECT_RATIO` (`within_aspect_limit`), so Qwen's processor, which resizes it again
        and refuses a ratio above that, takes it and leaves its size as it is. An image whose aspect ratio
        is above `MAX_ASPECT_RATIO` raises `AspectRatioError`, as Qwen's own resize does."""
        factor, max_pixels = self.factor, self.max_pixels
        if problem := aspect_ratio_problem(width, height):
            raise AspectRatioError(f"cannot resize an image of {problem}")
        if factor * factor > max_pixels:
            raise ValueError(f"pixel budget: max_pixels {max_pixels:,} is below one {factor} x {factor} patch")
        h_bar = max(factor, round(height / factor) * factor)
        w_bar = max(factor, round(width / factor) * factor)
        if h_bar * w_bar > max_pixels:
            beta = math.sqrt((height * width) / max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        if width >= height:
            return self.within_aspect_limit(*self.within_budget(w_bar, h_bar))
        return self.within_aspect_limit(*self.within_budget(h_bar, w_bar))[::-1]

    def within_aspect_limit(self, long_side: int, short_side: int) -> tuple[int, int]:
        """The sides with the long one cut, by whole `factor`s, to below `MAX_ASPECT_RATIO` times the short one.

        Rounding the short side of an image of aspect 160:1 to 200:1 to one `factor` (a 41-pixel side to 28)
        can carry the ratio past the limit. Cutting the long side, not padding the short one, keeps the
        image whole, with no padding for a box to land in: as the image's own ratio is at most the limit, the
        long side ends at most one `factor` short of the short side's scale, and a box follows, each axis of
        the ``qwen2.5-vl`` frame scaled by its own side (`builders.box_frame`). The area only goes down."""
        return min(long_side, MAX_ASPECT_RATIO * short_side - self.factor), short_side

    def within_budget(self, long_side: int, short_side: int) -> tuple[int, int]:
        """Sides that are multiples of `factor` (`factor` at least), cut by whole `factor`s, the one along the
        image's long side first, until their area is within `max_pixels` (at least `factor` squared)."""
        factor, max_pixels = self.factor, self.max_pixels
        if long_side * short_side <= max_pixels:
            return long_side, short_side
        long_side = max(factor, max_pixels // short_side // factor * factor)
        if long_side * short_side > max_pixels:
            short_side = max(factor, max_pixels // long_side // factor * factor)
        return long_side, short_side

    def image_tokens(self, width: int, height: int) -> int:
        """Tokens of an image of `width` x `height` at this budget: one per `factor` x `factor` block of its
        resized pixels (a Qwen token merges 2 x 2 patches)."""
        resized_width, resized_height = self.resized_size(width, height)
        return resized_width * resized_height // self.factor**2


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
    for name, default in (("max_pixels", MAX_PIXELS), ("min_pixels", MIN_PIXELS)):
        flag = name.replace("_", "-")
        parser.add_argument(f"--{flag}", f"--{name}", dest=name, type=int, default=default, help=HELP[name])


def from_arguments(args: argparse.Namespace) -> PixelBudget:
    """The budget of a command line `add_arguments` declared the options of."""
    return PixelBudget(min_pixels=args.min_pixels, max_pixels=args.max_pixels)


@dataclass(kw_only=True)
class PixelBudgetOptions:
    """``--max_pixels``/``--min_pixels`` as a recipe's options: a base of its `HfArgumentParser` dataclass."""

    max_pixels: int = field(default=MAX_PIXELS, metadata={"help": HELP["max_pixels"]})
    min_pixels: int = field(default=MIN_PIXELS, metadata={"help": HELP["min_pixels"]})

    @property
    def pixel_budget(self) -> PixelBudget:
        return PixelBudget(min_pixels=self.min_pixels, max_pixels=self.max_pixels)


def from_environment(environ: Mapping[str, str] = os.environ, model_type: str | None = None) -> PixelBudget:
    """The budget `ENVIRONMENT` gives, the default bound where a variable is unset or empty, at the resize
    factor of `model_type`'s family (`RESIZE_FACTORS`; Qwen2.5-VL's where it is none of them)."""
    bounds = {}
    for name, variable in ENVIRONMENT.items():
        value = environ.get(variable, "").strip()
        if value:
            try:
                bounds[name] = int(value)
            except ValueError:
                raise ValueError(f"{variable}={value!r}: expected a number of pixels") from None
    return PixelBudget(**bounds, factor=RESIZE_FACTORS.get(model_type or "", RESIZE_FACTORS["qwen2_5_vl"]))
