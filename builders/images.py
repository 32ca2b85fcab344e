"""Read chest X-ray images: the one place in cxr-vqa where an image is decoded.

Sources
    JPEG (MIMIC-CXR-JPG: 8-bit grayscale), PNG (ReXGradient-160K: 16-bit grayscale; 8-bit,
    palette, RGB and RGBA PNGs are read too) and DICOM Part 10 files. The format is sniffed from
    the first bytes of the file (PNG signature, JPEG SOI marker, ``DICM`` at byte 128); a ``.dcm``
    suffix also sends a file to pydicom. DICOM files are read with ``force=False``, so a file
    without the Part 10 preamble is rejected rather than guessed at. Compressed DICOM transfer
    syntaxes need decoder plugins: ``pip install ".[dicom]"`` from the cxr-vqa clone.

Modes
    ``reference_image``: the file stays where it is. Only the header is parsed (plus the last
    bytes of a JPEG or PNG, so a truncated file is caught); no pixel is decoded.
    ``embed_image``: the encoded bytes go into the Parquet shard. A file that already is what
    would be stored (8-bit grayscale JPEG or PNG, or a 16-bit grayscale PNG with
    ``keep_16bit``, within ``max_side``) is copied byte for byte without decoding. Anything
    else is decoded, brought to 8 bits (below), resized so that its long side is ``max_side``
    (aspect kept, Lanczos, never enlarged) and encoded again: JPEG quality 95 when an 8-bit
    image came from a JPEG file, PNG otherwise (16-bit PNG, mode ``I;16``, with ``keep_16bit``).

Orientation
    An image is taken upright, as a viewer shows it: a JPEG or PNG whose EXIF orientation (or XMP
    ``tiff:Orientation``, as Pillow's ``ImageOps.exif_transpose`` reads them) is other than 1 has it
    applied. Every mode stores the upright size (width and height swapped by a quarter turn), so
    the boxes are converted in the upright frame; ``embed_image`` stores the upright pixels, with no
    orientation tag left (such a file is never copied as it is); ``reference_image`` keeps the file,
    which ``datasets`` and the recipes' decoder turn upright as they decode it. A PNG's metadata is
    read from the chunks before its pixel data and, where its last 8 KiB hold a metadata chunk,
    from those after it too (the same in every mode).

Aspect ratio
    An image whose stored long side is more than 200 times its short side
    (``builders.pixel_budget.MAX_ASPECT_RATIO``, Qwen's own limit) is refused: no pixel budget holds it.

Windowing: how a source becomes an 8-bit image
    * 8-bit grayscale JPEG and PNG: unchanged.
    * Colour and palette sources: grayscale by ITU-R BT.601 luma
      (L = 0.299 R + 0.587 G + 0.114 B, as Pillow's ``convert("L")``).
    * 16-bit PNG: percentile window. The 0.5th and 99.5th percentiles of the pixel values
      (taken on a regular subsample of about 260,000 pixels) map linearly onto 0 and 255, values
      beyond them are clipped. Where the two percentiles are equal (an image almost entirely of
      one value) the minimum and maximum are used instead; an image of a single value becomes 0.
    * DICOM, in this order:
        1. the first frame only of a multi-frame file;
        2. colour (RGB, YBR_*, PALETTE COLOR after its palette lookup): grayscale by luma as
           above (a 16-bit result then goes through the percentile window); steps 3 to 5 do
           not apply;
        3. the modality LUT (Modality LUT Sequence, or Rescale Slope and Intercept), by
           ``pydicom.pixels.apply_modality_lut``;
        4. the VOI transform, the first that the file has of: the first Window Center / Window
           Width pair, with its VOI LUT Function (LINEAR by default, LINEAR_EXACT, SIGMOID; DICOM
           PS3.3 C.11.2.1.2) mapping onto 0..255; the first VOI LUT Sequence item, whose
           smallest..largest entry maps onto 0..255; otherwise the percentile window above;
        5. MONOCHROME1 inverted (255 - value), so that bone is bright as in MONOCHROME2.
    * ``keep_16bit=True``: 16-bit sources stay 16-bit and are not windowed. A 16-bit PNG keeps its
      values. A grayscale DICOM with Bits Stored above 8 keeps its modality-LUT values when they
      are whole numbers within 0..65535; otherwise (negative Hounsfield units, fractional rescale)
      they are mapped linearly from their minimum..maximum onto 0..65535. MONOCHROME1 is
      inverted within the image's own minimum..maximum. 8-bit and colour sources are stored as
      8-bit images as above.

Errors
    Every image that cannot be used raises ``ImageError``: one line naming the file and the
    problem, with a short ``reason`` code for the build report.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import BinaryIO, Literal

import numpy as np
import pydicom
from PIL import ExifTags, Image
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.multival import MultiValue
from pydicom.pixels import apply_color_lut, apply_modality_lut, apply_voi, get_decoder, pixel_array
from pydicom.uid import UID

from builders.pixel_budget import aspect_ratio_problem

IMAGE_TAG_KEY = "cxr-vqa"
"""The PNG tEXt keyword under which an image carries its tag (JPEG carries it as its COM comment)."""

__all__ = [
    "IMAGE_TAG_KEY",
    "ImageError",
    "StoredImage",
    "VoiWindow",
    "apply_voi_window",
    "dicom_to_8bit",
    "dicom_voi_window",
    "embed_image",
    "image_size",
    "percentile_window",
    "read_display_pixels",
    "read_pixels",
    "reference_image",
    "resolve_image_path",
    "sniff_format",
    "stored_size",
    "to_8bit",
    "window_to_8bit",
]

ImageFormat = Literal["jpeg", "png", "dicom"]
ImageProblem = Literal[
    "missing",
    "empty",
    "unknown_format",
    "truncated",
    "undecodable",
    "unsupported",
    "no_pixel_data",
    "decoder_missing",
    "path_escape",
    "not_a_file",
    "aspect_ratio",
]

JPEG_QUALITY = 95
PERCENTILE_WINDOW = (0.5, 99.5)
DICOM_EXTRA_HINT = 'pip install ".[dicom]" from the cxr-vqa clone'

_PERCENTILE_SAMPLE_PIXELS = 1 << 18
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND_CHUNK = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_JPEG_SOI = b"\xff\xd8\xff"
_JPEG_EOI = b"\xff\xd9"
_DICOM_MAGIC = b"DICM"
_DICOM_MAGIC_OFFSET = 128
_HEAD_BYTES = _DICOM_MAGIC_OFFSET + len(_DICOM_MAGIC)
# Some encoders pad a file after its end marker; the marker must lie within this many last bytes.
_TAIL_BYTES = 64
_HEADER_BYTES = 1 << 16
"""Read for a header: a JPEG's or PNG's markers and metadata fit in it (a longer header is parsed from the file)."""
_PIL_FORMAT = {"jpeg": "JPEG", "png": "PNG"}
_LATE_METADATA_BYTES = 1 << 13
"""A PNG's last bytes searched for metadata chunks after its pixel data (an orientation there turns the image):
enough for an eXIf chunk or an XMP packet, little enough to search in a few tens of microseconds."""
_PNG_LATE_METADATA = (b"eXIf", b"Raw profile type exif", b"XML:com.adobe.xmp")
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""The EXIF orientations other than 1 and what turns each upright (as `PIL.ImageOps.exif_transpose`)."""


