"""Build GEMeX: raw release -> schema check -> typed rows -> images attached -> shards, card, report.

Two passes. The first reads the annotation files (any mix of the three layouts; a split
that comes in several, as the release does, in one of them: `one_layout_per_split`),
checks each question and stages its text columns on disk. The second takes each
split's rows sorted by image, loads each image once, converts its boxes into the stored
image's pixels, drops repeated questions, and writes one shard set per question type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from builders.assembly.conversations import ConversationLayout
from builders.assembly.dataset_build import DatasetBuild
from builders.assembly.image_source import ImageSource, Loaded
from builders.assembly.report import BuildReport, Reject
from builders.assembly.settings import BuildSettings, layout_help
from builders.assembly.staging import Staging
from builders.box_frame import frame224_to_pixels_many
from builders.columns import offsets
from builders.images import ImageError, StoredImage
from builders.provenance import keyed_digest
from gemex_dataset import record_columns
from gemex_dataset.anatomy import REGIONS
from gemex_dataset.features import (
    COLUMN_DOCS,
    IMAGE_COLUMNS_PER_IMAGE,
    PER_IMAGE_COLUMN_DOCS,
    PER_IMAGE_CONFIG,
    QUESTION_TYPES,
    TURN_COLUMNS,
    features,
    per_image_features,
)
from gemex_dataset.prompts import CONVERSATION, to_messages
from gemex_dataset.records import SourceFile, find_source_files

LAYOUT_PREFERENCE = ("per_type", "grouped", "llava")
"""Which layout is read where a split comes in several: the per-type files hold every field (reports, region
names), the grouped ones boxes without region names, the LLaVA file neither report nor region names."""


def one_layout_per_split(files: list[SourceFile]) -> tuple[list[SourceFile], str]:
    """The files to read, and a note saying which were left out, where one split comes in several layouts.

    The released layouts are the same questions written three ways: a folder holding more than one for
    a split (the release as downloaded) is read in one layout, the first of `LAYOUT_PREFERENCE` it has,
    not three times with two copies rejected as repeats. Splits in one layout each are all read.
    """
    layouts: dict[str | None, set[str]] = {}
    for src in files:
        layouts.setdefault(src.split, set()).add(src.layout)
    chosen = {
        split: next(layout for layout in LAYOUT_PREFERENCE if layout in found) for split, found in layouts.items()
    }
    kept = [src for src in files if src.layout == chosen[src.split]]
    left = [src for src in files if src.layout != chosen[src.split]]
    if not left:
        return kept, ""
    order = ("train", "validation", "test")
    splits = sorted(
        (s for s in layouts if len(layouts[s]) > 1),
        key=lambda s: (order.index(s) if s in order else len(order), str(s)),
    )
    read = "/".join(sorted({chosen[s] for s in splits}))
    others = "/".join(sorted({src.layout for src in left}))
    note = (
        f"{', '.join(map(str, splits))} each in {len(layouts[splits[0]])} layouts of the same questions: read {read}, "
        f"{len(left)} {others} file(s) not read (give one layout's folder as --source to build another)"
    )
    return kept, note


class GemexBuild(DatasetBuild):
    dataset = "gemex"
    question_features = staticmethod(features)
    staging_key = image_path_column = "image_path"
    unstaged_columns = ("question_id", "image", "image_width", "image_height", "boxes", "messages")
    source_columns = ("_file", "_record")
    config_column, configs = "question_type", QUESTION_TYPES
    conversations = ConversationLayout(
        PER_IMAGE_CONFIG,
        "image_path",
        per_image_features("embed"),
        TURN_COLUMNS,
        group_columns=lambda rows: {c: rows[0][c] for c in IMAGE_COLUMNS_PER_IMAGE},
        group_id=lambda row: row["question_id"].rsplit("/", 2)[0],
    )
    """`sft_per_image`: an image's questions as one conversation."""
    missing_source = "no GEMeX annotation files under {} (expected *_question.jsonl, *.json or *.jsonl + *.csv)"
    find_source_files = staticmethod(find_source_files)

    def __init__(self, settings: BuildSettings):
        super().__init__(settings)
        self.image_names: dict[str, dict[str, str]] = {}  # split -> image path -> its short name (its dicom_id)
        self.whole_path_names: dict[
            str, set[str]
        ] = {}  # split -> the short names replaced by image paths in ids (`names_to_replace`)

    def image_source(self) -> ImageSource | None:
        return ImageSource(self.settings, provenance=self.provenance) if self.settings.images else None

    def stage_files(self, staging: Staging, files: list[SourceFile]) -> None:
        files, self.report.source_note = one_layout_per_split(files)
        for src in tqdm(files, desc="reading annotations", unit="file", disable=len(files) < 4):
            digest = keyed_digest() if self.provenance.unmarked is None else None
            self.stage_items(staging, src.split, record_columns.read(src, digest=digest))
            self.provenance.annotation_file(src.path, digest)
            if src.csv:
                self.provenance.annotation_file(src.csv)

    def stage_table(self, staging: Staging, split: str, table: pa.Table) -> None:
        regions = pc.list_flatten(table["regions"])
        unknown = regions.filter(pc.invert(pc.is_in(regions, pa.array(sorted(REGIONS)))))
        for item in pc.value_counts(unknown).to_pylist():
            self.report.count_unknown("region", item["values"], item["counts"])
        images = (
            table.select(["image_path", "dicom_id"])
            .group_by(["image_path", "dicom_id"], use_threads=False)
            .aggregate([])
        )
        self.note_images(split, zip(images["image_path"].to_pylist(), images["dicom_id"].to_pylist()))
        staging.add_table(split, table)

    def note_images(self, split: str, images: Iterable[tuple[str, str | None]]) -> None:
        """Note each image's short name (`short_name`), to find those that cannot name it alone (`question_ids`)."""
        names = self.image_names.setdefault(split, {})
        for path, dicom_id in images:
            names[path] = short_name(path, dicom_id)

    def prepared(self, split: str, table: pa.Table) -> pa.Table:
        """A chunk's rows (whole images, sorted by image) less repeated questions, each given its question id.

        The same question twice on one image (type, question, choices and answer) is rejected,
        the first kept. The id is `<split>/<dicom_id>/<question_type>/<n>`, n counting the image's
        questions of that type in release order (`question_ids`).
        """
        repeat_of = repeated_questions(table)
        repeats = np.flatnonzero(repeat_of >= 0).tolist()
        kept = table.filter(pa.array(repeat_of < 0)) if repeats else table
        if split not in self.whole_path_names:
            self.whole_path_names[split] = names_to_replace(self.image_names.get(split, {}))
        kept = kept.append_column("question_id", question_ids(split, kept, self.whole_path_names[split]))
        if repeats:
            first_id = dict(zip(np.flatnonzero(repeat_of < 0).tolist(), kept["question_id"].to_pylist()))
            for row in repeats:
                first = first_id[int(repeat_of[row])]
                self.reject(
                    staged_reject(
                        table, row, "question", f"the same question twice on one image (first kept as {first})"
                    )
                )
        return kept

    def with_image_columns(self, table: pa.Table, loaded: list[Loaded] | None) -> tuple[pa.Table, set[str]]:
        """A chunk's rows (sorted by image) with their image columns, made a column at a time; and the images they show.

        `group_rows` does the same a row at a time for embedded images. Rows of an image that
        cannot be read are rejected, except in `--image-mode none`, where they keep no sizes.
        """
        paths = pc.unique(table["image_path"])
        if loaded is None:
            return self.without_images(table), set(paths.to_pylist())
        usable = np.array([isinstance(image, StoredImage) for image in loaded], dtype=bool)
        image_of_row = pc.index_in(table["image_path"], paths).to_numpy()
        if not usable.all() and self.settings.image_mode != "none":
            lost = ~usable[image_of_row]
            for row in np.flatnonzero(lost).tolist():
                image = loaded[image_of_row[row]]
                self.reject(staged_reject(table, row, "image_path", f"{image.problem}: {image.path}"))
            table, image_of_row = table.filter(pa.array(~lost)), image_of_row[~lost]
        elif not usable.all():
            self.report.notices["images unreadable in --image-mode none (boxes left in the 224 frame only)"] += int(
                (~usable).sum()
            )
        sizes = np.array(
            [(image.width, image.height) if ok else (1, 1) for image, ok in zip(loaded, usable)], dtype=np.int64
        ).reshape(-1, 2)
        sized = usable[image_of_row]
        width, height = sizes[image_of_row, 0], sizes[image_of_row, 1]
        boxes = pixel_box_column(table["boxes_224"].combine_chunks(), width, height, sized, self.to_pixels)
        table = (
            table.append_column("image_width", pa.array(width, pa.int32(), mask=~sized))
            .append_column("image_height", pa.array(height, pa.int32(), mask=~sized))
            .append_column("boxes", boxes)
        )
        if self.settings.image_mode == "reference":
            stored = pa.array([image.path if ok else None for image, ok in zip(loaded, usable)], pa.string()).take(
                pa.array(image_of_row)
            )
            table = table.append_column(
                "image",
                pa.StructArray.from_arrays([pa.nulls(table.num_rows, pa.binary()), stored], names=["bytes", "path"]),
            )
        if "messages" in self.features:
            table = table.append_column("messages", CONVERSATION.column(table))
        shown = paths.filter(pa.array(usable)) if self.settings.image_mode != "none" else paths
        return table, set(shown.to_pylist())

    def to_pixels(self, corners: np.ndarray, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Boxes (n, 4) from the 224 frame into their images' pixels, the clipped ones counted in the report."""
        pixels, clipped = frame224_to_pixels_many(corners, width, height)
        if len(corners):
            self.report.notices["boxes clipped to the image"] += int(clipped.sum())
        return pixels

    def group_rows(self, rows: list[dict], images: dict[str, Loaded]) -> list[dict]:
        """The final rows of one image in an embed build, a row at a time: image columns and pixel boxes; rows of an image that fails rejected."""
        (image,) = images.values()
        if isinstance(image, ImageError):
            for row in rows:
                self.reject(Reject(row["_file"], row["_record"], "image_path", f"{image.problem}: {image.path}"))
            return []
        corners = np.array([box for row in rows for box in row["boxes_224"]], dtype=np.float64).reshape(-1, 4)
        pixels = iter(
            self.to_pixels(corners, np.full(len(corners), image.width), np.full(len(corners), image.height)).tolist()
        )
        for row in rows:
            del row["_file"], row["_record"]
            row.update(
                image_width=image.width,
                image_height=image.height,
                boxes=[next(pixels) for _ in row["boxes_224"]],
                image={"bytes": image.bytes, "path": row["image_path"]},
            )
            if "messages" in self.features:
                row["messages"] = to_messages(row)
        return rows

    def card_context(self, out: Path, configs: dict[str, dict]) -> dict:
        counts = {s: {t: self.report.rows.get(f"{s}/{t}", 0) for t in QUESTION_TYPES} for s in self.report.images}
        return {
            "counts": counts,
            "question_types": QUESTION_TYPES,
            "conversation_column_docs": PER_IMAGE_COLUMN_DOCS,
            "column_docs": COLUMN_DOCS,
        }


def staged_reject(table: pa.Table, row: int, field: str, reason: str) -> Reject:
    """The reject of a staged row (by position), naming its file and record."""
    return Reject(table["_file"][row].as_py(), table["_record"][row].as_py(), field, reason)


def pixel_box_column(
    boxes_224: pa.Array,
    width: np.ndarray,
    height: np.ndarray,
    sized: np.ndarray,
    to_pixels: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
) -> pa.Array:
    """`boxes` of each row (null where not `sized`) from its `boxes_224` and its image's size."""
    box_row = pc.list_parent_indices(boxes_224).to_numpy()
    corners = pc.list_flatten(pc.list_flatten(boxes_224)).to_numpy().reshape(-1, 4).astype(np.float64)
    pixels = np.zeros_like(corners)
    in_image = sized[box_row]
    pixels[in_image] = to_pixels(corners[in_image], width[box_row][in_image], height[box_row][in_image])
    corners_32 = pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel(), pa.float32()), 4)
    return pa.ListArray.from_arrays(
        offsets(pc.list_value_length(boxes_224).to_numpy()), corners_32, mask=pa.array(~sized)
    )


