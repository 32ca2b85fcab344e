"""The 30 anatomical regions GEMeX grounds its answers in (paper, Table 8).

Region boxes come from Chest ImaGenome and are reused for every question about that
region. `REGIONS` is the closed list a build counts names against; `region_layout`
places each region in a chest, as fractions of the image's width and height, for the
synthetic images (image left = patient's right, as on a PA radiograph); the boxes sit where the
public samples' boxes of that region sit on average (benchmarks/fidelity_gemex.py measures the offset).
"""

from __future__ import annotations

REGIONS: tuple[str, ...] = (
    # kept from Chest ImaGenome
    "right lung",
    "right mid lung zone",
    "right hilar structures",
    "right hemidiaphragm",
    "left lung",
    "left mid lung zone",
    "left hilar structures",
    "left hemidiaphragm",
    "trachea",
    "spine",
    "abdomen",
    "svc",
    # merged
    "left upper lung zone",
    "right upper lung zone",
    "mediastinum",
    "right lower lung zone",
    "left lower lung zone",
    "cardiac region",
    # unions
    "bilateral lung",
    "bilateral upper lung zone",
    "bilateral mid lung zone",
    "bilateral lower lung zone",
    "bilateral hilar structures",
    "bilateral hemidiaphragm",
    "left mid-to-lower lung zone",
    "right mid-to-lower lung zone",
    "left mid-to-upper lung zone",
    "right mid-to-upper lung zone",
    "bilateral mid-to-lower lung zone",
    "bilateral mid-to-upper lung zone",
)

Fractions = tuple[float, float, float, float]


def _union(*boxes: Fractions) -> Fractions:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def region_layout(
    lung_top: float = 0.12, lung_bottom: float = 0.78, midline: float = 0.5, lung_width: float = 0.36
) -> dict[str, Fractions]:
    """Each region's box as (x1, y1, x2, y2) fractions of the image, for one chest's proportions."""
    third = (lung_bottom - lung_top) / 3
    upper, mid, lower = (
        (lung_top, lung_top + third),
        (lung_top + third, lung_top + 2 * third),
        (lung_top + 2 * third, lung_bottom),
    )
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
        hilum_x = (midline - 0.3, midline - 0.06) if name == "right" else (midline, midline + 0.21)
        boxes[f"{name} hilar structures"] = (hilum_x[0], lung_top + 1.6 * third, hilum_x[1], lung_top + 2.45 * third)
        shift = 0.1 if name == "right" else -0.1  # Chest ImaGenome's hemidiaphragm boxes lean medially
        boxes[f"{name} hemidiaphragm"] = (x1 + 0.08 + shift / 2, lung_bottom - 0.13, x2 + shift, lung_bottom - 0.02)
    for zone in (
        "lung",
        "upper lung zone",
        "mid lung zone",
        "lower lung zone",
        "hilar structures",
        "hemidiaphragm",
        "mid-to-lower lung zone",
        "mid-to-upper lung zone",
    ):
        boxes[f"bilateral {zone}"] = _union(boxes[f"right {zone}"], boxes[f"left {zone}"])
    boxes["trachea"] = (midline - 0.21, lung_top + 0.06, midline - 0.065, lung_top + 1.55 * third)
    boxes["spine"] = (midline - 0.06, 0.0, midline + 0.06, 1.0)
    boxes["svc"] = (midline - 0.25, lung_top + 0.11, midline - 0.15, lung_top + 0.24)
    boxes["mediastinum"] = (midline - 0.1, lung_top - 0.02, midline + 0.1, lung_top + 1.8 * third)
    boxes["cardiac region"] = (midline - 0.19, lung_top + 1.4 * third, midline + 0.31, lung_bottom - 0.03)
    boxes["abdomen"] = (midline - 0.4, lung_bottom + 0.04, midline + 0.4, 1.0)
    assert set(boxes) == set(REGIONS)
    return boxes