class ImageError(ValueError):
    """An image that cannot be used. str(err) is one line naming the file and what is wrong.

    ``path`` is the file (or the released relative path, for a path that escapes its root),
    ``problem`` the one-line description and ``reason`` a short code to count rejections by.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, reason: ImageProblem = "undecodable") -> None:
        self.path = os.fspath(path)
        self.problem = " ".join(problem.split())
        self.reason = reason
        super().__init__(f"{self.path}: {self.problem}")

    def __reduce__(self) -> tuple[type[ImageError], tuple[str, str, str]]:
        # Rebuilt from its fields, so that it survives being sent back from a worker process.
        return (type(self), (self.path, self.problem, self.reason))


@dataclass(frozen=True)
class StoredImage:
    path: str  # absolute path of the source file
    bytes: bytes | None  # encoded bytes to embed in Parquet (None for reference mode)
    width: int  # width of the image as stored (after any resize), pixels
    height: int
    source_width: int  # width of the source file's pixels
    source_height: int
    tag: str | None = None  # the metadata comment that carries a synthetic release's mark (`builders.provenance`)


@dataclass(frozen=True)
class VoiWindow:
    """A DICOM window: Window Center, Window Width and the VOI LUT Function that applies them."""

    center: float
    width: float
    function: str = "LINEAR"


# ---------------------------------------------------------------------------------------------
# Paths


def resolve_image_path(
    root: str | os.PathLike[str],
    relative: str,
    image_ext: str | None = None,
    allowed_root: str | os.PathLike[str] | None = None,
) -> str:
    """Join a released relative image path onto ``root`` and return the absolute path.

    The released paths come from annotation files, so they are not trusted: the normalised
    result must stay inside ``allowed_root`` (default: ``root``). ReXVQA paths are relative to
    ``metadata/`` and start with ``../deid_png/``; for them the caller passes ``metadata/`` as
    ``root`` and the release folder as ``allowed_root``. The check is lexical (``..`` is
    collapsed, symbolic links are not followed), so an image folder that is a symlink the user
    set up still works.

    ``image_ext`` swaps the file suffix: MIMIC-CXR annotations name ``.jpg`` files, a user who
    holds the DICOM release passes ``"dcm"``.
    """
    if not relative or "\x00" in relative:
        raise ImageError(repr(relative), "empty or malformed image path", "path_escape")
    base = os.path.abspath(root)
    allowed = os.path.abspath(allowed_root) if allowed_root is not None else base
    resolved = os.path.normpath(os.path.join(base, relative))
    if resolved == allowed or not resolved.startswith(
        allowed.rstrip(os.sep) + os.sep
    ):  # lexical, as `Path.is_relative_to`, on strings
        raise ImageError(relative, f"image path resolves outside {allowed}", "path_escape")
    if image_ext:
        return os.path.splitext(resolved)[0] + "." + image_ext.lstrip(".")
    return resolved


# ---------------------------------------------------------------------------------------------
# Public entry points


def sniff_format(path: str | os.PathLike[str]) -> ImageFormat:
    """The format of the file at ``path``, from its first bytes (and a ``.dcm`` suffix)."""
    path = os.fspath(path)
    return _format_from_head(path, _read_file(path, _HEAD_BYTES))


def image_size(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(width, height) from the header alone: JPEG and PNG via Pillow, DICOM from Columns/Rows."""
    image = header_image(path)
    return image.width, image.height


