"""A build's rows meet a local copy of the image release: `--image-root DIR`.

A build made with `--image-mode none` (the shareable annotations), or a `reference` build made on
another machine, names each row's image by its released path (`image_path`, or a study's
`image_paths`), relative to the folder the build's `--images` named. `with_local_images` attaches
`DIR / path` as the row's image column (`image`, `images`), as a path that the recipes decode at the
pixel budget exactly as they decode an embedded image, and fills what a build without images leaves
empty: each image's size from its header, and boxes in its pixels from the released 224-frame boxes.

Missing files are counted first, all of them, before anything trains, with those a reference build
rejects (a path outside the root, an empty, truncated or unparsable file): more than `MISSING_ALLOWED`
stops the run with one line naming the first ones and their rows; fewer are named one by one and their
rows left out.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
from datasets import Dataset, Image, List, Value

from builders.box_frame import frame224_to_pixels
from builders.images import ImageError, StoredImage, reference_image, resolve_image_path

IMAGE_COLUMNS = {"image_path": "image", "image_paths": "images"}
"""A row's released image path column, and the image column it fills."""
SIZE_COLUMNS = {"image_path": ("image_width", "image_height"), "image_paths": ("image_widths", "image_heights")}
MISSING_ALLOWED = 5
"""Missing images a run goes on without (their rows left out, each named); one more stops it before training."""
HELP = (
    "Attach each row's image from DIR / its image_path(s): a build made with --image-mode none (or a reference build "
    "made elsewhere) meets your copy of the images (the folder the build's --images named: MIMIC-CXR-JPG's files/, "
    f"ReXVQA's metadata/). More than {MISSING_ALLOWED} missing images stop the run before it starts."
)


class LocalImagesError(ValueError):
    """Something the user fixes before the images can be attached (the root, a file): one line, no traceback."""


class MissingImagesError(LocalImagesError):
    """More images missing under the image root than a run goes on without."""


def path_column(column_names: list[str]) -> str:
    """The split's released image path column; LocalImagesError when it has none."""
    for column in IMAGE_COLUMNS:
        if column in column_names:
            return column
    raise LocalImagesError(f"no {' or '.join(IMAGE_COLUMNS)} column: the rows name no image to attach")


def row_name(row: dict) -> str:
    for key in ("question_id", "conversation_id", "study_id"):
        if row.get(key) is not None:
            return f"{key.removesuffix('_id')} {row[key]}"
    return "a row"


def allowed_root(root: Path, column: str) -> Path:
    """Where the rows' image paths must stay: the root, or for a study's `image_paths` (ReXVQA's, relative to
    the release's metadata/ and starting `../deid_png/`) the release folder above it, as their build allows."""
    return root.absolute().parent if column == "image_paths" else root


def checked_image(root: Path, path: str, column: str) -> StoredImage | ImageError:
    """The image at `root / path` as a reference build checks it: inside `allowed_root` (else a `path_escape`),
    a complete file whose header parses."""
    try:
        return reference_image(resolve_image_path(root, path, allowed_root=allowed_root(root, column)))
    except ImageError as err:
        return err


def checked_images(rows: list[dict], root: Path, column: str) -> tuple[dict[str, StoredImage], list[tuple[str, str]]]:
    """Each image the rows name, checked once: the usable ones by released path, and (row, what is wrong) for
    every row naming another."""
    images: dict[str, StoredImage | ImageError] = {}
    missing = []
    for row in rows:
        paths = row[column] if column == "image_paths" else [row[column]]
        for path in paths or []:
            if path not in images:
                images[path] = checked_image(root, path, column)
            if isinstance(images[path], ImageError):
                missing.append((row_name(row), f"{column} {images[path]}"))
    return {path: image for path, image in images.items() if isinstance(image, StoredImage)}, missing


def check_missing(
    missing: list[tuple[str, str]],
    root: Path,
    allowed: int = MISSING_ALLOWED,
    consequence: str = "the row is left out",
) -> None:
    """Stop when more than `allowed` images are missing or unusable; else name each on stderr with its `consequence`."""
    files = {problem for _, problem in missing}
    if len(files) > allowed:
        shown = "; ".join(f"{row}: {problem}" for row, problem in missing[:3])
        raise MissingImagesError(
            f"--image-root {root}: {len(files)} images missing or unusable (more than {allowed}; {len(missing)} rows "
            f"name them), e.g. {shown}: is it the folder the rows' image paths are relative to (MIMIC-CXR-JPG's "
            "files/ for GEMeX, the ReXVQA release's metadata/ for ReXVQA)?"
        )
    for row, problem in missing:
        print(f"--image-root: {row}: {problem}; {consequence}", file=sys.stderr)


