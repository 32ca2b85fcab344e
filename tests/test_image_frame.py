"""One frame for an image everywhere, and no image past the pixel budget.

An image with an EXIF orientation is taken upright, as a viewer shows it: the build's sizes and
boxes in each image mode, the pixels it embeds, `load_dataset`'s decoded image and the recipes'
decoder agree. An image too narrow for any pixel budget (aspect ratio above Qwen's 200) is refused
at build time with a reject naming its file, record and field, and by the recipes' decoder and
`evaluate`'s box conversion; no resize to the budget passes it."""

from __future__ import annotations

import io
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasets import Image as ImageFeature
from datasets import load_dataset
from PIL import Image, ImageOps

from builders import images
from builders.assembly.settings import BuildSettings
from builders.built_folder import card_configs, config_shards
from builders.hub.validate import validate
from builders.pixel_budget import MAX_ASPECT_RATIO, AspectRatioError, PixelBudget
from gemex_dataset import scoring
from gemex_dataset.build import build_gemex
from training_recipes.data import decode_image

ORIENTATION = 0x0112
QUARTER_TURNS = (5, 6, 7, 8)
BUDGET = PixelBudget()


def picture(width: int = 76, height: int = 63) -> np.ndarray:
    """Grey noise with a bright block at the top left, so that a turn or a flip shows."""
    pixels = np.random.default_rng(1).integers(0, 200, (height, width), dtype=np.uint8)
    pixels[: height // 4, : width // 3] = 255
    return pixels


def turned_file(path: Path, upright: Image.Image, orientation: int, **save) -> Path:
    """``upright`` stored turned the other way, with the EXIF orientation that turns it back."""
    undo = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_90,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_270,
    }[orientation]
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    upright.transpose(undo).save(path, exif=exif, **save)
    return path