def header_image(path: str | os.PathLike[str]) -> StoredImage:
    """The size and metadata tag of the image at ``path``, from its header alone, with none of
    `reference_image`'s completeness checks: what `--image-mode none` keeps of an image."""
    path = os.fspath(path)
    if sniff_format(path) == "dicom":
        dataset = _dcmread(path, path, stop_before_pixels=True)
        width, height = _check_aspect(path, _dicom_size(path, dataset))
        return StoredImage(_absolute(path), None, width, height, width, height, _dicom_tag(dataset))
    with _decoding(path, "read the image header"), Image.open(path, formats=list(_PIL_FORMAT.values())) as image:
        tail = _read_tail(path, _LATE_METADATA_BYTES) if image.format == "PNG" else b""
        width, height = _check_aspect(path, _upright(image.size, _orientation(path, image, tail, path)))
        tag = metadata_tag(image.info)
    return StoredImage(_absolute(path), None, width, height, width, height, tag)


def reference_image(path: str | os.PathLike[str]) -> StoredImage:
    """Check that ``path`` is a usable image without decoding its pixels; return its size.

    The file must exist, be non-empty and have a header that parses. A JPEG must end with its
    EOI marker and a PNG with its IEND chunk, which catches truncated downloads and unpacking
    cheaply. A DICOM file must hold pixel data that an installed plugin can decode. The size is
    the upright one (module docstring, Orientation).
    """
    path = os.fspath(path)
    head, tail = _read_head_and_tail(path)
    image_format = _format_from_head(path, head[:_HEAD_BYTES])
    if image_format == "dicom":
        # defer_size: large values (the pixel data) are skipped over, not read.
        dataset = _read_dicom(path, path, defer_size="64 KB")
        width, height = _check_aspect(path, _dicom_size(path, dataset))
        return StoredImage(_absolute(path), None, width, height, width, height, _dicom_tag(dataset))
    _check_complete(path, image_format, tail[-_TAIL_BYTES:])
    with _decoding(path, "read the image header"):
        try:
            image = Image.open(io.BytesIO(head), formats=[_PIL_FORMAT[image_format]])
        except Exception:  # noqa: BLE001 - a header longer than the bytes read: parse the whole file
            image = Image.open(path, formats=[_PIL_FORMAT[image_format]])
        with image:
            width, height = _check_aspect(path, _upright(image.size, _orientation(path, image, tail, path)))
            tag = metadata_tag(image.info)
    return StoredImage(_absolute(path), None, width, height, width, height, tag)


