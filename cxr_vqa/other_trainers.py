"""A build written for LLaMA-Factory and ms-swift, which read one conversation shape as it is.

Both tools read a row as ``{"messages": [{"role", "content"}, ...], "images": [...]}`` with
each content a string holding an ``<image>`` tag where an image goes. `write_for_trainer`
writes every split of the build's `sft` config (one question a row) and of its conversation
config (`sft_per_image` / `sft_per_study`, one image's or study's questions as turns) as JSON
Lines of that shape, one file per config and split, and each image once, as a PNG under
``images/`` that the rows name by a path relative to the output folder:

- ``llamafactory``: beside the files, a `dataset_info.json` entry per file (``formatting:
  sharegpt``, its `columns` and `tags`; the file's other entries are kept), so ``dataset_dir: DIR`` and ``dataset: NAME`` are all a
  training config needs. GEMeX boxes are text in the model family's convention
  (`builders.box_frame`), as the recipes write them.
- ``swift``: the same rows with GEMeX boxes as ms-swift's grounding ``objects`` (``ref``: the
  region names, ``bbox``: boxes in the written image's pixels) and a ``<bbox>`` tag where each
  goes in the reply; ms-swift's template writes each one in its model family's convention.

Images are written at the pixel budget (`builders.pixel_budget`, as the recipes decode them:
`training_recipes.data.decode_image`), so a Qwen-family processor resizes nothing and a box written
in the image's pixels is in the pixels the model sees; with ``--box-convention pixels`` they are
written at their stored size. The text comes from the recipes' `to_messages`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Image, List, load_dataset
from PIL import Image as PILImage
from PIL import ImageChops

from builders.assembly.lifecycle import staged_output
from builders.box_frame import scale_box
from builders.built_folder import card_configs, config_shards
from builders.files import atomic_path, atomic_write, write_text
from builders.pixel_budget import PixelBudget
from gemex_dataset.prompts import location_text
from training_recipes.data import (
    CONVERSATION_CONFIGS,
    ConversationSettings,
    dataset_kind,
    decode_image,
    question_ids,
    to_messages,
)

TOOLS = ("llamafactory", "swift")
IMAGE_TAG = "<image>"
TRAINER_TAGS = re.compile(r"<(image|video|audio|bbox|ref-object|cot-process|start-image)>")
"""The tags LLaMA-Factory (media) or ms-swift (media, grounding) read in a message's text."""
BBOX_TAG = "<bbox>"
IMAGES = "images"
PNG_LEVEL = 1
"""zlib level of the written PNGs: a 644 x 756 radiograph encodes in a quarter of level 6's time, 6% larger."""
DATASET_INFO = "dataset_info.json"
SHAREGPT_ENTRY = {
    "formatting": "sharegpt",
    "columns": {"messages": "messages", "images": "images"},
    "tags": {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
        "system_tag": "system",
    },
}
"""LLaMA-Factory's description of our rows: sharegpt with OpenAI-style role/content keys."""


@dataclass
class Written:
    """What `write_for_trainer` wrote: rows per file (relative to the output folder) and images."""

    files: dict[str, int] = field(default_factory=dict)
    images: int = 0

    def lines(self, out: Path) -> list[str]:
        return [f"{out / name}: {rows} rows" for name, rows in self.files.items()] + [
            f"{out / IMAGES}: {self.images} images"
        ]


