"""Synthetic chest radiographs that show their study's findings.

A frontal-looking chest (body, two lungs, spine, heart, mediastinum, trachea) in 12 of 16 bits,
with every finding of the study drawn where the study says it is and at the size it says: an
opacity in its lung zone, an effusion's meniscus at the side's base, a pneumothorax's dark rim and
pleural line, a device's line along its course, a cardiac silhouette of the stated width. A model
that looks can tell which findings are there; the question text alone cannot. Lateral views are
drawn with the same frontal geometry (a simplification: no projection is modelled).

`plain` findings (`chest_pixels`) are drawn instead as a large, high-contrast mark, one look per kind
(`plain_look`), for probes that must see the answer at a small image size: a zone finding fills its zone,
a side finding its own slot beside that side's lung, a central finding its own slot above or below the
lungs; a sized finding's mark grows with its size.

Image coordinates: the patient's right is the image's left, as radiographs are displayed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from rexvqa_dataset.synthetic.profile import FINDINGS, SIZES, FindingKind


@dataclass(frozen=True)
class StudyFinding:
    """A finding a study has: its kind, where (a lung zone, a side, or "") and its size (index into `SIZES`)."""

    kind: FindingKind
    place: str
    size: int

    @property
    def scale(self) -> float:
        return 0.6 + 0.3 * self.size

    def phrase(self) -> str:
        """How the study's report states it: "Moderate pleural effusion on the left.", "Endotracheal tube."."""
        size = f"{SIZES[self.size]} " if self.kind.sized else ""
        text = f"{size}{self.kind.name}"
        if self.kind.where == "zone":
            text += f" in the {self.place}"
        elif self.kind.where == "side":
            text += f" on the {self.place}"
        return text[0].upper() + text[1:] + "."


class Chest:
    """The canvas of one image and the anatomy its findings are placed against."""

    def __init__(self, rng: random.Random, width: int, height: int, findings: list[StudyFinding]):
        self.rng, self.w, self.h = rng, width, height
        self.y, self.x = np.mgrid[0:height, 0:width].astype(np.float32)
        self.cx, self.cy = width / 2, height * 0.45
        kinds = {f.kind.drawing: f for f in findings}
        self.lung_height = 0.3 * (1.15 if "hyperinflation" in kinds else 0.78 if "low_volumes" in kinds else 1.0)
        self.heart_width = 0.13 * (1.35 + 0.12 * kinds["heart"].size if "heart" in kinds else 1.0)
        self.mediastinum_width = 0.05 * (1.5 + 0.25 * kinds["mediastinum"].size if "mediastinum" in kinds else 1.0)
        self.trachea_x = self.cx + (0.05 * width if "trachea" in kinds else 0.0)
        self.spine_bend = 0.05 * width if "scoliosis" in kinds else 0.0
        self.pixels = self._anatomy()

    def lung_x(self, side: str) -> float:
        return self.cx + (-0.2 if side == "right" else 0.2) * self.w

    def lung_bottom(self) -> float:
        return self.cy + self.lung_height * self.h

    def lung_mask(self, side: str) -> np.ndarray:
        return ((self.x - self.lung_x(side)) / (self.w * 0.16)) ** 2 + (
            (self.y - self.cy) / (self.h * self.lung_height)
        ) ** 2 < 1

    def zone_centre(self, zone: str) -> tuple[float, float]:
        side = zone.split()[0]
        level = {"upper": -0.55, "mid": 0.0, "lower": 0.5}[zone.split()[1]]
        return self.lung_x(side), self.cy + level * self.lung_height * self.h

    def _anatomy(self) -> np.ndarray:
        x, y, w, h = self.x, self.y, self.w, self.h
        body = 1800 + 900 * np.exp(-(((x - self.cx) / (w * 0.55)) ** 2))
        for side in ("right", "left"):
            body = np.where(self.lung_mask(side), body - 1100 - self.rng.randint(0, 200), body)
        spine_x = self.cx + self.spine_bend * np.sin(np.pi * y / h)
        body += 700 * (np.abs(x - spine_x) < w * 0.035)
        body += 900 * ((np.abs(x - self.cx) < w * self.mediastinum_width) & (y < self.cy - 0.05 * h))
        heart = ((x - self.cx - 0.04 * w) / (w * self.heart_width)) ** 2 + (
            (y - self.cy - 0.14 * h) / (h * 0.11)
        ) ** 2 < 1
        body = np.where(heart, np.maximum(body, 2300), body)
        body -= 700 * ((np.abs(x - self.trachea_x) < w * 0.018) & (y < self.cy - 0.12 * h))
        return body

    # -- primitives ------------------------------------------------------------------------------

    def window(self, x0: float, y0: float, reach: float) -> tuple[slice, slice]:
        """The rows and columns within `reach` of (x0, y0): shapes are drawn there, not over the whole image."""
        return (
            slice(max(0, int(y0 - reach)), max(0, int(y0 + reach) + 2)),
            slice(max(0, int(x0 - reach)), max(0, int(x0 + reach) + 2)),
        )

    def disc(self, x0: float, y0: float, r: float, amount: float) -> None:
        near = self.window(x0, y0, r)
        self.pixels[near] += amount * (((self.x[near] - x0) ** 2 + (self.y[near] - y0) ** 2) < r * r)

    def glow(self, x0: float, y0: float, r: float, amount: float) -> None:
        near = self.window(x0, y0, 4 * r)
        self.pixels[near] += amount * np.exp(-((self.x[near] - x0) ** 2 + (self.y[near] - y0) ** 2) / (2 * r * r))

    def line(self, points: list[tuple[float, float]], amount: float, width: int = 2) -> None:
        mask = Image.new("L", (self.w, self.h))
        ImageDraw.Draw(mask).line([(float(a), float(b)) for a, b in points], fill=255, width=max(1, width))
        self.pixels += amount * (np.asarray(mask, dtype=np.float32) / 255)

    def finish(self) -> np.ndarray:
        noise = np.random.default_rng(self.rng.randrange(2**32)).normal(0, 40, (self.h, self.w))
        return np.clip(self.pixels + noise, 0, 4095).astype(np.uint16)