def metadata_tag(info: dict) -> str | None:
    """The comment Pillow read from a JPEG (COM segment) or PNG (text chunk) header, where synthetic releases carry their mark."""
    tag = info.get("comment") or info.get(IMAGE_TAG_KEY)
    return tag.decode("latin-1") if isinstance(tag, bytes) else tag


def _dicom_tag(dataset: Dataset) -> str | None:
    comments = dataset.get("ImageComments")
    return str(comments) if comments else None


def embed_image(path: str | os.PathLike[str], max_side: int | None = None, keep_16bit: bool = False) -> StoredImage:
    """The image at ``path`` encoded for embedding, resized to ``max_side`` at most.

    The file is read once. When it already is what would be stored (see the module docstring)
    its bytes are returned unchanged; nothing is decoded. Sizes and pixels are upright (module
    docstring, Orientation); an image too narrow for any pixel budget is refused.
    """
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side must be a positive number of pixels, got {max_side}")
    path = os.fspath(path)
    data = _read_file(path)
    image_format = _format_from_head(path, data[:_HEAD_BYTES])
    if image_format == "dicom":
        dataset = _read_dicom(path, io.BytesIO(data))
        source_width, source_height = _dicom_size(path, dataset)
        _check_aspect(path, stored_size(source_width, source_height, max_side))
        pixels = _dicom_display_pixels(path, dataset, keep_16bit)
        return replace(_stored(path, pixels, (source_width, source_height), max_side, "PNG"), tag=_dicom_tag(dataset))

    _check_complete(path, image_format, data[-_TAIL_BYTES:])
    with _decoding(path, "read the image header"):
        image = Image.open(io.BytesIO(data), formats=[_PIL_FORMAT[image_format]])
    with image:
        tag = metadata_tag(image.info)
        orientation = _orientation(path, image, data[-_LATE_METADATA_BYTES:], io.BytesIO(data))
        width, height = _upright(image.size, orientation)
        target = _check_aspect(path, stored_size(width, height, max_side))
        if orientation == 1 and target == (width, height) and _is_storable_as_is(image, keep_16bit):
            return StoredImage(_absolute(path), data, width, height, width, height, tag)
        if image.format == "JPEG" and target != (width, height):
            # libjpeg decodes at 1/2, 1/4 or 1/8 scale, never below the asked size (in the file's
            # own frame): the Lanczos resize then starts from far fewer pixels.
            image.draft("L", _upright(target, orientation))
        pixels = _pil_pixels(path, image, orientation)
    if not (keep_16bit and pixels.dtype == np.uint16):
        pixels = to_8bit(pixels)
    encoding = "JPEG" if image_format == "jpeg" and pixels.dtype == np.uint8 else "PNG"
    return replace(_stored(path, pixels, (width, height), max_side, encoding), tag=tag)


def read_pixels(path: str | os.PathLike[str]) -> np.ndarray:
    """Decode the image at ``path`` to a 2-D array of its values, before any windowing.

    JPEG and PNG: uint8 (8-bit grayscale; colour and palette images converted by luma) or
    uint16 (16-bit grayscale PNG), upright. DICOM: the first frame after the modality LUT, whose dtype
    follows pydicom (uint8/uint16/int16 when there is no rescale, float64 after Rescale Slope and
    Intercept); colour DICOM as luma. Neither the VOI window nor the MONOCHROME1 inversion is
    applied: for what a viewer should show, use ``read_display_pixels``.
    """
    path = os.fspath(path)
    data = _read_file(path)
    image_format = _format_from_head(path, data[:_HEAD_BYTES])
    if image_format == "dicom":
        return _dicom_values(path, _read_dicom(path, io.BytesIO(data)))
    _check_complete(path, image_format, data[-_TAIL_BYTES:])
    return _decode_pil(path, image_format, data)


def read_display_pixels(path: str | os.PathLike[str], keep_16bit: bool = False) -> np.ndarray:
    """The 2-D pixels that ``embed_image`` would store before resizing: windowed to uint8, or
    uint16 for a 16-bit source with ``keep_16bit``. For previews."""
    path = os.fspath(path)
    data = _read_file(path)
    image_format = _format_from_head(path, data[:_HEAD_BYTES])
    if image_format == "dicom":
        return _dicom_display_pixels(path, _read_dicom(path, io.BytesIO(data)), keep_16bit)
    _check_complete(path, image_format, data[-_TAIL_BYTES:])
    pixels = _decode_pil(path, image_format, data)
    return pixels if keep_16bit and pixels.dtype == np.uint16 else to_8bit(pixels)