class ImageFiles:
    """Each distinct stored image written once as a PNG under ``images/``, named by a hash of what is stored,
    decoded and written on `workers` threads (Pillow decodes and encodes outside the GIL) while rows go on;
    at most a few images a thread wait in memory."""

    def __init__(self, out: Path, budget: PixelBudget | None, workers: int = 1):
        self.out = out
        self.budget = budget
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers))
        self.slots = threading.BoundedSemaphore(4 * max(1, workers))
        self.written: dict[str, Future] = {}

    def name(self, stored: dict) -> str:
        """The image's path relative to the output folder; written on first sight."""
        key = hashlib.sha256(stored["bytes"] if stored.get("bytes") else str(stored["path"]).encode()).hexdigest()
        relative = f"{IMAGES}/{key[:2]}/{key[:32]}.png"
        if relative not in self.written:
            self.slots.acquire()
            self.written[relative] = self.pool.submit(self.write, stored, self.out / relative)
            self.written[relative].add_done_callback(lambda _: self.slots.release())
        return relative

    def write(self, stored: dict, target: Path) -> None:
        with atomic_path(target) as temp:
            greyscale_if_grey(decode_image(stored, self.budget)).save(temp, format="PNG", compress_level=PNG_LEVEL)

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The written size of a stored image of `width` x `height` (as `decode_image` resizes it)."""
        return self.budget.resized_size(width, height) if self.budget else (width, height)

    def finish(self) -> int:
        """Wait for every image (an image that failed raises its error here); how many were written."""
        try:
            for future in self.written.values():
                future.result()
        finally:
            self.pool.shutdown(cancel_futures=True)
        return len(self.written)


def greyscale_if_grey(image: PILImage.Image) -> PILImage.Image:
    """One band for an RGB image whose three bands are equal (a radiograph): 40% less to store, and the same
    pixels once a loader converts it to RGB, as both tools do."""
    red, green, blue = image.split()
    if ImageChops.difference(red, green).getbbox() is None and ImageChops.difference(red, blue).getbbox() is None:
        return red
    return image


def text_messages(messages: list[dict]) -> list[dict]:
    """TRL's content parts as one string a turn, an ``<image>`` tag where each image part was.

    A tag either tool reads in the text itself (``<image>``, ``<bbox>``, ...: `TRAINER_TAGS`, as a record's
    question or report may hold) is written HTML-escaped, ``&lt;image&gt;``, which neither parses: a row's
    ``<image>`` tags are its images and its ``<bbox>`` tags its boxes."""
    return [
        {
            "role": m["role"],
            "content": "".join(
                IMAGE_TAG if part["type"] == "image" else TRAINER_TAGS.sub(r"&lt;\1&gt;", part["text"])
                for part in m["content"]
            ),
        }
        for m in messages
    ]


def questions_of(row: dict) -> list[dict]:
    """The row's questions in turn order, each with the image's columns: a conversation row's `turns`, or the row."""
    if "turns" not in row:
        return [row]
    shared = {k: v for k, v in row.items() if k not in ("turns", "question_ids", "messages")}
    return [{**shared, **turn} for turn in row["turns"]]


def swift_objects(row: dict, messages: list[dict], settings: ConversationSettings, images: ImageFiles) -> dict:
    """GEMeX boxes as ms-swift grounding: each reply's ``<location>`` written with a ``<bbox>`` tag a box, and
    ``objects`` holding the boxes (in the written image's pixels) and their region names, in tag order."""
    refs, boxes = [], []
    replies = iter(m for m in messages if m["role"] == "assistant")
    for question in questions_of(row):
        reply = next(replies)
        located = f"<location> {location_text(question, settings.box_convention, settings.pixel_budget)}"
        if not reply["content"].endswith(located):
            raise ValueError(f"question {question['question_id']}: its reply does not end with {located!r}")
        width, height = question["image_width"], question["image_height"]
        written = images.size(width, height)
        own = [scale_box(box, written[0] / width, written[1] / height) for box in question.get("boxes") or []]
        tags = ", ".join(BBOX_TAG for _ in own)
        reply["content"] = reply["content"][: -len(located)] + f"<location> [{tags}]"
        boxes += own
        regions = list(question.get("regions") or [])
        refs += regions if len(regions) == len(own) else [""] * len(own)
    return {"ref": refs, "bbox": boxes}


def trainer_rows(dataset, kind: str, tool: str, settings: ConversationSettings, images: ImageFiles) -> Iterator[dict]:
    """Each row of a split (images as stored) in the tool's shape."""
    column = "image" if kind == "gemex" else "images"
    stored_type = Image(decode=False) if kind == "gemex" else List(Image(decode=False))
    for row in dataset.cast_column(column, stored_type):
        stored = [row["image"]] if kind == "gemex" else list(row["images"])
        names = [images.name(image) for image in stored]
        messages = text_messages(to_messages(row, kind, settings))
        record = {"messages": messages, "images": names}
        objects = swift_objects(row, messages, settings, images) if tool == "swift" and kind == "gemex" else None
        if objects and objects["bbox"]:  # a reply without boxes has no <bbox> tag and no objects
            record["objects"] = objects
        record["question_ids"] = question_ids(row)
        yield record