def repeated_questions(table: pa.Table) -> np.ndarray:
    """For each row, the earlier row of the same image it repeats (type, question, choices, answer), or -1.

    Arrow groups the rows on everything but the choices; only the rare groups of more than one
    row are compared in full.
    """
    repeat_of = np.full(table.num_rows, -1, dtype=np.int64)
    keys = ["image_path", "question_type", "question", "answer"]
    groups = (
        table.select(keys)
        .append_column("_row", pa.array(np.arange(table.num_rows)))
        .group_by(keys, use_threads=False)
        .aggregate([("_row", "list")])
    )
    candidates = groups.filter(pc.greater(pc.list_value_length(groups["_row_list"]), 1))["_row_list"].to_pylist()
    rows = sorted(row for group in candidates for row in group)
    choices = dict(zip(rows, map(tuple, table["choices"].take(pa.array(rows, pa.int64())).to_pylist())))
    for group in candidates:
        first: dict[tuple, int] = {}
        for row in sorted(group):
            earlier = first.setdefault(choices[row], row)
            if earlier != row:
                repeat_of[row] = earlier
    return repeat_of


def short_name(image_path: str, dicom_id: str | None) -> str:
    """What names an image in its question ids: its dicom_id, or for a path that is not MIMIC-CXR's the path less its extension."""
    return dicom_id if dicom_id is not None else image_path.rsplit(".", 1)[0]