def stored_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """The size an image of ``width`` x ``height`` is stored at: long side ``max_side`` at most,
    aspect kept (rounded to whole pixels), never enlarged."""
    long_side = max(width, height)
    if max_side is None or long_side <= max_side:
        return width, height
    if width >= height:
        return max_side, max(1, round(height * max_side / width))
    return max(1, round(width * max_side / height)), max_side


# ---------------------------------------------------------------------------------------------
# Windowing (pure numpy; documented in the module docstring)


def to_8bit(pixels: np.ndarray) -> np.ndarray:
    """8-bit values unchanged; any other values through the percentile window."""
    if pixels.dtype == np.uint8:
        return pixels
    return window_to_8bit(pixels, *percentile_window(pixels))


def percentile_window(pixels: np.ndarray) -> tuple[float, float]:
    """The (low, high) values that the percentile window maps onto 0 and 255."""
    stride = max(1, int(np.sqrt(pixels.size / _PERCENTILE_SAMPLE_PIXELS)))
    low, high = np.percentile(pixels[::stride, ::stride], PERCENTILE_WINDOW)
    if high <= low:
        low, high = pixels.min(), pixels.max()
    return float(low), float(high)


def window_to_8bit(pixels: np.ndarray, low: float, high: float) -> np.ndarray:
    """Map ``low``..``high`` linearly onto 0..255, clipping beyond; all 0 when high <= low."""
    if high <= low:
        return np.zeros(pixels.shape, dtype=np.uint8)
    scaled = (pixels.astype(np.float32) - np.float32(low)) * np.float32(255.0 / (high - low))
    return _round_to(scaled, 0, 255, np.uint8)


def dicom_voi_window(dataset: Dataset) -> VoiWindow | None:
    """The first Window Center / Window Width pair of ``dataset``, or None when it has none
    (or only an unusable one: a width below 1 for LINEAR, 0 or less otherwise)."""
    center = _first_value(dataset.get("WindowCenter"))
    width = _first_value(dataset.get("WindowWidth"))
    if center is None or width is None:
        return None
    function = str(dataset.get("VOILUTFunction") or "LINEAR").strip().upper()
    if function not in ("LINEAR", "LINEAR_EXACT", "SIGMOID"):
        function = "LINEAR"
    if width <= 0 or (function == "LINEAR" and width < 1):
        return None
    return VoiWindow(center, width, function)


def apply_voi_window(values: np.ndarray, window: VoiWindow) -> np.ndarray:
    """Apply a DICOM window (PS3.3 C.11.2.1.2 and C.11.2.1.3.1) with an output range of 0..255."""
    x = values.astype(np.float64)
    c, w = window.center, window.width
    if window.function == "SIGMOID":
        return _round_to(255.0 / (1.0 + np.exp(-4.0 * (x - c) / w)), 0, 255, np.uint8)
    if window.function == "LINEAR_EXACT":
        scaled = ((x - c) / w + 0.5) * 255.0
    else:
        scaled = ((x - (c - 0.5)) / (w - 1) + 0.5) * 255.0 if w > 1 else (x > c - 0.5) * 255.0
    return _round_to(scaled, 0, 255, np.uint8)


def dicom_to_8bit(dataset: Dataset, values: np.ndarray) -> np.ndarray:
    """Steps 4 and 5 of the DICOM windowing: ``values`` are the modality-LUT output of a
    grayscale frame of ``dataset``."""
    window = dicom_voi_window(dataset)
    if window is not None:
        eight_bit = apply_voi_window(values, window)
    elif "VOILUTSequence" in dataset and len(dataset.VOILUTSequence) > 0:
        eight_bit = window_to_8bit(apply_voi(values, dataset, index=0), *_voi_lut_range(dataset))
    else:
        eight_bit = window_to_8bit(values, *percentile_window(values))
    if _is_monochrome1(dataset):
        return 255 - eight_bit
    return eight_bit


# ---------------------------------------------------------------------------------------------
# Reading files


def _open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading, as ImageError unless it is a regular file (see `_open_regular_fd`)."""
    fd, _ = _open_regular_fd(path)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _open_regular_fd(path: str) -> tuple[int, int]:
    """A descriptor of ``path`` opened for reading, and the file's size; ImageError unless it is a regular file.

    Opened non-blocking, so a FIFO with no writer (or a device) is refused at once instead of
    hanging the build; the check is on the opened file, so it cannot be swapped in between.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ImageError(path, "file not found", "missing") from None
    except OSError as err:
        raise ImageError(path, f"cannot read the file: {err.strerror or err}", "missing") from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        if stat.S_ISDIR(status.st_mode):
            raise ImageError(path, "is a folder, not an image file", "missing")
        kind = (
            "a FIFO" if stat.S_ISFIFO(status.st_mode) else "a socket" if stat.S_ISSOCK(status.st_mode) else "a device"
        )
        raise ImageError(path, f"not a regular file ({kind})", "not_a_file")
    return fd, status.st_size


