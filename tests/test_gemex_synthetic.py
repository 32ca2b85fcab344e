import json
import re

import numpy as np
from PIL import Image

from builders.box_frame import frame224_to_pixels
from gemex_dataset.anatomy import REGIONS
from gemex_dataset.synthetic import generate, make_image, split_sizes


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_release_other_seed_other_release(tmp_path):
    a, b, c = (generate(tmp_path / name, num_images=6, seed=seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert _files(a.root) == _files(b.root)
    assert _files(a.root) != _files(c.root)


def test_release_has_the_three_layouts_in_split_folders(gemex_release):
    root = gemex_release.root
    for split in ("train", "valid", "test"):
        assert {p.name for p in (root / "per_type" / split).iterdir()} == {
            "open_ended_question.jsonl", "closed_ended_question.jsonl", "single_choice_question.jsonl", "multi_choice_question.jsonl"}
        assert json.loads((root / "llava" / split / f"{split}_conversations.json").read_text())
        assert (root / "grouped" / split / f"{split}_images.csv").read_text().startswith("mimic_image_file_path")
    text = (root / "per_type" / "test" / "open_ended_question.jsonl").read_bytes()
    assert not text.endswith(b"\n"), "the released per-type files end without a trailing newline"


def test_images_sit_at_mimic_paths_and_include_both_orientations(gemex_release):
    paths = list(gemex_release.image_root.rglob("*.jpg"))
    assert len(paths) == 16
    pattern = re.compile(r"^p\d{2}/p\d{8}/s\d{8}/[0-9a-f]{8}(-[0-9a-f]{8}){4}\.jpg$")
    assert all(pattern.match(str(p.relative_to(gemex_release.image_root))) for p in paths)
    shapes = {Image.open(p).size for p in paths}
    assert any(w > h for w, h in shapes) and any(h > w for w, h in shapes)
    assert all(Image.open(p).mode == "L" for p in paths)


def test_region_boxes_fall_on_the_drawn_anatomy(gemex_release):
    """Lungs are drawn dark, the heart and abdomen bright: the mapped boxes must show that."""
    for index in range(6):
        image = make_image(7, index, 8)
        pixels = np.asarray(Image.open(gemex_release.image_root / image.image_path), dtype=np.float32)

        def mean(region, image=image, pixels=pixels):
            box, _ = frame224_to_pixels(image.region_boxes[region], image.width, image.height)
            x1, y1, x2, y2 = (round(v) for v in box)
            cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 4, (y2 - y1) / 4
            return pixels[round(cy - hh):round(cy + hh), round(cx - hw):round(cx + hw)].mean()

        assert mean("right mid lung zone") < mean("cardiac region") - 40
        assert mean("left mid lung zone") < mean("abdomen") - 40
        assert mean("trachea") < mean("mediastinum")
        assert set(image.region_boxes) == set(REGIONS)


def test_scale_follows_the_paper_at_full_size():
    sizes = split_sizes(151_025)
    assert sum(sizes.values()) == 151_025
    assert sizes == {"train": 149_535, "valid": 1_190, "test": 300}