def names_to_replace(short_names: dict[str, str]) -> set[str]:
    """The short names that cannot name their images in question ids, given each image path's short name.

    A short name two image paths share (the same file name under two subjects; `a/x.jpg` and
    `a/x.png`) is replaced by each path. So is a short name that is itself a path so named
    (`a/x.jpg.png`'s, `a/x.jpg`), and so on down the chain: the names that stay and the paths
    that replace the others are then all distinct. Each name is looked at once.
    """
    paths_of: dict[str, list[str]] = {}
    for path, name in short_names.items():
        paths_of.setdefault(name, []).append(path)
    replaced = {name for name, paths in paths_of.items() if len(paths) > 1}
    todo = list(replaced)
    while todo:
        for path in paths_of[todo.pop()]:
            if path in paths_of and path not in replaced:
                replaced.add(path)
                todo.append(path)
    return replaced


def question_ids(split: str, table: pa.Table, whole_path_names: set[str] = frozenset()) -> pa.Array:
    """`<split>/<image>/<question_type>/<n>` for rows sorted by image: n counts the image's questions of the type in order.

    `<image>` is the image's `short_name` (its dicom_id), or its whole path where the short name
    is one of `whole_path_names` (`names_to_replace`), so that it is unique by construction.
    """
    n = table.num_rows
    if n == 0:
        return pa.array([], pa.string())
    paths = table["image_path"].combine_chunks()
    new_image = np.ones(n, dtype=bool)
    new_image[1:] = pc.not_equal(paths.slice(1), paths.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    qtype = table["question_type"].to_numpy().astype(np.int64)
    group = np.cumsum(new_image) * len(QUESTION_TYPES) + qtype
    order = np.argsort(group, kind="stable")
    in_order = group[order]
    starts = np.flatnonzero(np.r_[True, in_order[1:] != in_order[:-1]])
    ordinal = np.empty(n, dtype=np.int64)
    ordinal[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    stem = pc.list_element(pc.split_pattern(paths, ".", max_splits=1, reverse=True), 0)
    key = pc.if_else(pc.is_valid(table["dicom_id"]), table["dicom_id"], stem)
    if whole_path_names:
        key = pc.if_else(pc.is_in(key, pa.array(sorted(whole_path_names), pa.string())), paths, key)
    names = pa.array(QUESTION_TYPES).take(pa.array(qtype))
    return pc.binary_join_element_wise(pa.scalar(split), key, names, pc.cast(pa.array(ordinal), pa.string()), "/")


OPTION_HELP = {
    "source": "the raw release: a folder holding any of its three layouts (or one annotation file)",
    "images": "the folder image paths are relative to (optional with --image-mode none)",
    "split": "the split of every file read (default: from train/valid/test folder names)",
    "image_ext": "image files carry this suffix instead of the released one (e.g. dcm for MIMIC-CXR DICOM)",
    **layout_help(
        ("question type", "question types"), PER_IMAGE_CONFIG, by_config=("4.6", "3.7"), shared=("1.9", "0.93")
    ),
}
"""How a GEMeX build reads the options whose meaning is the dataset's own (`BuildSettings` holds the rest)."""


def build_gemex(settings: BuildSettings) -> BuildReport:
    """Build a GEMeX dataset folder from a raw release; see `cxr-vqa build gemex --help`."""
    return GemexBuild(settings).run()