def _read_file(path: str, size: int = -1) -> bytes:
    """The first ``size`` bytes of ``path`` (all by default), as ImageError if it cannot be used."""
    with _open_regular(path) as file:
        try:
            data = file.read(size)
        except OSError as err:
            raise ImageError(path, f"cannot read the file: {err.strerror or err}", "missing") from None
    if not data:
        raise ImageError(path, "empty file (0 bytes)", "empty")
    return data


def _read_head_and_tail(path: str) -> tuple[bytes, bytes]:
    """The first `_HEADER_BYTES` of ``path`` and its last bytes (`_TAIL_BYTES`; `_LATE_METADATA_BYTES` of a PNG),
    with one open (as ImageError if it cannot be used)."""
    fd, size = _open_regular_fd(path)
    try:
        head = os.read(fd, _HEADER_BYTES)  # a regular file: O_NONBLOCK has no effect on it
        wanted = _LATE_METADATA_BYTES if head.startswith(_PNG_SIGNATURE) else _TAIL_BYTES
        tail = os.pread(fd, wanted, max(0, size - wanted)) if size > len(head) else head[-wanted:]
    except OSError as err:
        raise ImageError(path, f"cannot read the file: {err.strerror or err}", "missing") from None
    finally:
        os.close(fd)
    if not head:
        raise ImageError(path, "empty file (0 bytes)", "empty")
    return head, tail


def _read_tail(path: str, size: int) -> bytes:
    """The last ``size`` bytes of ``path`` (as ImageError if it cannot be read)."""
    fd, length = _open_regular_fd(path)
    try:
        return os.pread(fd, size, max(0, length - size))
    except OSError as err:
        raise ImageError(path, f"cannot read the file: {err.strerror or err}", "missing") from None
    finally:
        os.close(fd)


def _format_from_head(path: str, head: bytes) -> ImageFormat:
    if head.startswith(_PNG_SIGNATURE):
        return "png"
    if head.startswith(_JPEG_SOI):
        return "jpeg"
    if head[_DICOM_MAGIC_OFFSET:_HEAD_BYTES] == _DICOM_MAGIC or os.path.splitext(path)[1].lower() == ".dcm":
        return "dicom"
    raise ImageError(path, "unknown image format: not a JPEG, PNG or DICOM file", "unknown_format")


def _check_complete(path: str, image_format: ImageFormat, tail: bytes) -> None:
    """A JPEG must end with its EOI marker, a PNG with its IEND chunk."""
    if image_format == "jpeg" and _JPEG_EOI not in tail:
        raise ImageError(path, "truncated JPEG: no end-of-image marker at the end", "truncated")
    if image_format == "png" and _PNG_IEND_CHUNK not in tail:
        raise ImageError(path, "truncated PNG: no IEND chunk at the end", "truncated")


@contextmanager
def _decoding(path: str, action: str) -> Iterator[None]:
    """Report a decoder's failure as an ImageError.

    Pillow and pydicom signal malformed input with many exception types (OSError, SyntaxError,
    ValueError, struct.error, AttributeError, NotImplementedError, ...), which differ between
    versions and plugins; the builder needs one. Only calls into those libraries run in here.
    """
    try:
        yield
    except ImageError:
        raise
    except Exception as err:
        detail = " ".join(str(err).split())[:300] or "no detail"
        raise ImageError(path, f"cannot {action}: {type(err).__name__}: {detail}") from err


def _absolute(path: str) -> str:
    return os.path.abspath(path)


# ---------------------------------------------------------------------------------------------
# JPEG and PNG


def _is_storable_as_is(image: Image.Image, keep_16bit: bool) -> bool:
    if image.mode == "L":
        return True
    return keep_16bit and image.format == "PNG" and image.mode == "I;16"


def _decode_pil(path: str, image_format: ImageFormat, data: bytes) -> np.ndarray:
    with _decoding(path, "read the image header"):
        image = Image.open(io.BytesIO(data), formats=[_PIL_FORMAT[image_format]])
    with image:
        return _pil_pixels(path, image, _orientation(path, image, data[-_LATE_METADATA_BYTES:], io.BytesIO(data)))


