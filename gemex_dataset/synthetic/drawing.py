"""The synthetic chest picture: anatomy filling its regions' boxes, and each shown finding painted
into the box of the region it is in, so the image, not the text, carries the answer."""

from __future__ import annotations

import random
from collections.abc import Collection

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from gemex_dataset.synthetic.distributions import CHEST_WIDTH_CM, FINDING_BY_NAME, SEVERITY_EXTENT
from gemex_dataset.synthetic.questions import Shown

Layout = dict[str, tuple[float, float, float, float]]
OPACITY_FILL = {"consolidation": 150, "atelectasis": 128, "pulmonary edema": 112}
"""Each opacity its own density, so one painted over another in the same zone leaves both in sight."""
FOCAL_KINDS = ("nodule", "clips", "spots")
"""Small findings, painted over the broad ones so that none of them disappears under a later one."""


def paint_order(shown: list[Shown], layout: Layout) -> list[Shown]:
    """Broad findings first, those of larger regions and larger extent before smaller ones (a zone's finding
    on top of a whole lung's), then focal findings, then lines and tubes on top: each stays visible in its box."""

    def key(s: Shown) -> tuple:
        kind = FINDING_BY_NAME[s.finding].kind
        x1, y1, x2, y2 = layout[s.region]
        layer = 2 if kind == "line" else 1 if kind in FOCAL_KINDS else 0
        return layer, -(x2 - x1) * (y2 - y1), -SEVERITY_EXTENT[s.severity]

    return sorted(shown, key=key)