def conversion_settings(box_convention: str, budget: PixelBudget) -> ConversationSettings:
    """The recipes' settings for a Qwen-family processor at `budget`; stored sizes for the ``pixels`` convention."""
    kept = None if box_convention == "pixels" else budget
    return ConversationSettings(box_convention=box_convention, fold_system=False, pixel_budget=kept)


def configs_to_write(folder: Path, configs: dict[str, dict]) -> list[str]:
    """The build's `sft` config and its conversation config, those of them it has; refused when it has neither."""
    wanted = [c for c in ("sft", *CONVERSATION_CONFIGS.values()) if c in configs]
    if not wanted:
        raise ValueError(
            f"{folder}: no sft config (a build with --image-mode none has no images to train on): "
            "attach the images first (cxr-vqa attach FOLDER --image-root DIR --out FOLDER2)"
        )
    return wanted


def write_split(
    folder: Path, config: str, split: str, out: Path, tool: str, settings: ConversationSettings, images: ImageFiles
) -> tuple[str, int]:
    """One config's split as `<dataset>_<config>_<split>.jsonl` in `out`; its name and rows."""
    dataset = load_dataset(str(folder), config, split=split)
    kind = dataset_kind(dataset.column_names, dataset.features)
    name = f"{kind}_{config}_{split}"
    rows = 0
    with atomic_write(out / f"{name}.jsonl") as file:
        for record in trainer_rows(dataset, kind, tool, settings, images):
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
            rows += 1
    return name, rows


def write_for_trainer(
    folder: Path,
    out: Path,
    tool: str,
    box_convention: str = "qwen2.5-vl",
    budget: PixelBudget | None = None,
    splits: list[str] | None = None,
    workers: int = 1,
) -> Written:
    """Write the build `folder` for `tool` (one of `TOOLS`) into `out`; see the module's docstring.

    Written in a hidden folder beside `out` (`staged_output`) that starts as a copy of `out` (its files hard
    linked), renamed onto it once every file and image is written: stopped or failed, `out` is as it was."""
    if tool not in TOOLS:
        raise ValueError(f"--to {tool}: expected one of {', '.join(TOOLS)}")
    folder = Path(folder)
    configs, _ = card_configs(folder)
    wanted = configs_to_write(folder, configs)
    settings = conversion_settings(box_convention, budget or PixelBudget())
    missing = [
        split for split in splits or [] for config in wanted if split not in config_shards(folder, configs[config])
    ]
    if missing:
        raise ValueError(
            f"{folder}: no {missing[0]!r} split in config {wanted[0]} (pass --split train, validation or test)"
        )
    with staged_output(out, True, lambda _: None, "convert writes into a folder") as (staging, _):
        if Path(out).is_dir():
            shutil.copytree(out, staging, symlinks=True, copy_function=link_or_copy, dirs_exist_ok=True)
        images = ImageFiles(staging, settings.pixel_budget, workers)
        written = Written()
        info = dataset_info(Path(out)) if tool == "llamafactory" else {}
        try:
            for config in wanted:
                for split in splits or list(config_shards(folder, configs[config])):
                    name, rows = write_split(folder, config, split, staging, tool, settings, images)
                    written.files[f"{name}.jsonl"] = rows
                    info[name] = {"file_name": f"{name}.jsonl", **SHAREGPT_ENTRY}
        finally:
            written.images = images.finish()
        if tool == "llamafactory":
            write_text(staging / DATASET_INFO, json.dumps(info, indent=2) + "\n")
    return written


def dataset_info(folder: Path) -> dict[str, dict]:
    """The entries of the folder's `dataset_info.json`, kept beside the ones `convert` writes (none without one)."""
    path = folder / DATASET_INFO
    try:
        info = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as err:
        info = err
    if not isinstance(info, dict):
        why = info if isinstance(info, Exception) else f"a JSON {type(info).__name__}"
        raise ValueError(f"{path}: not a JSON object of datasets ({why}); fix it or choose another --out")
    return info


def link_or_copy(source: str, target: str) -> None:
    """`source` hard linked at `target` (no bytes copied), or copied where the file system links none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
