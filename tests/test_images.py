"""builders.images: synthetic files made here, plus the real files that pydicom ships."""

from __future__ import annotations

import collections
import io
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pydicom.data
import pydicom.data.data_manager
import pytest
from PIL import Image, ImageFile
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.pixels import apply_modality_lut, apply_voi_lut
from pydicom.uid import ExplicitVRLittleEndian, RLELossless, generate_uid

from builders import images
from builders.images import (
    ImageError,
    embed_image,
    image_size,
    read_display_pixels,
    read_pixels,
    reference_image,
    resolve_image_path,
    stored_size,
    to_8bit,
)

DX_STORAGE = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation
BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"


# ---------------------------------------------------------------------------------------------
# Synthetic sources


def chest_like(height: int, width: int, high: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with noise spanning roughly 0..high: no two rows alike, never constant."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.05, 0.95, width)[None, :] * np.linspace(0.5, 1.0, height)[:, None]
    noisy = ramp * high + rng.normal(0, high * 0.01, (height, width))
    return np.clip(noisy, 0, high)


def write_jpeg(path: Path, height: int = 90, width: int = 120, mode: str = "L") -> Path:
    pixels = chest_like(height, width, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    image.convert(mode).save(path, "JPEG", quality=90)
    return path


def write_png(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels).save(path, "PNG")
    return path


def write_dicom(
    path: Path,
    pixels: np.ndarray,
    photometric: str = "MONOCHROME2",
    bits_stored: int | None = None,
    **elements: object,
) -> Path:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DX_STORAGE
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID = DX_STORAGE
    dataset.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    dataset.Modality = "DX"
    dataset.set_pixel_data(pixels, photometric, bits_stored or pixels.dtype.itemsize * 8)
    for keyword, value in elements.items():
        setattr(dataset, keyword, value)
    dataset.save_as(path, enforce_file_format=True)
    return path


def twelve_bit(height: int = 64, width: int = 80) -> np.ndarray:
    return chest_like(height, width, 4095).astype(np.uint16)


def decoded(stored: images.StoredImage) -> Image.Image:
    assert stored.bytes is not None
    image = Image.open(io.BytesIO(stored.bytes))
    image.load()
    return image


@pytest.fixture
def forbid_decoding(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it once the test files exist: from then on any Pillow pixel decode fails."""

    def refuse(self: Image.Image) -> None:
        raise AssertionError("pixels were decoded")

    def forbid() -> None:
        monkeypatch.setattr(Image.Image, "load", refuse)
        monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)

    return forbid


# ---------------------------------------------------------------------------------------------
# Pass-through and resizing


def test_8bit_jpeg_is_passed_through_byte_for_byte(tmp_path, forbid_decoding):
    path = write_jpeg(tmp_path / "x.jpg")
    forbid_decoding()
    for max_side in (None, 120, 4000):
        stored = embed_image(path, max_side=max_side)
        assert stored.bytes == path.read_bytes()
        assert (stored.width, stored.height) == (stored.source_width, stored.source_height) == (120, 90)
        assert stored.path == str(path.resolve())


def test_8bit_png_is_passed_through_byte_for_byte(tmp_path, forbid_decoding):
    path = write_png(tmp_path / "x.png", chest_like(40, 30, 255).astype(np.uint8))
    forbid_decoding()
    assert embed_image(path).bytes == path.read_bytes()


@pytest.mark.parametrize(("height", "width", "expected"), [(90, 120, (60, 45)), (120, 90, (45, 60))])
def test_resize_keeps_aspect_and_long_side(tmp_path, height, width, expected):
    path = write_jpeg(tmp_path / "x.jpg", height, width)
    stored = embed_image(path, max_side=60)
    assert (stored.width, stored.height) == expected
    assert (stored.source_width, stored.source_height) == (width, height)
    image = decoded(stored)
    assert (image.format, image.mode, image.size) == ("JPEG", "L", expected)


@pytest.mark.parametrize(("height", "width"), [(599, 801), (999, 1001), (640, 96)])
def test_reduced_jpeg_decode_gives_the_stored_size_of_the_source(tmp_path, height, width):
    stored = embed_image(write_jpeg(tmp_path / "x.jpg", height, width), max_side=97)
    assert (stored.width, stored.height) == stored_size(width, height, 97)
    assert decoded(stored).size == (stored.width, stored.height)
    assert (stored.source_width, stored.source_height) == (width, height)


def test_resize_never_enlarges():
    assert stored_size(120, 90, 500) == (120, 90)
    assert stored_size(3056, 2544, 512) == (512, 426)
    assert stored_size(2544, 3056, 512) == (426, 512)
    assert stored_size(5000, 1, 100) == (100, 1)


def test_max_side_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="max_side"):
        embed_image(write_jpeg(tmp_path / "x.jpg"), max_side=0)


def test_colour_jpeg_is_stored_as_grayscale_jpeg(tmp_path):
    stored = embed_image(write_jpeg(tmp_path / "x.jpg", mode="RGB"))
    assert stored.bytes != (tmp_path / "x.jpg").read_bytes()
    image = decoded(stored)
    assert (image.format, image.mode) == ("JPEG", "L")


def test_rgba_png_is_read_as_grayscale(tmp_path):
    rgba = np.dstack([chest_like(20, 30, 255).astype(np.uint8)] * 3 + [np.full((20, 30), 255, np.uint8)])
    path = write_png(tmp_path / "x.png", rgba)
    pixels = read_pixels(path)
    assert pixels.shape == (20, 30) and pixels.dtype == np.uint8
    assert decoded(embed_image(path)).mode == "L"


# ---------------------------------------------------------------------------------------------
# 16-bit PNG (ReXVQA)


def test_16bit_png_window_uses_full_range_and_keeps_order(tmp_path):
    source = chest_like(60, 80, 40000).astype(np.uint16) + 1000
    path = write_png(tmp_path / "x.png", source)
    assert read_pixels(path).dtype == np.uint16
    stored = embed_image(path)
    image = decoded(stored)
    assert (image.format, image.mode) == ("PNG", "L")
    eight = np.asarray(image)
    assert eight.min() == 0 and eight.max() == 255
    order = np.argsort(source, axis=None, kind="stable")
    assert np.all(np.diff(eight.ravel()[order].astype(int)) >= 0), "a brighter pixel became darker"


def test_16bit_png_keep_16bit_is_passed_through(tmp_path, forbid_decoding):
    path = write_png(tmp_path / "x.png", twelve_bit())
    forbid_decoding()
    assert embed_image(path, keep_16bit=True).bytes == path.read_bytes()


def test_16bit_png_keep_16bit_resized_is_16bit_png(tmp_path):
    source = twelve_bit(64, 80)
    stored = embed_image(write_png(tmp_path / "x.png", source), max_side=40, keep_16bit=True)
    image = decoded(stored)
    assert (image.format, image.mode, image.size) == ("PNG", "I;16", (40, 32))
    values = np.asarray(image)
    assert values.max() > 255, "16-bit values were squeezed into 8 bits"
    assert abs(int(values.max()) - int(source.max())) < 200


def test_constant_16bit_image_maps_to_zero_without_warning(tmp_path):
    path = write_png(tmp_path / "x.png", np.full((10, 10), 777, np.uint16))
    with np.errstate(all="raise"):
        assert not read_display_pixels(path).any()


def test_percentile_window_falls_back_to_min_max_for_a_few_bright_pixels():
    pixels = np.zeros((100, 100), np.uint16)
    pixels[50, 50] = 1000
    eight = to_8bit(pixels)
    assert eight[50, 50] == 255 and eight.sum() == 255


# ---------------------------------------------------------------------------------------------
# DICOM


def test_dicom_monochrome1_is_inverted_relative_to_monochrome2(tmp_path):
    pixels = twelve_bit()
    mono2 = read_display_pixels(write_dicom(tmp_path / "m2.dcm", pixels, bits_stored=12))
    mono1 = read_display_pixels(write_dicom(tmp_path / "m1.dcm", pixels, "MONOCHROME1", bits_stored=12))
    assert mono2.dtype == np.uint8 and mono2.min() == 0 and mono2.max() == 255
    assert np.array_equal(mono1, 255 - mono2)


def test_dicom_window_from_the_file_is_used(tmp_path):
    pixels = np.tile(np.arange(0, 4096, 16, dtype=np.uint16), (4, 1))
    path = write_dicom(tmp_path / "w.dcm", pixels, bits_stored=12, WindowCenter=[2048, 1000], WindowWidth=[1025, 500])
    eight = read_display_pixels(path).astype(int)[0]
    assert np.all(eight[pixels[0] <= 1535] == 0)
    assert np.all(eight[pixels[0] >= 2560] == 255)
    assert eight[pixels[0] == 2048] == 128
    oracle = apply_voi_lut(pixels.astype(float), pydicom.dcmread(path))[0]
    assert np.abs(eight - oracle / 4095 * 255).max() <= 1


def test_dicom_sigmoid_window(tmp_path):
    pixels = np.tile(np.arange(0, 4096, 16, dtype=np.uint16), (2, 1))
    path = write_dicom(
        tmp_path / "s.dcm",
        pixels,
        bits_stored=12,
        WindowCenter=2048,
        WindowWidth=1024,
        VOILUTFunction="SIGMOID",
    )
    eight = read_display_pixels(path)[0].astype(int)
    assert eight[pixels[0] == 2048] in (127, 128)
    assert np.all(np.diff(eight) >= 0) and eight[0] < 5 and eight[-1] > 250


def test_dicom_rescale_applies_the_modality_lut(tmp_path):
    pixels = twelve_bit()
    path = write_dicom(tmp_path / "r.dcm", pixels, bits_stored=12, RescaleSlope=0.5, RescaleIntercept=-1024)
    np.testing.assert_allclose(read_pixels(path), pixels * 0.5 - 1024)
    np.testing.assert_array_equal(read_display_pixels(path), to_8bit(pixels * 0.5 - 1024))


def test_dicom_without_window_uses_the_percentile_window(tmp_path):
    pixels = twelve_bit()
    path = write_dicom(tmp_path / "p.dcm", pixels, bits_stored=12)
    np.testing.assert_array_equal(read_display_pixels(path), to_8bit(pixels))


def test_dicom_is_embedded_as_png(tmp_path):
    path = write_dicom(tmp_path / "x.dcm", twelve_bit(64, 80), bits_stored=12)
    stored = embed_image(path, max_side=40)
    image = decoded(stored)
    assert (image.format, image.mode, image.size) == ("PNG", "L", (40, 32))
    assert (stored.source_width, stored.source_height) == (80, 64)
    assert reference_image(path).bytes is None
    assert image_size(path) == (80, 64)


def test_dicom_keep_16bit_keeps_values_and_inverts_monochrome1(tmp_path):
    pixels = twelve_bit()
    mono2 = read_display_pixels(write_dicom(tmp_path / "a.dcm", pixels, bits_stored=12), True)
    mono1 = read_display_pixels(write_dicom(tmp_path / "b.dcm", pixels, "MONOCHROME1", bits_stored=12), True)
    np.testing.assert_array_equal(mono2, pixels)
    np.testing.assert_array_equal(mono1, int(pixels.min()) + int(pixels.max()) - pixels.astype(int))
    assert decoded(embed_image(tmp_path / "a.dcm", keep_16bit=True)).mode == "I;16"


def test_dicom_keep_16bit_keeps_values_under_an_identity_rescale(tmp_path):
    pixels = twelve_bit()
    path = write_dicom(tmp_path / "dx.dcm", pixels, bits_stored=12, RescaleSlope=1, RescaleIntercept=0)
    np.testing.assert_array_equal(read_display_pixels(path, keep_16bit=True), pixels)


def test_dicom_keep_16bit_maps_negative_values_onto_uint16(tmp_path):
    path = write_dicom(tmp_path / "ct.dcm", twelve_bit(), bits_stored=12, RescaleSlope=1, RescaleIntercept=-1024)
    values = read_display_pixels(path, keep_16bit=True)
    assert values.dtype == np.uint16 and values.min() == 0 and values.max() == 65535


def test_dicom_multiframe_uses_the_first_frame(tmp_path):
    frames = np.stack([twelve_bit(), np.zeros((64, 80), np.uint16)])
    path = write_dicom(tmp_path / "mf.dcm", frames, bits_stored=12)
    np.testing.assert_array_equal(read_pixels(path), frames[0])


def test_dicom_colour_is_read_as_grayscale(tmp_path):
    rgb = np.dstack([chest_like(20, 30, 255).astype(np.uint8)] * 3)
    path = write_dicom(tmp_path / "rgb.dcm", rgb, "RGB")
    pixels = read_display_pixels(path)
    assert pixels.shape == (20, 30) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, rgb[..., 0])


def test_dicom_is_recognised_by_its_magic_without_suffix(tmp_path):
    path = write_dicom(tmp_path / "IM000001", twelve_bit(), bits_stored=12)
    assert images.sniff_format(path) == "dicom"
    assert read_pixels(path).shape == (64, 80)


def test_dicom_without_pixel_data_is_rejected(tmp_path):
    path = write_dicom(tmp_path / "sr.dcm", twelve_bit(), bits_stored=12)
    dataset = pydicom.dcmread(path)
    del dataset.PixelData
    dataset.SOPClassUID = BASIC_TEXT_SR
    dataset.save_as(path)
    for read in (reference_image, embed_image, read_pixels):
        with pytest.raises(ImageError, match="no pixel data") as caught:
            read(path)
        assert caught.value.reason == "no_pixel_data"
        assert "Basic Text SR" in str(caught.value)


def test_compressed_dicom_without_its_plugin_says_which_extra_to_install(tmp_path, monkeypatch):
    path = write_dicom(tmp_path / "rle.dcm", twelve_bit(), bits_stored=12)
    dataset = pydicom.dcmread(path)
    dataset.compress(RLELossless)
    dataset.save_as(path)
    np.testing.assert_array_equal(read_pixels(path), twelve_bit())

    class Unavailable:
        is_available = False

    monkeypatch.setattr(images, "get_decoder", lambda uid: Unavailable())
    for read in (reference_image, embed_image):
        with pytest.raises(ImageError, match=r'pip install "\.\[dicom\]" from the cxr-vqa clone') as caught:
            read(path)
        assert caught.value.reason == "decoder_missing" and "RLE Lossless" in str(caught.value)


def test_dicom_without_preamble_is_not_guessed_at(tmp_path):
    path = write_dicom(tmp_path / "x.dcm", twelve_bit(), bits_stored=12)
    path.write_bytes(path.read_bytes()[132:])
    with pytest.raises(ImageError, match="not a DICOM Part 10 file") as caught:
        read_pixels(path)
    assert caught.value.reason == "unsupported"


# ---------------------------------------------------------------------------------------------
# Paths


def test_image_ext_swaps_the_suffix(tmp_path):
    relative = "p10/p10046166/s50051329/abc.jpg"
    dicom = tmp_path / "p10/p10046166/s50051329/abc.dcm"
    dicom.parent.mkdir(parents=True)
    write_dicom(dicom, twelve_bit(), bits_stored=12)
    assert resolve_image_path(tmp_path, relative) == str(tmp_path / relative)
    for ext in ("dcm", ".dcm"):
        assert resolve_image_path(tmp_path, relative, image_ext=ext) == str(dicom)
    assert embed_image(resolve_image_path(tmp_path, relative, "dcm")).width == 80


@pytest.mark.parametrize("relative", ["../../etc/passwd", "/etc/passwd", "p10/../../x.jpg", ".", "", "a\x00b.jpg"])
def test_path_escaping_its_root_is_rejected(tmp_path, relative):
    with pytest.raises(ImageError) as caught:
        resolve_image_path(tmp_path / "files", relative)
    assert caught.value.reason == "path_escape"


def test_rexvqa_paths_relative_to_metadata_stay_inside_the_release(tmp_path):
    metadata = tmp_path / "metadata"
    relative = "../deid_png/P1/A1/studies/S/series/R/instances/I.png"
    with pytest.raises(ImageError, match="outside"):
        resolve_image_path(metadata, relative)
    resolved = resolve_image_path(metadata, relative, allowed_root=tmp_path)
    assert resolved == str(tmp_path / "deid_png/P1/A1/studies/S/series/R/instances/I.png")
    with pytest.raises(ImageError):
        resolve_image_path(metadata, "../../outside.png", allowed_root=tmp_path)


# ---------------------------------------------------------------------------------------------
# Unusable files


def truncated(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


@pytest.mark.parametrize("read", [reference_image, embed_image, read_pixels])
def test_truncated_jpeg_and_png_are_rejected(tmp_path, read):
    jpeg = truncated(write_jpeg(tmp_path / "x.jpg"))
    png = truncated(write_png(tmp_path / "x.png", twelve_bit()))
    for path, kind in ((jpeg, "JPEG"), (png, "PNG")):
        with pytest.raises(ImageError, match=f"truncated {kind}") as caught:
            read(path)
        assert caught.value.reason == "truncated"


@pytest.mark.parametrize("read", [reference_image, embed_image, read_pixels, image_size])
def test_a_fifo_is_rejected_at_once_not_read(tmp_path, read):
    """A FIFO with no writer would block a plain open() for ever; it is refused as not a file."""
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match=r"not a regular file \(a FIFO\)") as caught:
        read(fifo)
    assert caught.value.reason == "not_a_file"


@pytest.mark.parametrize("read", [reference_image, embed_image, read_pixels, image_size])
def test_missing_empty_and_unknown_files_are_rejected(tmp_path, read):
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not an image\n")
    cases = {"missing.jpg": "missing", "empty.jpg": "empty", "notes.txt": "unknown_format"}
    for name, reason in cases.items():
        with pytest.raises(ImageError) as caught:
            read(tmp_path / name)
        assert caught.value.reason == reason
        assert str(caught.value).startswith(str(tmp_path / name) + ": ")


def test_corrupt_jpeg_body_is_an_image_error(tmp_path):
    path = write_jpeg(tmp_path / "x.jpg")
    data = bytearray(path.read_bytes())
    data[200:400] = b"\xff" * 200
    path.write_bytes(bytes(data))
    with pytest.raises(ImageError):
        read_pixels(path)


def test_image_error_is_one_line_value_error_that_pickles():
    err = ImageError("/data/x.png", "cannot decode:\n  something\tbroke", "undecodable")
    assert isinstance(err, ValueError)
    assert str(err) == "/data/x.png: cannot decode: something broke"
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.reason, again.path) == (str(err), "undecodable", "/data/x.png")


# ---------------------------------------------------------------------------------------------
# Reference mode


def test_reference_mode_reads_headers_only(tmp_path, forbid_decoding):
    write_jpeg(tmp_path / "x.jpg")
    write_png(tmp_path / "x.png", twelve_bit(30, 50))
    forbid_decoding()
    jpeg = reference_image(tmp_path / "x.jpg")
    png = reference_image(tmp_path / "x.png")
    assert (jpeg.bytes, jpeg.width, jpeg.height) == (None, 120, 90)
    assert (png.width, png.height, png.source_width, png.source_height) == (50, 30, 50, 30)
    assert image_size(tmp_path / "x.png") == (50, 30)


# ---------------------------------------------------------------------------------------------
# The real files that pydicom ships


MAX_TEST_FILE_BYTES = 5 * 1024 * 1024


def test_pydicom_test_files_are_local(monkeypatch):
    """get_testdata_files() lists the bundled files without downloading: its '**/*' pattern does
    not match the flat names of the downloadable ones."""
    downloads: list[str] = []
    monkeypatch.setattr(pydicom.data.data_manager, "data_path_with_download", lambda name: downloads.append(name))
    files = pydicom.data.get_testdata_files() + pydicom.data.get_charset_files()
    assert files and not downloads
    root = Path(pydicom.data.data_manager.DATA_ROOT)
    assert all(Path(name).is_relative_to(root) and os.path.exists(name) for name in files)


def _window_is_constant(path: str) -> bool:
    """Whether pydicom's own modality LUT + VOI gives one value: the file's window lies outside
    all its pixel values, so a constant display image is right."""
    dataset = pydicom.dcmread(path)
    frame = pydicom.pixels.pixel_array(dataset, index=0)
    shown = apply_voi_lut(apply_modality_lut(frame, dataset), dataset)
    return bool(shown.min() == shown.max())


@pytest.mark.filterwarnings("ignore")
def test_every_pydicom_test_file_decodes_or_raises_image_error(capsys):
    files = [
        name
        for name in pydicom.data.get_testdata_files() + pydicom.data.get_charset_files()
        if os.path.isfile(name) and os.path.getsize(name) <= MAX_TEST_FILE_BYTES
    ]
    started = time.perf_counter()
    decoded_count = 0
    rejected: collections.Counter[str] = collections.Counter()
    for name in files:
        try:
            raw = read_pixels(name)
            shown = read_display_pixels(name)
            stored = embed_image(name, max_side=64)
        except ImageError as err:
            message = str(err)
            assert message.startswith(name + ": ") and "\n" not in message
            rejected[err.reason] += 1
            continue
        decoded_count += 1
        assert raw.ndim == 2 and shown.dtype == np.uint8 and shown.shape == raw.shape
        if raw.min() != raw.max() and shown.min() == shown.max():
            assert _window_is_constant(name), f"{name}: non-constant pixels became constant"
        image = decoded(stored)
        assert image.size == (stored.width, stored.height) and max(image.size) <= 64
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"\npydicom test files: {len(files)} files, {decoded_count} decoded, "
            f"{sum(rejected.values())} rejected {dict(rejected)} in {elapsed:.1f} s"
        )
    assert decoded_count >= 50
    assert rejected["no_pixel_data"] >= 3  # structured reports, RT plans, waveforms