def _place(chest: Chest, finding: StudyFinding) -> tuple[float, float, float]:
    """The centre of a zone finding and the image's width times the finding's scale."""
    x0, y0 = chest.zone_centre(finding.place)
    return x0, y0, chest.w * finding.scale


def _opacity(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.glow(x0, y0, 0.05 * s, 800)


def _haze(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.glow(x0, y0, 0.09 * s, 300)


def _band(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.line([(x0 - 0.08 * s, y0 + 0.01 * c.h), (x0 + 0.08 * s, y0 - 0.01 * c.h)], 600, int(0.012 * c.h) + 1)


def _nodule(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.disc(x0, y0, 0.02 * s + 1, 800)


def _mass(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.disc(x0, y0, 0.05 * s + 1, 900)


def _cavity(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.disc(x0, y0, 0.045 * s + 1, 900)
    c.disc(x0, y0, 0.027 * s + 0.5, -1100)


def _calcification(c: Chest, f: StudyFinding) -> None:
    x0, y0, _ = _place(c, f)
    c.disc(x0, y0, 0.012 * c.w + 1, 1800)


def _reticular(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    near = ((c.x - x0) ** 2 + (c.y - y0) ** 2) < (0.08 * s) ** 2
    grid = (np.sin(c.x * 1.3) > 0.7) | (np.sin(c.y * 1.3) > 0.7)
    c.pixels += 450 * (near & grid)


def _bulla(c: Chest, f: StudyFinding) -> None:
    x0, y0, s = _place(c, f)
    c.disc(x0, y0, 0.06 * s + 1, 300)
    c.disc(x0, y0, 0.055 * s, -650)


def _fracture(c: Chest, f: StudyFinding) -> None:
    x0, y0, _ = _place(c, f)
    outer = x0 + (-0.12 if f.place.startswith("right") else 0.12) * c.w
    mid = (x0 + outer) / 2
    c.line([(x0, y0), (mid - 1.5, y0 + 0.01 * c.h)], 1300)
    c.line([(mid + 1.5, y0 + 0.02 * c.h), (outer, y0 + 0.035 * c.h)], 1300)


def _clips(c: Chest, f: StudyFinding) -> None:
    x0, y0, _ = _place(c, f)
    for dx, dy in ((-0.03, 0.0), (0.0, 0.02), (0.03, -0.01)):
        x, y = x0 + dx * c.w, y0 + dy * c.h
        c.line([(x - 2, y - 3), (x, y + 2), (x + 2, y - 3)], 2200, 1)


def _miliary(c: Chest, f: StudyFinding) -> None:
    for side in ("right", "left"):
        for _ in range(40):
            a, r = c.rng.uniform(0, 2 * np.pi), np.sqrt(c.rng.random()) * 0.9
            x = c.lung_x(side) + r * np.cos(a) * 0.16 * c.w
            y = c.cy + r * np.sin(a) * c.lung_height * c.h
            c.disc(x, y, 0.008 * c.w + 0.7, 600)


def _effusion(c: Chest, f: StudyFinding) -> None:
    """A meniscus: fluid fills the side's lung base, higher laterally than medially."""
    lateral = -1 if f.place == "right" else 1
    depth = (0.08 + 0.07 * f.size) * c.h
    level = c.lung_bottom() - depth + lateral * (c.x - c.lung_x(f.place)) * -0.35
    c.pixels += 1000 * (c.lung_mask(f.place) & (c.y > level))


def _pneumothorax(c: Chest, f: StudyFinding) -> None:
    """Air without lung markings along the side's apex and outer edge, with the visceral pleural line."""
    lateral = -1 if f.place == "right" else 1
    edge_x = c.lung_x(f.place) + lateral * 0.16 * c.w
    depth = (0.025 + 0.02 * f.size) * c.w
    rim = c.lung_mask(f.place) & (np.abs(c.x - edge_x) < depth + 0.4 * np.maximum(0, c.cy - c.y) * 0.16)
    c.pixels -= 350 * rim
    inner = c.lung_x(f.place) + lateral * (0.16 * c.w - depth)
    c.line([(inner, c.cy - c.lung_height * c.h * 0.8), (inner, c.cy + c.lung_height * c.h * 0.3)], 700, 1)


def _pleural(c: Chest, f: StudyFinding) -> None:
    lateral = -1 if f.place == "right" else 1
    edge = (np.abs((c.x - c.lung_x(f.place)) / (c.w * 0.16)) > 0.78 - 0.05 * f.size) & (
        (c.x - c.lung_x(f.place)) * lateral > 0
    )
    c.pixels += 600 * (c.lung_mask(f.place) & edge)


def _diaphragm(c: Chest, f: StudyFinding) -> None:
    raised = c.lung_bottom() - (0.06 + 0.04 * f.size) * c.h + 3 * ((c.x - c.lung_x(f.place)) / c.w) ** 2 * c.h
    c.pixels += 1100 * (c.lung_mask(f.place) & (c.y > raised))


def _hilar(c: Chest, f: StudyFinding) -> None:
    x0 = c.cx + (-0.09 if f.place == "right" else 0.09) * c.w
    c.glow(x0, c.cy, (0.02 + 0.008 * f.size) * c.w, 900)


def _chest_tube(c: Chest, f: StudyFinding) -> None:
    x0 = c.lung_x(f.place) + (-0.2 if f.place == "right" else 0.2) * c.w
    c.line([(x0, c.cy + 0.25 * c.h), (c.lung_x(f.place), c.cy), (c.lung_x(f.place), c.cy - 0.22 * c.h)], 1600)


def _subcutaneous(c: Chest, f: StudyFinding) -> None:
    x0 = c.lung_x(f.place) + (-0.2 if f.place == "right" else 0.2) * c.w
    for k in range(2 + f.size):
        y0 = c.cy - 0.15 * c.h + k * 0.07 * c.h
        c.line([(x0 - 0.03 * c.w, y0), (x0 + 0.03 * c.w, y0 + 0.04 * c.h)], -900, 1)


def _edema(c: Chest, f: StudyFinding) -> None:
    for side in ("right", "left"):
        x0 = c.cx + (-0.11 if side == "right" else 0.11) * c.w
        c.glow(x0, c.cy, (0.05 + 0.015 * f.size) * c.w, 450)


def _free_air(c: Chest, f: StudyFinding) -> None:
    x0, y0 = c.lung_x("right"), c.lung_bottom() + 0.03 * c.h
    crescent = (((c.x - x0) / (0.1 * c.w * f.scale)) ** 2 + ((c.y - y0) / (0.025 * c.h)) ** 2 < 1) & (c.y < y0)
    c.pixels -= 1200 * crescent


def _hernia(c: Chest, f: StudyFinding) -> None:
    x0, y0, r = c.cx + 0.02 * c.w, c.cy + 0.16 * c.h, 0.035 * c.w * f.scale + 1
    c.disc(x0, y0, r, -900)
    c.pixels += 900 * ((((c.x - x0) ** 2 + (c.y - y0) ** 2) < r * r) & (c.y > y0))


def _aorta(c: Chest, f: StudyFinding) -> None:
    x0, y0 = c.cx + 0.06 * c.w, c.cy - 0.2 * c.h
    c.line([(x0 - 0.03 * c.w, y0 - 0.01 * c.h), (x0, y0 - 0.03 * c.h), (x0 + 0.03 * c.w, y0 - 0.01 * c.h)], 1400)


def _spine(c: Chest, f: StudyFinding) -> None:
    for k in range(5):
        y0 = c.cy - 0.2 * c.h + k * 0.1 * c.h
        for side in (-1, 1):
            c.line([(c.cx + side * 0.035 * c.w, y0), (c.cx + side * 0.055 * c.w, y0 + 0.01 * c.h)], 1300)


def _endotracheal(c: Chest, f: StudyFinding) -> None:
    c.line([(c.trachea_x, 0), (c.trachea_x, c.cy - 0.2 * c.h)], 1600, 3)


def _central_line(c: Chest, f: StudyFinding) -> None:
    c.line(
        [
            (c.cx + 0.3 * c.w, c.cy - 0.3 * c.h),
            (c.cx + 0.08 * c.w, c.cy - 0.24 * c.h),
            (c.cx - 0.03 * c.w, c.cy - 0.08 * c.h),
        ],
        1600,
    )


def _nasogastric(c: Chest, f: StudyFinding) -> None:
    c.line(
        [
            (c.cx - 0.01 * c.w, 0),
            (c.cx - 0.01 * c.w, c.lung_bottom()),
            (c.cx + 0.12 * c.w, c.lung_bottom() + 0.08 * c.h),
        ],
        1600,
    )


def _pacemaker(c: Chest, f: StudyFinding) -> None:
    x0, y0 = c.cx + 0.3 * c.w, c.cy - 0.3 * c.h
    c.pixels += 2000 * ((np.abs(c.x - x0) < 0.04 * c.w) & (np.abs(c.y - y0) < 0.025 * c.h))
    for end in ((c.cx + 0.02 * c.w, c.cy + 0.12 * c.h), (c.cx + 0.08 * c.w, c.cy + 0.18 * c.h)):
        c.line([(x0, y0), (c.cx + 0.05 * c.w, c.cy - 0.1 * c.h), end], 1500, 1)


def _sternotomy(c: Chest, f: StudyFinding) -> None:
    for k in range(5):
        y0 = c.cy - 0.15 * c.h + k * 0.06 * c.h
        c.line(
            [(c.cx - 2, y0 - 2), (c.cx + 2, y0 - 2), (c.cx + 2, y0 + 2), (c.cx - 2, y0 + 2), (c.cx - 2, y0 - 2)],
            2000,
            1,
        )


def _in_anatomy(c: Chest, f: StudyFinding) -> None:
    """Findings drawn by changing the anatomy itself (`Chest.__init__`): heart, mediastinum, volumes, trachea, spine."""


DRAWINGS: dict[str, Callable[[Chest, StudyFinding], None]] = {
    "opacity": _opacity,
    "haze": _haze,
    "band": _band,
    "nodule": _nodule,
    "mass": _mass,
    "cavity": _cavity,
    "calcification": _calcification,
    "reticular": _reticular,
    "bulla": _bulla,
    "fracture": _fracture,
    "clips": _clips,
    "miliary": _miliary,
    "effusion": _effusion,
    "pneumothorax": _pneumothorax,
    "pleural": _pleural,
    "diaphragm": _diaphragm,
    "hilar": _hilar,
    "chest_tube": _chest_tube,
    "subcutaneous": _subcutaneous,
    "edema": _edema,
    "free_air": _free_air,
    "hernia": _hernia,
    "aorta": _aorta,
    "spine": _spine,
    "endotracheal": _endotracheal,
    "central_line": _central_line,
    "nasogastric": _nasogastric,
    "pacemaker": _pacemaker,
    "sternotomy": _sternotomy,
    "heart": _in_anatomy,
    "mediastinum": _in_anatomy,
    "hyperinflation": _in_anatomy,
    "low_volumes": _in_anatomy,
    "trachea": _in_anatomy,
    "scoliosis": _in_anatomy,
}
"""How each `FindingKind.drawing` is drawn; every kind of `profile.FINDINGS` has one."""


PLAIN_SHAPES = ("disc", "ring", "square", "frame", "bars", "columns", "cross", "saltire")
"""The shapes of plain marks; each is drawn white on a black box or black on a white one."""
PLAIN_WHITE, PLAIN_BLACK = 4095, 0
SIDE_SLOTS = 7
"""Rows of the strip beside each lung, one per side finding kind."""
CENTRAL_SLOTS = 9
"""Columns of the band above the lungs and of the band below them: 18 slots, one per central finding kind."""


@dataclass(frozen=True)
class PlainLook:
    """How a kind is drawn plainly: its shape, white on black or black on white, and its slot (side and
    central kinds: the row beside the lung or the band and column; zone kinds: 0, they fill their zone)."""

    shape: str
    white: bool
    slot: int


def _plain_looks() -> dict[FindingKind, PlainLook]:
    """Kinds drawn in one place (a zone) differ in look; side and central kinds also each have their own
    slot, so two of them never cover each other."""
    looks = {}
    room = {"zone": 2 * len(PLAIN_SHAPES), "side": SIDE_SLOTS, "": 2 * CENTRAL_SLOTS}
    for where in ("zone", "side", ""):
        kinds = [kind for kind in FINDINGS if kind.where == where]
        if len(kinds) > room[where]:
            raise ValueError(f"{len(kinds)} {where or 'central'} finding kinds, room for {room[where]} plain looks")
        for k, kind in enumerate(kinds):
            shape = PLAIN_SHAPES[k % len(PLAIN_SHAPES)]
            looks[kind] = PlainLook(shape, (k // len(PLAIN_SHAPES)) % 2 == 0, 0 if where == "zone" else k)
    return looks


PLAIN_LOOKS = _plain_looks()


def plain_look(kind: FindingKind) -> PlainLook:
    return PLAIN_LOOKS[kind]


def plain_box(c: Chest, f: StudyFinding) -> tuple[float, float, float, float]:
    """The box a plain finding's mark fills (x1, y1, x2, y2) at its largest size."""
    look = plain_look(f.kind)
    if f.kind.where == "zone":
        x0, y0 = c.zone_centre(f.place)
        half_w, half_h = 0.14 * c.w, 0.22 * c.lung_height * c.h
    elif f.kind.where == "side":
        x0 = c.lung_x(f.place) + (-0.23 if f.place == "right" else 0.23) * c.w
        y0 = (0.2 + 0.6 * look.slot / (SIDE_SLOTS - 1)) * c.h
        half_w, half_h = 0.06 * c.w, 0.045 * c.h
    else:
        band, column = divmod(look.slot, CENTRAL_SLOTS)
        x0 = (0.07 + 0.86 * column / (CENTRAL_SLOTS - 1)) * c.w
        y0, half_h = (0.065 * c.h, 0.06 * c.h) if band == 0 else (0.905 * c.h, 0.075 * c.h)
        half_w = 0.05 * c.w
    return x0 - half_w, y0 - half_h, x0 + half_w, y0 + half_h


def draw_plain(c: Chest, f: StudyFinding) -> None:
    """One finding as its kind's mark: its box filled black (or white) and its shape white (or black) in it;
    a sized finding's box is 70, 80, 90 or 100% of the largest on a side by its size."""
    look = plain_look(f.kind)
    x1, y1, x2, y2 = plain_box(c, f)
    share = 0.7 + 0.1 * f.size if f.kind.sized else 1.0
    cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) * share / 2, (y2 - y1) * share / 2
    x1, y1, x2, y2 = cx - hw, cy - hh, cx + hw, cy + hh
    thick = max(1, round(min(hw, hh) / 2.5))
    mask = Image.new("L", (c.w, c.h))
    draw = ImageDraw.Draw(mask)
    draw.rectangle((x1, y1, x2, y2), fill=1)
    inner = (cx - 0.6 * hw, cy - 0.6 * hh, cx + 0.6 * hw, cy + 0.6 * hh)
    if look.shape == "disc":
        draw.ellipse((cx - 0.8 * hw, cy - 0.8 * hh, cx + 0.8 * hw, cy + 0.8 * hh), fill=2)
    elif look.shape == "ring":
        draw.ellipse((cx - 0.85 * hw, cy - 0.85 * hh, cx + 0.85 * hw, cy + 0.85 * hh), outline=2, width=thick)
    elif look.shape == "square":
        draw.rectangle(inner, fill=2)
    elif look.shape == "frame":
        draw.rectangle((x1, y1, x2, y2), outline=2, width=thick)
    elif look.shape == "bars":
        for y in (cy - 0.5 * hh, cy + 0.5 * hh):
            draw.line((x1, y, x2, y), fill=2, width=thick)
    elif look.shape == "columns":
        for x in (cx - 0.5 * hw, cx + 0.5 * hw):
            draw.line((x, y1, x, y2), fill=2, width=thick)
    elif look.shape == "cross":
        draw.line((cx, y1, cx, y2), fill=2, width=thick)
        draw.line((x1, cy, x2, cy), fill=2, width=thick)
    else:
        draw.line((x1, y1, x2, y2), fill=2, width=thick)
        draw.line((x1, y2, x2, y1), fill=2, width=thick)
    marks = np.asarray(mask)
    box, shape = (PLAIN_BLACK, PLAIN_WHITE) if look.white else (PLAIN_WHITE, PLAIN_BLACK)
    c.pixels = np.where(marks == 2, shape, np.where(marks == 1, box, c.pixels)).astype(np.float32)


def chest_pixels(
    rng: random.Random,
    width: int,
    height: int,
    findings: list[StudyFinding],
    plain: bool | Collection[FindingKind] = False,
) -> np.ndarray:
    """A 16-bit chest-like picture (12 bits used, as in many CR files) showing `findings` (`plain`: True,
    each as its kind's large, high-contrast mark, `draw_plain`; a collection of kinds, those of `findings`
    of a kind in it, the others drawn as by default)."""
    chest = Chest(rng, width, height, findings)
    shown_plain = [f for f in findings if plain is True or (plain and f.kind in plain)]
    for finding in findings:
        if finding not in shown_plain:
            DRAWINGS[finding.kind.drawing](chest, finding)
    for finding in shown_plain:
        draw_plain(chest, finding)
    return chest.finish()
