"""`cxr-vqa demo` recognises the raw releases it wrote by their bytes: an image the user edited in
place (Pillow writes the JPEG comment, the generator's tag, back) is not replaced by a rerun."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from builders.provenance import MANIFEST_NAME, image_tag, read_image_tag
from cxr_vqa.cli import main


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_image_edited_in_place_keeps_its_tag_and_stops_the_rerun(tmp_path, capsys):
    demo = tmp_path / "demo"
    assert main(["demo", "--out", str(demo), "--num-images", "6"]) == 0
    image = next((demo / "raw" / "gemex" / "files").rglob("*.jpg"))
    with Image.open(image) as opened:
        edited = opened.copy()
        edited.info = dict(opened.info)
    ImageDraw.Draw(edited).rectangle((0, 0, 20, 20), fill=255)  # the user's annotation, drawn in
    edited.save(image)
    assert read_image_tag(image) == image_tag(image.name)  # the tag alone would call it the generator's
    capsys.readouterr()
    before = files_under(demo)
    assert main(["demo", "--out", str(demo), "--num-images", "6"]) == 1
    error = capsys.readouterr().err
    rel = image.relative_to(demo / "raw" / "gemex").as_posix()
    assert f"{rel} was not written by the synthetic generator (its bytes differ from what it wrote)" in error
    assert files_under(demo) == before
    assert '"files/' in (demo / "raw" / "gemex" / MANIFEST_NAME).read_text()  # the images listed by their bytes