def _orientation(path: str, image: Image.Image, tail: bytes, source: str | BinaryIO) -> int:
    """The EXIF orientation (2 to 8, or 1: upright) of an opened, not yet decoded, JPEG or PNG, read as
    `PIL.ImageOps.exif_transpose` reads it (EXIF, else XMP). A PNG's pixels are not decoded unless its
    last bytes, ``tail``, hold a metadata chunk: then the file (``source``) is read whole, which reads the chunks after them."""
    with _decoding(path, "read the EXIF orientation"):
        if image.format == "PNG" and any(marker in tail for marker in _PNG_LATE_METADATA):
            with Image.open(source, formats=["PNG"]) as whole:
                orientation = whole.getexif().get(ExifTags.Base.Orientation, 1)
        else:  # the base class's: what the header holds (PngImageFile's own would decode the pixels to look further)
            orientation = Image.Image.getexif(image).get(ExifTags.Base.Orientation, 1)
    return orientation if orientation in _TRANSPOSE else 1


def _upright(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """(width, height) of an image of ``size`` turned upright: swapped by a quarter turn (orientations 5 to 8)."""
    return (size[1], size[0]) if orientation in (5, 6, 7, 8) else size


def _check_aspect(path: str, size: tuple[int, int]) -> tuple[int, int]:
    """``size``, unless no pixel budget can hold an image of it (`builders.pixel_budget.aspect_ratio_problem`)."""
    if problem := aspect_ratio_problem(*size):
        raise ImageError(path, f"image of {problem}", "aspect_ratio")
    return size


def _pil_pixels(path: str, image: Image.Image, orientation: int = 1) -> np.ndarray:
    """Decode an opened Pillow image to a 2-D uint8 or uint16 array, turned upright by ``orientation``."""
    with _decoding(path, f"decode the {image.format} pixels"):
        image.load()
        if orientation != 1:
            image = image.transpose(_TRANSPOSE[orientation])
        if image.mode == "L":
            return np.asarray(image)
        if image.mode.startswith("I;16"):
            return np.asarray(image).astype(np.uint16)
        if image.mode == "I":
            pixels = np.asarray(image)
        else:
            return np.asarray(image.convert("L"))
    if pixels.min() < 0 or pixels.max() > np.iinfo(np.uint16).max:
        raise ImageError(path, "32-bit pixel values outside 0..65535 are not supported", "unsupported")
    return pixels.astype(np.uint16)


# ---------------------------------------------------------------------------------------------
# DICOM


def _read_dicom(path: str, source: str | BinaryIO, defer_size: str | None = None) -> Dataset:
    """Read a DICOM file that holds pixel data an installed plugin can decode."""
    dataset = _dcmread(path, source, defer_size=defer_size)
    if not any(k in dataset for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        kind = UID(str(dataset.get("SOPClassUID", ""))).name or "unknown SOP class"
        raise ImageError(path, f"DICOM file has no pixel data (no PixelData element; {kind})", "no_pixel_data")
    _require_decoder(path, dataset)
    return dataset


def _dcmread(path: str, source: str | BinaryIO, **options: object) -> Dataset:
    with _decoding(path, "read the DICOM file"):
        try:
            return pydicom.dcmread(source, force=False, **options)
        except InvalidDicomError:
            raise ImageError(
                path, "not a DICOM Part 10 file (no 'DICM' preamble and file meta)", "unsupported"
            ) from None


def _require_decoder(path: str, dataset: Dataset) -> None:
    transfer_syntax = dataset.file_meta.get("TransferSyntaxUID")
    if transfer_syntax is None:
        return  # pydicom falls back on the dataset's own encoding, or says why it cannot
    try:
        decoder = get_decoder(transfer_syntax)
    except NotImplementedError:
        raise ImageError(
            path, f"DICOM transfer syntax {transfer_syntax.name} cannot be decoded", "unsupported"
        ) from None
    if not decoder.is_available:
        raise ImageError(
            path,
            f"compressed DICOM ({transfer_syntax.name}) needs a decoder plugin: {DICOM_EXTRA_HINT}",
            "decoder_missing",
        )


def _dicom_size(path: str, dataset: Dataset) -> tuple[int, int]:
    columns, rows = dataset.get("Columns"), dataset.get("Rows")
    if not columns or not rows:
        raise ImageError(path, "DICOM file has no Rows/Columns", "no_pixel_data")
    return int(columns), int(rows)


def _dicom_values(path: str, dataset: Dataset) -> np.ndarray:
    """Steps 1 to 3 of the DICOM windowing: the first frame, colour as luma, the modality LUT."""
    with _decoding(path, "decode the DICOM pixel data"):
        frame = pixel_array(dataset, index=0)
        if _photometric(dataset) == "PALETTE COLOR":
            frame = apply_color_lut(frame, dataset)
        if frame.ndim == 2:
            frame = apply_modality_lut(frame, dataset)
    if frame.ndim == 3 and frame.shape[-1] in (3, 4):
        frame = _luma(frame[..., :3])
    if frame.ndim != 2:
        raise ImageError(path, f"DICOM frame has unexpected shape {frame.shape}", "unsupported")
    if frame.dtype.kind == "f" and not np.isfinite(frame).all():
        raise ImageError(path, "DICOM pixel values include NaN or infinity", "unsupported")
    return frame


def _dicom_display_pixels(path: str, dataset: Dataset, keep_16bit: bool) -> np.ndarray:
    values = _dicom_values(path, dataset)
    if _photometric(dataset) not in ("MONOCHROME1", "MONOCHROME2"):
        return to_8bit(values)
    if keep_16bit and int(dataset.get("BitsStored") or 8) > 8:
        return _dicom_to_16bit(values, _is_monochrome1(dataset))
    with _decoding(path, "apply the DICOM VOI LUT"):
        return dicom_to_8bit(dataset, values)


def _dicom_to_16bit(values: np.ndarray, monochrome1: bool) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    in_range = low >= 0 and high <= np.iinfo(np.uint16).max
    # Rescale Slope 1 and Intercept 0 (common in DX) still turns the values into float64.
    if in_range and (values.dtype.kind in "ui" or np.array_equal(values, np.rint(values))):
        pixels = values.astype(np.uint16)
    elif high > low:
        pixels = _round_to((values - low) * (65535.0 / (high - low)), 0, 65535, np.uint16)
        low, high = 0.0, 65535.0
    else:
        return np.zeros(values.shape, dtype=np.uint16)
    if monochrome1:
        return (int(low) + int(high) - pixels.astype(np.int64)).astype(np.uint16)
    return pixels


def _voi_lut_range(dataset: Dataset) -> tuple[float, float]:
    """Smallest and largest entry of the first VOI LUT: the range its output spans."""
    entries, first_mapped, _bits = (int(v) for v in dataset.VOILUTSequence[0].LUTDescriptor)
    inputs = np.arange(first_mapped, first_mapped + (entries or 1 << 16))
    table = apply_voi(inputs, dataset, index=0)
    return float(table.min()), float(table.max())


def _photometric(dataset: Dataset) -> str:
    return str(dataset.get("PhotometricInterpretation", "")).strip().upper()


def _is_monochrome1(dataset: Dataset) -> bool:
    return _photometric(dataset) == "MONOCHROME1"


# ---------------------------------------------------------------------------------------------
# Small helpers


def _first_value(value: object) -> float | None:
    """The first of a possibly multi-valued DICOM number, or None."""
    if value is None or value == "":
        return None
    if isinstance(value, (list, tuple, MultiValue)):
        if len(value) == 0:
            return None
        value = value[0]
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma, in the dtype of ``rgb``."""
    weights = np.array([0.299, 0.587, 0.114])
    luma = rgb.astype(np.float64) @ weights
    if rgb.dtype.kind in "ui":
        info = np.iinfo(rgb.dtype)
        return _round_to(luma, info.min, info.max, rgb.dtype)
    return luma


def _round_to(values: np.ndarray, low: float, high: float, dtype: np.dtype | type) -> np.ndarray:
    return np.clip(np.rint(values), low, high).astype(dtype)


def _stored(
    path: str,
    pixels: np.ndarray,
    source_size: tuple[int, int],
    max_side: int | None,
    encoding: Literal["JPEG", "PNG"],
) -> StoredImage:
    """Resize ``pixels`` (uint8 or uint16, 2-D; possibly already reduced from the source) to the
    stored size of the source and encode them."""
    image = Image.fromarray(pixels)
    size = stored_size(*source_size, max_side)
    if size != image.size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    if encoding == "JPEG":
        image.save(buffer, "JPEG", quality=JPEG_QUALITY)
    else:
        image.save(buffer, "PNG")
    return StoredImage(_absolute(path), buffer.getvalue(), size[0], size[1], *source_size)
