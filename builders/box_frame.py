"""Box conventions: the one place where a box changes frame.

GEMeX boxes are `[x1, y1, x2, y2]` integer pixels in Chest ImaGenome's 224 x 224
frame, an aspect-preserving letterbox of the original image (not a stretch, not a
crop). For an image of W x H pixels::

    r    = 224 / max(W, H)
    left = (224 - int(W * r)) // 2        top = (224 - int(H * r)) // 2
    x_image = (x_224 - left) / r          y_image = (y_224 - top) / r

Model families write boxes in their own conventions; `to_model_frame` and
`from_model_frame` move between those and image pixels:

- ``pixels``: the image's own pixels (LLaVA-style and most models),
- ``qwen2.5-vl``: absolute pixels of the image as Qwen2.5-VL's processor resizes it to a pixel budget
  (`builders.pixel_budget.PixelBudget.resized_size`),
- ``norm1000``: integers on a 0..1000 scale of each axis (Qwen2-VL, Qwen3-VL),
- ``frame224``: the GEMeX release's own 224 letterbox frame.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from builders.pixel_budget import PixelBudget

FRAME = 224
Box = Sequence[float]
BOX_CONVENTIONS = ("pixels", "qwen2.5-vl", "norm1000", "frame224")


def letterbox(width: int, height: int, frame: int = FRAME) -> tuple[float, int, int]:
    """Scale and left/top padding of the letterbox that fits W x H into `frame` x `frame`."""
    r = frame / max(width, height)
    left = (frame - int(width * r)) // 2
    top = (frame - int(height * r)) // 2
    return r, left, top


def frame224_to_pixels(box: Box, width: int, height: int) -> tuple[list[float], bool]:
    """Map a 224-frame box onto a W x H image; returns the box and whether it had to be clipped.

    A box reaching into the letterbox padding lands outside the image and is clipped
    to it (formats.md: "clip to the image and count it").
    """
    pixels, clipped = frame224_to_pixels_many(
        np.asarray([box], dtype=np.float64), np.asarray([width]), np.asarray([height])
    )
    return pixels[0].tolist(), bool(clipped[0])


def frame224_to_pixels_many(boxes: np.ndarray, width: np.ndarray, height: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`frame224_to_pixels` of n boxes at once: `boxes` (n, 4) in the 224 frame, each with its image's width and height.

    Returns the boxes in pixels, clipped to the image and rounded to 2 decimals, and which were clipped.
    """
    width, height = np.asarray(width, dtype=np.float64), np.asarray(height, dtype=np.float64)
    r = FRAME / np.maximum(width, height)
    left = (FRAME - np.floor(width * r)) // 2
    top = (FRAME - np.floor(height * r)) // 2
    offset = np.stack([left, top, left, top], axis=1)
    pixels = (boxes - offset) / r[:, None]
    limits = np.stack([width, height, width, height], axis=1)
    clipped = np.minimum(np.maximum(pixels, 0.0), limits)
    return np.round(clipped, 2), (np.abs(clipped - pixels) > 1e-6).any(axis=1)


def pixels_to_frame224(box: Box, width: int, height: int) -> list[int]:
    """Inverse of `frame224_to_pixels`, rounded to the release's integer pixels."""
    r, left, top = letterbox(width, height)
    return [round(box[0] * r + left), round(box[1] * r + top), round(box[2] * r + left), round(box[3] * r + top)]


def scale_box(box: Box, sx: float, sy: float) -> list[float]:
    return [box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy]


def to_model_frame(box: Box, width: int, height: int, convention: str, budget: PixelBudget | None = None) -> list[int]:
    """A box in image pixels written in a model family's convention, as integers; a ``qwen2.5-vl`` box in the
    pixels of the image resized to `budget` (default: the default budget)."""
    if convention == "pixels":
        out = list(box)
    elif convention == "qwen2.5-vl":
        rw, rh = (budget or PixelBudget()).resized_size(width, height)
        out = scale_box(box, rw / width, rh / height)
    elif convention == "norm1000":
        out = scale_box(box, 1000 / width, 1000 / height)
    elif convention == "frame224":
        return pixels_to_frame224(box, width, height)
    else:
        raise ValueError(f"unknown box convention {convention!r}; expected one of {', '.join(BOX_CONVENTIONS)}")
    return [round(v) for v in out]


def from_model_frame(
    box: Box, width: int, height: int, convention: str, budget: PixelBudget | None = None
) -> list[float]:
    """A box written in a model family's convention, back in image pixels (not clipped); `budget` as `to_model_frame`'s."""
    if convention == "pixels":
        return [float(v) for v in box]
    if convention == "qwen2.5-vl":
        rw, rh = (budget or PixelBudget()).resized_size(width, height)
        return scale_box(box, width / rw, height / rh)
    if convention == "norm1000":
        return scale_box(box, width / 1000, height / 1000)
    if convention == "frame224":
        r, left, top = letterbox(width, height)
        return [(box[0] - left) / r, (box[1] - top) / r, (box[2] - left) / r, (box[3] - top) / r]
    raise ValueError(f"unknown box convention {convention!r}; expected one of {', '.join(BOX_CONVENTIONS)}")
