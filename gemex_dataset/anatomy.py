"""The 30 anatomical regions GEMeX grounds its answers in (paper, Table 8).

Region boxes come from Chest ImaGenome and are reused for every question about that
region. `REGIONS` is the closed list a build counts names against; `region_layout`
places each region in a chest, as fractions of the image's width and height, for the
synthetic images (image left = patient's right, as on a PA radiograph).
"""

from __future__ import annotations

REGIONS: tuple[str, ...] = (
    # kept from Chest ImaGenome
    "right lung", "right mid lung zone", "right hilar structures", "right hemidiaphragm",
    "left lung", "left mid lung zone", "left hilar structures", "left hemidiaphragm",
    "trachea", "spine", "abdomen", "svc",
    # merged
    "left upper lung zone", "right upper lung zone", "mediastinum",
    "right lower lung zone", "left lower lung zone", "cardiac region",
    # unions
    "bilateral lung", "bilateral upper lung zone", "bilateral mid lung zone",
    "bilateral lower lung zone", "bilateral hilar structures", "bilateral hemidiaphragm",
    "left mid-to-lower lung zone", "right mid-to-lower lung zone",
    "left mid-to-upper lung zone", "right mid-to-upper lung zone",
    "bilateral mid-to-lower lung zone", "bilateral mid-to-upper lung zone",
)

Fractions = tuple[float, float, float, float]


def _union(*boxes: Fractions) -> Fractions:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def region_layout(lung_top: float = 0.12, lung_bottom: float = 0.78, midline: float = 0.5,
                  lung_width: float = 0.36) -> dict[str, Fractions]:
    """Each region's box as (x1, y1, x2, y2) fractions of the image, for one chest's proportions."""
    third = (lung_bottom - lung_top) / 3
    upper, mid, lower = (lung_top, lung_top + third), (lung_top + third, lung_top + 2 * third), (lung_top + 2 * third, lung_bottom)
    right_x = (midline - 0.03 - lung_width, midline - 0.03)
    left_x = (midline + 0.03, midline + 0.03 + lung_width)
    side = {"right": right_x, "left": left_x}
    boxes: dict[str, Fractions] = {}
    for name, (x1, x2) in side.items():
        boxes[f"{name} lung"] = (x1, lung_top, x2, lung_bottom)
        boxes[f"{name} upper lung zone"] = (x1, upper[0], x2, upper[1])
        boxes[f"{name} mid lung zone"] = (x1, mid[0], x2, mid[1])
        boxes[f"{name} lower lung zone"] = (x1, lower[0], x2, lower[1])
        boxes[f"{name} mid-to-lower lung zone"] = (x1, mid[0], x2, lower[1])
        boxes[f"{name} mid-to-upper lung zone"] = (x1, upper[0], x2, mid[1])
        hilum_x = (x2 - 0.11, x2) if name == "right" else (x1, x1 + 0.11)
        boxes[f"{name} hilar structures"] = (hilum_x[0], mid[0] - 0.04, hilum_x[1], mid[1] - 0.02)
        boxes[f"{name} hemidiaphragm"] = (x1, lung_bottom - 0.06, x2, lung_bottom + 0.05)
    for zone in ("lung", "upper lung zone", "mid lung zone", "lower lung zone", "hilar structures",
                 "hemidiaphragm", "mid-to-lower lung zone", "mid-to-upper lung zone"):
        boxes[f"bilateral {zone}"] = _union(boxes[f"right {zone}"], boxes[f"left {zone}"])
    boxes["trachea"] = (midline - 0.035, 0.02, midline + 0.035, lung_top + third * 0.9)
    boxes["spine"] = (midline - 0.06, 0.0, midline + 0.06, 1.0)
    boxes["svc"] = (midline - 0.09, lung_top + third * 0.6, midline - 0.02, lung_top + 1.5 * third)
    boxes["mediastinum"] = (midline - 0.1, lung_top - 0.02, midline + 0.1, lung_top + 1.8 * third)
    boxes["cardiac region"] = (midline - 0.12, lung_top + 1.45 * third, midline + 0.22, lung_bottom - 0.01)
    boxes["abdomen"] = (midline - 0.4, lung_bottom + 0.04, midline + 0.4, 1.0)
    assert set(boxes) == set(REGIONS)
    return boxes