class ChestPainter:
    """Draws on one image in pixel coordinates of its regions' boxes."""

    def __init__(self, layout: Layout, width: int, height: int, plain: bool | Collection[Shown] = False):
        self.layout, self.width, self.height, self.plain = layout, width, height, plain
        self.image = Image.new("L", (width, height), 25)
        self.draw = ImageDraw.Draw(self.image)

    def box(self, name: str) -> tuple[float, float, float, float]:
        x1, y1, x2, y2 = self.layout[name]
        return x1 * self.width, y1 * self.height, x2 * self.width, y2 * self.height

    def heart(self, scale: float) -> None:
        """The heart filling `scale` of its box's width."""
        x1, y1, x2, y2 = self.box("cardiac region")
        cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2 * scale, (y2 - y1) / 2
        self.draw.ellipse((cx - hw, cy - hh, cx + hw, cy + hh), fill=250 if self.plain and scale > 0.8 else 190)

    def anatomy(self, heart_scale: float) -> None:
        draw, width, height = self.draw, self.width, self.height
        bl = self.box("bilateral lung")
        draw.ellipse((bl[0] - 0.06 * width, bl[1] - 0.1 * height, bl[2] + 0.06 * width, height * 1.3), fill=105)
        draw.rectangle(self.box("abdomen"), fill=150)
        for side in ("right", "left"):
            draw.ellipse(self.box(f"{side} lung"), fill=45)
            x1, y1, x2, y2 = self.box(f"{side} hemidiaphragm")
            draw.chord((x1, y1 + (y2 - y1) * 0.5, x2, y2 + (y2 - y1) * 2), 180, 360, fill=160)
            draw.rectangle((x1, y2, x2, y2 + (y2 - y1)), fill=155)
        step = (bl[3] - bl[1]) / 9
        for k in range(9):
            y = bl[1] + k * step
            for x1, x2 in ((bl[0], (bl[0] + bl[2]) / 2), ((bl[0] + bl[2]) / 2, bl[2])):
                draw.arc((x1, y, x2, y + step * 2.2), 200, 340, fill=85, width=max(1, width // 120))
        draw.rectangle(self.box("spine"), fill=135)
        draw.rectangle(self.box("mediastinum"), fill=150)
        draw.ellipse(self.box("svc"), fill=165)
        draw.rectangle(self.box("trachea"), fill=50)
        self.heart(heart_scale)
        for side in ("right", "left"):
            draw.ellipse(self.box(f"{side} hilar structures"), fill=120)

    def contrasting(self, x: float, y: float, step: int) -> int:
        """A density `step` brighter than the picture at (x, y), or as much darker where that would not show."""
        around = self.image.getpixel((min(int(x), self.width - 1), min(int(y), self.height - 1)))
        return around + step if around + step <= 250 else max(0, around - step)

    def plain_finding(self, shown: Shown) -> None:
        """Paint one finding as a large mark of its kind's own pattern, white or black, filling its region's box
        by its severity: visible in a 112-pixel image, one look per kind."""
        kind = FINDING_BY_NAME[shown.finding].kind
        x1, y1, x2, y2 = self.box(shown.region)
        w, h = x2 - x1, y2 - y1
        share = 0.5 + 0.5 * SEVERITY_EXTENT[shown.severity]
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        hw, hh = w * share / 2, h * share / 2
        thick = max(3, self.width // 24)
        draw = self.draw
        if kind == "opacity":
            draw.ellipse((cx - hw, cy - hh, cx + hw, cy + hh), fill=OPACITY_FILL.get(shown.finding, 140) + 100)
        elif kind == "nodule":
            r = min(hw, hh)
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=0, outline=255, width=thick)
        elif kind == "effusion":
            draw.rectangle((x1, y2 - h * share, x2, y2), fill=245)
        elif kind == "pneumothorax":
            draw.rectangle((x1, y1, x2, y1 + h * share), fill=0)
        elif kind == "line":
            draw.line((cx, y1, cx, y2), fill=255, width=2 * thick)
        elif kind == "spots":
            for k in range(4):
                y = y1 + h * (2 * k + 1) / 8
                draw.rectangle((x1, y - thick / 2, x2, y + thick / 2), fill=255)
        elif kind == "clips":
            draw.line((cx - hw, cy - hh, cx + hw, cy + hh), fill=255, width=thick)
            draw.line((cx - hw, cy + hh, cx + hw, cy - hh), fill=255, width=thick)
        else:  # hilum, dome, widening: the structure itself, white
            draw.rectangle((cx - hw, cy - hh, cx + hw, cy + hh), fill=235)

    def finding(self, shown: Shown, seed: int) -> None:
        """Paint one finding inside its region's box; its extent follows the severity, a nodule's diameter its size."""
        kind = FINDING_BY_NAME[shown.finding].kind
        plain = self.plain is True or (bool(self.plain) and shown in self.plain)
        if plain and shown.region.startswith("bilateral "):
            for side in ("right", "left"):
                self.plain_finding(Shown(shown.finding, shown.region.replace("bilateral", side), shown.severity, 0))
            return
        if plain:
            self.plain_finding(shown)
            return
        if shown.region.startswith("bilateral ") and kind not in ("nodule", "clips", "line"):
            for side in ("right", "left"):  # on each lung, not across the mediastinum
                self.finding(
                    Shown(shown.finding, shown.region.replace("bilateral", side), shown.severity, shown.size_cm), seed
                )
            return
        self.shape(shown, seed, kind)

    def shape(self, shown: Shown, seed: int, kind: str) -> None:
        """Paint a finding's shape of `kind` in its region's box, at a place drawn from its own seed."""
        rng = random.Random(f"{seed}/{shown.finding}/{shown.region}")  # a finding's place does not depend on the others
        x1, y1, x2, y2 = self.box(shown.region)
        w, h = x2 - x1, y2 - y1
        extent = SEVERITY_EXTENT[shown.severity]
        cx, cy = x1 + w * rng.uniform(0.35, 0.65), y1 + h * rng.uniform(0.35, 0.65)
        line = max(2, self.width // 90)
        draw = self.draw
        if kind == "opacity":
            draw.ellipse(
                (cx - w * extent / 2, cy - h * extent / 2, cx + w * extent / 2, cy + h * extent / 2),
                fill=OPACITY_FILL.get(shown.finding, 140),
            )
        elif kind == "nodule":  # its diameter is its size, kept inside the box
            r = min(max(2.5, shown.size_cm / CHEST_WIDTH_CM * self.width / 2), w / 2, h / 2)  # a few pixels at least
            cx, cy = rng.uniform(x1 + r, x2 - r), rng.uniform(y1 + r, y2 - r)
            draw.ellipse(
                (cx - r, cy - r, cx + r, cy + r),
                fill=self.contrasting(cx, cy, 90 if "calcified" in shown.finding else 60),
            )
        elif kind == "effusion":
            top = y2 - h * extent
            draw.rectangle((x1, top + h * 0.1, x2, y2), fill=175)
            draw.chord((x1, top, x2, top + h * 0.2), 0, 180, fill=175)  # the meniscus
        elif kind == "pneumothorax":
            draw.rectangle((x1, y1, x2, y1 + h * extent), fill=8)
            draw.line((x1, y1 + h * extent, x2, y1 + h * extent), fill=220, width=line)
        elif kind == "line":
            draw.line((cx - w * 0.1, y1, cx + w * 0.1, y1 + h * max(extent, 0.6)), fill=250, width=line)
        elif kind == "hilum":
            draw.ellipse((x1, y1, x2, y2), fill=200)
        elif kind == "dome":
            draw.chord((x1, y2 - h * extent, x2, y2 + h * extent), 180, 360, fill=200)
        elif kind == "spots":
            for k in range(3 + round(extent * 5)):
                y = y1 + h * (k + 0.5) / 8
                draw.ellipse((x1, y - line, x2, y + line), fill=240)
        elif kind == "widening":
            inset = w * (1 - extent) / 4  # a wider, denser mediastinal shadow than the normal one
            draw.rectangle((x1 + inset, y1, x2 - inset, y2), fill=200)
        elif kind == "clips":
            for _ in range(2 + round(extent * 3)):
                px, py = x1 + w * rng.uniform(0.2, 0.8), y1 + h * rng.uniform(0.2, 0.8)
                draw.line((px - 3 * line, py - 3 * line, px, py, px + 3 * line, py - 3 * line), fill=250, width=line)

    def picture(self, seed: int) -> Image.Image:
        img = (
            self.image
            if self.plain is True
            else self.image.filter(ImageFilter.GaussianBlur(radius=max(1.0, self.width / 250)))
        )
        noise = np.random.default_rng(seed).normal(0, 6, (self.height, self.width))
        return Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8))


def draw_chest(
    layout: Layout,
    width: int,
    height: int,
    seed: int,
    shown: list[Shown] = (),
    plain: bool | Collection[Shown] = False,
) -> Image.Image:
    """A grayscale radiograph-like picture whose structures fill their regions' boxes, with `shown` painted in
    (`plain`: True, each as a large, high-contrast mark of its kind, unblurred, for probes that must see it;
    a collection, those of `shown` in it)."""
    painter = ChestPainter(layout, width, height, plain)
    heart = next((s for s in shown if FINDING_BY_NAME[s.finding].kind == "heart"), None)
    # the heart fills 0.72 of its box's width when normal, 0.85-0.99 when enlarged
    scale = 0.85 + 0.15 * SEVERITY_EXTENT[heart.severity] if heart else 0.72
    painter.anatomy(scale)
    ordered = paint_order(list(shown), layout)
    broad = [s for s in ordered if FINDING_BY_NAME[s.finding].kind not in (*FOCAL_KINDS, "line", "heart")]
    for s in broad:
        painter.finding(s, seed)
    if heart and broad:  # an enlarged heart's border stays in sight over the lung findings beside it
        painter.heart(scale)
    for s in ordered:
        if s not in broad and FINDING_BY_NAME[s.finding].kind != "heart":
            painter.finding(s, seed)
    return painter.picture(seed)