def viewer(path: Path | bytes) -> Image.Image:
    """The image as a viewer shows it (Pillow's own EXIF transpose)."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(path) if isinstance(path, bytes) else path))


@pytest.mark.parametrize("orientation", range(2, 9))
@pytest.mark.parametrize("suffix", ["png", "jpg"])
def test_every_image_mode_reads_an_image_upright(tmp_path, orientation, suffix):
    upright = Image.fromarray(picture())
    path = turned_file(tmp_path / f"turned.{suffix}", upright, orientation)
    assert Image.open(path).size == (upright.size[::-1] if orientation in QUARTER_TURNS else upright.size)
    for read in (images.header_image, images.reference_image, images.embed_image):
        stored = read(path)
        assert (stored.width, stored.height) == (stored.source_width, stored.source_height) == upright.size
    embedded = images.embed_image(path)
    assert Image.open(io.BytesIO(embedded.bytes)).getexif().get(ORIENTATION) is None  # stored upright, no tag left
    decoded = ImageFeature().decode_example({"bytes": embedded.bytes, "path": None})
    assert decoded.size == upright.size == ImageFeature().decode_example({"bytes": None, "path": str(path)}).size
    expected = np.asarray(viewer(path).convert("L"), dtype=np.int16)
    tolerance = 0 if suffix == "png" else 6  # JPEG: encoded once more
    assert np.abs(np.asarray(decoded.convert("L"), dtype=np.int16) - expected).mean() <= tolerance
    assert np.array_equal(images.read_pixels(path), np.asarray(viewer(path).convert("L")))
    assert decode_image({"bytes": None, "path": str(path)}).size == upright.size
    assert decode_image({"bytes": None, "path": str(path)}, BUDGET).size == BUDGET.resized_size(*upright.size)
    assert images.embed_image(path, max_side=38).width == 38  # resized in the upright frame: 76 x 63 -> 38 x 32


def png_with_chunk_after_pixels(path: Path, pixels: np.ndarray, orientation: int) -> Path:
    """A PNG whose eXIf chunk follows its image data (the PNG extensions allow it anywhere but between IDATs)."""
    Image.fromarray(pixels).save(path)
    data = path.read_bytes()
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    payload = exif.tobytes()[6:] if exif.tobytes().startswith(b"Exif\x00\x00") else exif.tobytes()
    chunk = struct.pack(">I", len(payload)) + b"eXIf" + payload + struct.pack(">I", zlib.crc32(b"eXIf" + payload))
    end = data.rindex(b"\x00\x00\x00\x00IEND")
    path.write_bytes(data[:end] + chunk + data[end:])
    return path


def test_an_orientation_after_a_pngs_pixel_data_is_read_in_every_mode(tmp_path):
    path = png_with_chunk_after_pixels(tmp_path / "late.png", picture(), 6)
    assert viewer(path).size == (63, 76)  # Pillow (and so datasets) reads it
    for read in (images.header_image, images.reference_image, images.embed_image):
        assert (read(path).width, read(path).height) == (63, 76)
    assert np.array_equal(images.read_pixels(path), np.asarray(viewer(path)))


@pytest.mark.parametrize(("width", "height"), [(1, 100_000), (2, 30_000), (30_000, 149)])
def test_an_image_too_narrow_for_any_budget_is_refused_in_every_mode(tmp_path, width, height):
    path = tmp_path / "narrow.png"
    Image.new("L", (width, height), 128).save(path)
    for read in (images.header_image, images.reference_image, images.embed_image):
        with pytest.raises(
            images.ImageError, match=f"{width} x {height} pixels: aspect ratio .* above 200:1"
        ) as caught:
            read(path)
        assert caught.value.reason == "aspect_ratio" and str(path) in str(caught.value)
    with pytest.raises(AspectRatioError, match="above 200:1"):
        decode_image({"bytes": path.read_bytes(), "path": None}, BUDGET)


def test_a_resize_that_would_narrow_an_image_past_the_limit_is_refused(tmp_path):
    path = tmp_path / "wide.png"
    Image.new("L", (4000, 20), 128).save(path)  # 200:1; stored at long side 250 it would be 250 x 1
    assert images.embed_image(path).width == 4000
    with pytest.raises(images.ImageError, match="250 x 1 pixels"):
        images.embed_image(path, max_side=250)


def test_no_resize_to_a_budget_passes_it():
    """A side rounded up to one patch (an image of extreme aspect, a small budget) cannot carry the area past it."""
    rng = np.random.default_rng(0)
    for _ in range(20_000):
        max_pixels = int(rng.choice([28 * 28, 56 * 56, 28 * 28 * 5, 501_760]))
        min_pixels = min(int(rng.choice([28 * 28, 56 * 56])), max_pixels)
        width = int(rng.integers(1, 4000))
        height = max(1, int(width * rng.uniform(1 / MAX_ASPECT_RATIO, MAX_ASPECT_RATIO)))
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            continue
        budget = PixelBudget(min_pixels=min_pixels, max_pixels=max_pixels)
        w, h = budget.resized_size(width, height)
        assert w * h <= max_pixels and w % 28 == h % 28 == 0
        assert budget.resized_size(height, width) == (h, w)
    assert PixelBudget(min_pixels=28 * 28, max_pixels=28 * 28 * 2).resized_size(1, 200) == (28, 56)
    assert PixelBudget().resized_size(2539, 3050) == (644, 756)


def test_evaluate_refuses_to_convert_a_box_on_an_image_too_narrow_for_the_budget():
    row = {
        "question_id": "q",
        "question_type": "open_ended",
        "answer": "x",
        "reason": "",
        "boxes": [[0, 0, 1, 10]],
        "image_width": 2,
        "image_height": 30_000,
    }
    with pytest.raises(AspectRatioError, match="2 x 30000 pixels"):
        scoring.score_question(row, "<location> [[0, 0, 28, 280]]", "qwen2.5-vl", BUDGET)
    row.update(image_width=20, image_height=4000)  # 200:1, within Qwen's limit: scored at the budget
    assert scoring.score_question(row, "<location> [[0, 0, 28, 280]]", "qwen2.5-vl", BUDGET).iou is not None


def test_evaluate_says_which_question_has_an_image_too_narrow_for_qwen_boxes(tmp_path, capsys):
    """A folder from elsewhere (a build refuses such an image): one line naming the question, exit 2."""
    from datasets import Dataset

    from cxr_vqa import evaluate
    from gemex_dataset.features import features

    from .scoring_fixtures import gemex_rows

    rows = [
        {**dict.fromkeys(features("none")), **row, "split": "test", "regions": [], "q_id": str(k), "row_id": f"row_{k}"}
        for k, row in enumerate(gemex_rows(per_type=2, seed=5))
    ]
    narrow = next(row for row in rows if row["boxes"])
    narrow.update(image_width=2, image_height=30_000)
    path = tmp_path / "gemex" / "data" / "test" / "default-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    Dataset.from_list(rows, features=features("none")).to_parquet(str(path))
    argv = [str(tmp_path / "gemex"), "--benchmark", "gemex", "--baseline", "majority", "--text-metrics", ""]
    assert evaluate.main([*argv, "--box-convention", "qwen2.5-vl"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"question {narrow['question_id']}: its image of 2 x 30000 pixels" in error
    assert evaluate.main([*argv, "--box-convention", "pixels"]) == 0  # pixel boxes need no resize


# ---------------------------------------------------------------------------------------------
# Builds


def first_image(release_root: Path, split: str = "train") -> tuple[str, Path]:
    """A released image path of `split` and its file."""
    line = next((release_root / "per_type" / split).glob("single_choice_question.jsonl")).read_text().splitlines()[0]
    import json

    relative = json.loads(line)["image_path"]
    return relative, release_root / "files" / relative


def copy_release(gemex_release, root: Path) -> Path:
    shutil.copytree(gemex_release.root, root)
    return root


def rows_of_image(folder: Path, relative: str) -> list[dict]:
    configs, _ = card_configs(folder)
    rows = [
        row
        for path in config_shards(folder, configs["default"])["train"]
        for row in pq.read_table(path).to_pylist()
        if row["image_path"] == relative
    ]
    assert rows
    return rows


@pytest.mark.parametrize("mode", ["embed", "reference", "none"])
def test_a_release_with_an_image_stored_turned_builds_as_the_upright_one(gemex_release, tmp_path, mode):
    upright_root = copy_release(gemex_release, tmp_path / "upright")
    turned_root = copy_release(gemex_release, tmp_path / "turned")
    relative, path = first_image(turned_root)
    original = Image.open(path)
    turned_file(path, original.copy(), 6, quality=95, comment=original.info["comment"])
    built = {}
    for name, root in (("upright", upright_root), ("turned", turned_root)):
        built[name] = tmp_path / f"built-{name}"
        build_gemex(BuildSettings(source=root / "per_type", out=built[name], images=root / "files", image_mode=mode))
    assert validate(built["turned"]) == []
    keep = ("question_id", "image_width", "image_height", "boxes", "messages")
    upright, turned = (
        [{k: row[k] for k in keep if k in row} for row in rows_of_image(built[name], relative)]
        for name in ("upright", "turned")
    )
    assert turned == upright and (turned[0]["image_width"], turned[0]["image_height"]) == original.size
    if mode == "none":
        return
    loaded = [
        row for row in load_dataset(str(built["turned"]), "default", split="train") if row["image_path"] == relative
    ]
    for row in loaded:
        assert row["image"].size == (row["image_width"], row["image_height"]) == original.size
        assert all(
            0 <= x1 < x2 <= row["image_width"] and 0 <= y1 < y2 <= row["image_height"]
            for x1, y1, x2, y2 in row["boxes"]
        )
    shown = np.asarray(loaded[0]["image"].convert("L"), dtype=np.int16)
    assert np.abs(shown - np.asarray(original.convert("L"), dtype=np.int16)).mean() < 3
    stored = rows_of_image(built["turned"], relative)[0]["image"]
    assert decode_image(stored, BUDGET).size == BUDGET.resized_size(*original.size)


@pytest.mark.parametrize("mode", ["embed", "reference", "none"])
def test_a_build_rejects_an_image_too_narrow_for_any_budget(gemex_release, tmp_path, mode):
    root = copy_release(gemex_release, tmp_path / "release")
    relative, path = first_image(root)
    comment = Image.open(path).info["comment"]
    Image.new("L", (2, 30_000), 128).save(path, "JPEG", comment=comment)
    out = tmp_path / "built"
    report = build_gemex(BuildSettings(source=root / "per_type", out=out, images=root / "files", image_mode=mode))
    assert validate(out) == []
    if mode == "none":  # no image is stored: the rows stay, without sizes (as for any unreadable image)
        assert all(row["image_width"] is None and row["boxes"] is None for row in rows_of_image(out, relative))
        return
    rejects = [r for r in report.rejects if relative in r.reason]
    assert rejects and all(
        r.field == "image_path"
        and r.file.endswith(".jsonl")
        and r.record
        and "2 x 30000 pixels: aspect ratio 15,000.0:1 is above 200:1" in r.reason
        for r in rejects
    )
    assert report.records_read == report.rows_written + len(report.rejects)