def sizes_and_boxes(row: dict, images: dict[str, StoredImage], column: str) -> dict:
    """The row's image sizes from the files' headers where the build left them empty, and GEMeX's boxes in
    those pixels from `boxes_224` where it left them empty."""
    width_column, height_column = SIZE_COLUMNS[column]
    out = {}
    if column == "image_path":
        if row.get(width_column) is None or row.get(height_column) is None:
            out[width_column], out[height_column] = images[row[column]].width, images[row[column]].height
        width, height = out.get(width_column, row.get(width_column)), out.get(height_column, row.get(height_column))
        if row.get("boxes") is None and row.get("boxes_224") is not None:
            boxes = [frame224_to_pixels(box, width, height)[0] for box in row["boxes_224"]]
            out["boxes"] = np.asarray(boxes, dtype=np.float32).reshape(-1, 4).tolist()  # as a build stores them
    elif not row.get(width_column) or len(row[width_column]) != len(row[column]):
        out[width_column] = [images[path].width for path in row[column]]
        out[height_column] = [images[path].height for path in row[column]]
    return out


def usable_images(rows: list[dict], root: Path, column: str, consequence: str) -> tuple[dict[str, StoredImage], set]:
    """The rows' usable images by released path, and the names of the rows naming another (each named on
    stderr; more than `MISSING_ALLOWED` stop the run)."""
    images, missing = checked_images(rows, root, column)
    check_missing(missing, root, consequence=consequence)
    return images, {row for row, _ in missing}


def attached_fingerprint(dataset: Dataset, images: dict[str, StoredImage]) -> str:
    """The cache key of the attached split: the split, this module's code and each image file as checked (its
    path, size on disk, modification time and pixel size), so that images replaced under the root, at another
    resolution say, are attached again."""
    digest = hashlib.sha256(f"{dataset._fingerprint}\n".encode() + Path(__file__).read_bytes())
    for path, image in sorted(images.items()):
        file = os.stat(image.path)
        digest.update(
            f"{path}\0{image.path}\0{file.st_size}\0{file.st_mtime_ns}\0{image.width}x{image.height}\n".encode()
        )
    return digest.hexdigest()


def with_local_images(dataset: Dataset, root: str | os.PathLike[str], streaming: bool = False) -> Dataset:
    """`dataset` with each row's image(s) from `root / path`, sizes and boxes filled; see the module's docstring.
    A `datasets` map, cached beside the split on `attached_fingerprint`, reading no more than the files' headers."""
    if streaming:
        raise LocalImagesError("--image-root reads a split whole, to count missing images first: not with --streaming")
    root = Path(root)
    if not root.is_dir():
        raise LocalImagesError(f"--image-root {root}: no such folder")
    column = path_column(dataset.column_names)
    image_column = IMAGE_COLUMNS[column]
    dataset = dataset.remove_columns([c for c in (image_column, "messages") if c in dataset.column_names])
    named_by = [c for c in ("question_id", "conversation_id", "study_id") if c in dataset.column_names][:1]
    named = dataset.select_columns([*named_by, column]).to_list()
    images, left_out = usable_images(named, root, column, "the row is left out")
    if left_out:
        dataset = dataset.select([k for k, row in enumerate(named) if row_name(row) not in left_out])
    features = dataset.features.copy()
    features[image_column] = Image() if column == "image_path" else List(Image())
    for size_column in SIZE_COLUMNS[column]:
        features.setdefault(size_column, Value("int32") if column == "image_path" else List(Value("int32")))

    def attach(batch: dict[str, list]) -> dict[str, list]:
        out = []
        for row in (dict(zip(batch, values)) for values in zip(*batch.values())):
            paths = [row[column]] if column == "image_path" else row[column]
            files = [{"path": images[path].path, "bytes": None} for path in paths]
            filled = {**row, **sizes_and_boxes(row, images, column)}
            out.append({**filled, image_column: files[0] if column == "image_path" else files})
        return {c: [row.get(c) for row in out] for c in features}

    fingerprint = attached_fingerprint(dataset, images)
    return dataset.map(
        attach, batched=True, features=features, new_fingerprint=fingerprint, desc="Attaching local images"
    )


def with_local_sizes(rows: list[dict], root: str | os.PathLike[str]) -> list[dict]:
    """`rows` (holding their image path column) with image sizes and boxes filled from the files under `root`
    where the build left them empty, for scoring boxes; a row whose image is missing keeps them empty."""
    root = Path(root)
    if not root.is_dir():
        raise LocalImagesError(f"--image-root {root}: no such folder")
    column = path_column(list(rows[0]) if rows else list(IMAGE_COLUMNS))
    images, left_out = usable_images(rows, root, column, "its boxes are not scored")
    return [row if row_name(row) in left_out else {**row, **sizes_and_boxes(row, images, column)} for row in rows]
