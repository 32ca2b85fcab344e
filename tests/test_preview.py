from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.hub.preview import (
    PREVIEW_IMAGE,
    add_preview_config,
    draw_boxes,
    preview_row,
    read_rows,
    render_png,
    write_preview,
)
from builders.hub.validate import validate
from cxr_vqa.cli import main

from .publish_builds import built, copy_build

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("builds")


def red_pixels(image: Image.Image) -> int:
    """Pixels of the first box colour; the synthetic X-rays are grey, so only boxes are red."""
    a = np.asarray(image.convert("RGB")).astype(int)
    return int(((a[..., 0] > 180) & (a[..., 1] < 80) & (a[..., 2] < 120)).sum())


def png_row(colour: int, size=(64, 48)) -> dict:
    buffer = io.BytesIO()
    Image.new("L", size, colour).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def test_draw_boxes_in_image_pixels():
    image = Image.new("L", (200, 100), 128)
    drawn = draw_boxes(image, [[10, 20, 110, 90]], ["left lung"])
    assert drawn.mode == "RGB" and drawn.size == image.size
    assert red_pixels(drawn.crop((0, 40, 200, 100))) > 50  # the box's sides below the label
    assert red_pixels(drawn.crop((120, 0, 200, 100))) == 0  # nothing right of the box


def test_png_grid_draws_the_boxes(root, tmp_path):
    out, shown = write_preview(built("synthetic-embed", root), tmp_path / "preview.png", n=8)
    assert shown == 8
    image = Image.open(out)
    assert image.width > 4 * 400 and image.height > 2 * 400
    assert red_pixels(image) > 200
    assert np.asarray(image.convert("L")).std() > 20


def test_rows_mix_the_question_types(root):
    rows = read_rows(built("synthetic-embed", root), n=8)
    assert len(rows) == 8
    assert len({r["question_type"] for r in rows}) == 4


def test_rows_of_a_config_and_split(root):
    rows = read_rows(built("synthetic-embed", root), n=3, config="multi_choice", split="train")
    assert len(rows) == 3 and all(r["split"] == "train" and r["choices"] for r in rows)
    with pytest.raises(ValueError, match="no config 'nope'"):
        read_rows(built("synthetic-embed", root), config="nope")


def test_text_only_build(root, tmp_path):
    rows = [preview_row(r) for r in read_rows(built("synthetic-none", root), n=2)]
    assert rows[0].images == [None] and rows[0].captions[0].startswith("no image")
    assert rows[0].question and rows[0].answer
    assert Image.open(render_png(rows, tmp_path / "p.png")).size[0] > 0


def test_rexvqa_rows_show_a_study_side_by_side(tmp_path):
    row = {
        "question_id": "q1",
        "images": [png_row(40), png_row(200)],
        "view_positions": ["PA", "LATERAL"],
        "question": "Is there an effusion?",
        "options": ["Yes", "No", "Maybe", "Unclear"],
        "answer": "A",
        "explanation": "Blunted costophrenic angle.",
    }
    preview = preview_row(row)
    assert [im.width for im in preview.images] == [210, 210]
    assert preview.captions == ["PA", "LATERAL"] and preview.choices[0] == "Yes" and preview.reason
    grid = np.asarray(Image.open(render_png([preview], tmp_path / "r.png")).convert("L"))
    assert grid[10:100, 15].mean() < 60 and grid[10:100, 240].mean() > 180  # dark view left, bright view right


def test_html_is_self_contained(root, tmp_path):
    out, _ = write_preview(built("synthetic-embed", root), tmp_path / "preview.html", n=4)
    page = out.read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "Answer:" in page and "Reason:" in page


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (run .ci/install-system-deps): HTML preview not rendered"
)
def test_html_preview_in_headless_chromium(root, tmp_path):
    page, _ = write_preview(built("synthetic-embed", root), tmp_path / "preview.html", n=4)
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={shot}",
                "--window-size=1200,900",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    image = Image.open(shot)
    assert image.size == (1200, 900)
    grey = np.asarray(image.convert("L"))
    assert grey.std() > 20  # not a blank page
    assert (grey < 80).mean() > 0.05  # the dark X-ray area is on screen
    assert red_pixels(image) > 100  # and so are the drawn boxes


def test_preview_config(root, tmp_path):
    from datasets import load_dataset

    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    before = load_dataset(str(folder), split="test").num_rows
    target = add_preview_config(folder, n=6)
    assert target == folder / "data" / "test" / "preview-00000-of-00001.parquet"
    assert validate(folder) == []
    preview = load_dataset(str(folder), "preview", split="test")
    assert preview.num_rows == 6 and red_pixels(preview[0]["image"]) > 20
    assert load_dataset(str(folder), split="test").num_rows == before  # default does not read the preview shard
    assert (folder / PREVIEW_IMAGE).exists()
    text = (folder / "README.md").read_text()
    assert f"]({PREVIEW_IMAGE})" in text and "config_name: preview" in text
    add_preview_config(folder, n=6)  # rerun replaces, does not add
    assert (folder / "README.md").read_text().count(f"]({PREVIEW_IMAGE})") == 1
    assert pq.ParquetFile(target).metadata.num_rows == 6


def test_preview_config_needs_images(root, tmp_path):
    folder = copy_build("synthetic-none", root, tmp_path / "gemex")
    with pytest.raises(ValueError, match="no image column"):
        add_preview_config(folder)


def test_cli(root, tmp_path, capsys):
    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    assert (
        main(["preview", str(folder), "--n", "2", "--config", "single_choice", "--out", str(tmp_path / "p.png")]) == 0
    )
    assert Image.open(tmp_path / "p.png").width > 0
    assert main(["preview", str(folder), "--add-config", "--n", "3"]) == 0
    assert "preview" in capsys.readouterr().out
    assert main(["preview", str(folder), "--out", str(tmp_path / "p.gif")]) == 1
    assert "png or .html" in capsys.readouterr().err
