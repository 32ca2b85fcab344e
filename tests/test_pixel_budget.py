"""The pixel budget (`builders.pixel_budget`): one default, Qwen's resize to it, shown in `--help`, decoded to
by the recipes' data path (JPEG at reduced scale, then the exact resize), and read by the lmms-eval tasks.
The recipes' processors and `evaluate`'s box conversion are tested in tests/test_recipes.py."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from builders import pixel_budget
from builders.box_frame import to_model_frame
from builders.pixel_budget import MAX_ASPECT_RATIO, MAX_PIXELS, MIN_PIXELS, PixelBudget, aspect_ratio_problem
from cxr_vqa import cli
from training_recipes.data import decode_image
from training_recipes.lmms_eval_tasks import harness


def jpeg(width: int, height: int, orientation: int | None = None) -> bytes:
    """A smooth greyscale radiograph-like gradient with noise, as MIMIC-CXR-JPG stores them."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = 128 + 90 * np.sin(x / 97.0) * np.cos(y / 131.0) + np.random.default_rng(0).normal(0, 4, (height, width))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="L")
    exif = Image.Exif()
    if orientation is not None:
        exif[Image.ExifTags.Base.Orientation] = orientation
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90, exif=exif)
    return out.getvalue()


def test_the_default_budget_is_for_chest_x_rays():
    assert PixelBudget() == PixelBudget(MIN_PIXELS, MAX_PIXELS) and MAX_PIXELS <= 2_000_000
    assert PixelBudget().resized_size(2539, 3050) == (644, 756)  # 23 x 27 = 621 tokens of 28 x 28 pixels
    assert PixelBudget().image_tokens(2539, 3050) == 621
    with pytest.raises(ValueError, match="min_pixels <= max_pixels"):
        PixelBudget(min_pixels=10_000, max_pixels=5_000)


def test_qwen_resize_is_a_multiple_of_28_and_within_budget():
    w, h = PixelBudget().resized_size(2544, 3056)
    assert w % 28 == 0 and h % 28 == 0 and w * h <= 28 * 28 * 1280


@pytest.mark.parametrize("factor", [28, 32])
def test_every_image_the_build_accepts_resizes_to_a_size_qwens_processor_takes_as_it_is(factor):
    """Qwen's processor resizes each image again (`smart_resize`, refusing an aspect ratio above 200); the
    budget's size for any image the build accepts, up to 200:1, must be one it takes and leaves alone. The
    PIL image processor's `smart_resize` is Qwen2-VL's rule (Qwen2.5-VL's and Qwen3-VL's too) and imports
    without torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    budget = PixelBudget(factor=factor)
    assert aspect_ratio_problem(MAX_ASPECT_RATIO * 41 + 1, 41) is not None  # the build's limit
    for short in range(1, 400):
        for long in {160 * short, 180 * short + short // 2, 199 * short + 7, MAX_ASPECT_RATIO * short}:
            long = min(long, MAX_ASPECT_RATIO * short)
            assert aspect_ratio_problem(long, short) is None
            for width, height in ((long, short), (short, long)):
                w, h = budget.resized_size(width, height)
                assert max(w, h) < MAX_ASPECT_RATIO * min(w, h), (width, height, w, h)
                assert smart_resize(h, w, factor, budget.min_pixels, budget.max_pixels) == (h, w), (width, height)


def test_an_image_at_the_aspect_limit_decodes_to_the_frame_its_boxes_are_written_in(tmp_path):
    path = tmp_path / "strip.png"
    Image.new("L", (8159, 41), 128).save(path)  # 199:1: its 41 rows round to one 28-pixel patch
    decoded = decode_image({"bytes": path.read_bytes(), "path": None}, PixelBudget())
    assert decoded.size == PixelBudget().resized_size(8159, 41) == (5572, 28)
    assert to_model_frame([0, 0, 8159, 41], 8159, 41, "qwen2.5-vl") == [0, 0, 5572, 28]


def test_a_full_size_jpeg_decodes_at_the_budget_as_a_full_decode_resized_would():
    data = jpeg(2539, 3050)
    decoded = decode_image({"bytes": data, "path": None}, PixelBudget())
    full = Image.open(io.BytesIO(data)).convert("RGB").resize((644, 756), Image.Resampling.BICUBIC)
    assert decoded.size == (644, 756) and decoded.mode == "RGB"
    difference = np.abs(np.asarray(decoded, dtype=np.int16) - np.asarray(full, dtype=np.int16))
    assert difference.mean() < 1.5 and np.percentile(difference, 99) < 8


def test_decoding_turns_the_image_upright_before_sizing_it():
    budget = PixelBudget(max_pixels=28 * 28 * 64)
    decoded = decode_image({"bytes": jpeg(600, 400, orientation=6), "path": None}, budget)
    assert decoded.size == budget.resized_size(400, 600)


def test_without_a_budget_the_image_keeps_its_size():
    assert decode_image({"bytes": jpeg(300, 200), "path": None}).size == (300, 200)


def test_evaluate_help_shows_the_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["evaluate", "--help"])
    text = capsys.readouterr().out
    assert "--max-pixels" in text and "--min-pixels" in text and f"{MAX_PIXELS:,}" in text


def test_lmms_eval_tasks_read_the_budget_and_hand_qwen_models_images_at_it(monkeypatch):
    row = {"image": {"bytes": jpeg(1200, 1500), "path": None}}
    monkeypatch.setenv("CXR_VQA_BOX_CONVENTION", "qwen2.5-vl")
    monkeypatch.delenv("CXR_VQA_MAX_PIXELS", raising=False)
    assert harness.settings().pixel_budget == PixelBudget(MIN_PIXELS, MAX_PIXELS, factor=28)
    assert harness.images(row, "gemex")[0].size == PixelBudget().resized_size(1200, 1500)
    monkeypatch.setenv("CXR_VQA_MAX_PIXELS", str(28 * 28 * 100))
    assert harness.images(row, "gemex")[0].size == PixelBudget(max_pixels=28 * 28 * 100).resized_size(1200, 1500)
    monkeypatch.setenv("CXR_VQA_BOX_CONVENTION", "pixels")  # another family: its own processor sizes the image
    assert harness.images(row, "gemex")[0].size == (1200, 1500)
    monkeypatch.setenv("CXR_VQA_MAX_PIXELS", "lots")
    with pytest.raises(ValueError, match="CXR_VQA_MAX_PIXELS='lots'"):
        pixel_budget.from_environment()


def test_lmms_eval_tasks_resize_at_the_model_familys_factor(monkeypatch):
    """Qwen3-VL merges 32 px of image into a token, Qwen2.5-VL 28: the tasks hand each the image its recipe trained on."""
    row = {"image": {"bytes": jpeg(1200, 1500), "path": None}}
    monkeypatch.delenv("CXR_VQA_BOX_CONVENTION", raising=False)
    monkeypatch.delenv("CXR_VQA_MAX_PIXELS", raising=False)
    monkeypatch.setenv("CXR_VQA_MODEL_TYPE", "qwen3_vl")
    assert harness.box_convention() == "norm1000"
    assert harness.settings().pixel_budget == PixelBudget(MIN_PIXELS, MAX_PIXELS, factor=32)
    width, height = harness.images(row, "gemex")[0].size
    assert width % 32 == 0 and height % 32 == 0
    monkeypatch.setenv("CXR_VQA_MODEL_TYPE", "qwen2_5_vl")
    assert harness.box_convention() == "qwen2.5-vl"
    assert harness.images(row, "gemex")[0].size == PixelBudget().resized_size(1200, 1500)
    monkeypatch.setenv("CXR_VQA_BOX_CONVENTION", "pixels")  # said outright, the convention wins
    assert harness.images(row, "gemex")[0].size == (1200, 1500)
