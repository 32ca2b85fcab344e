"""Build GEMeX: raw release -> schema check -> typed rows -> images attached -> shards, card, report.

Two passes. The first reads every annotation file (any mix of the three layouts),
checks each question and stages its text columns on disk. The second takes each
split's rows sorted by image, loads each image once, converts its boxes into the stored
image's pixels, drops repeated questions, and writes one shard set per question type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import repeat
from pathlib import Path

import pyarrow as pa
from tqdm.auto import tqdm

from builders.box_frame import frame224_to_pixels
from builders.build.pipeline import BuildSettings, DatasetBuild, ImageSource, Staging
from builders.build.card import build_configs, release_card_data, render_card
from builders.images import ImageError, StoredImage
from builders.build.report import BuildError, BuildReport, RecordError, Reject
from gemex_dataset.features import COLUMN_DOCS, QUESTION_TYPES, features
from gemex_dataset.prompts import to_messages
from gemex_dataset.readers import RawQuestion, find_source_files, read_file
from gemex_dataset.rows import question_row

IMAGE_COLUMNS = ("question_id", "image", "image_width", "image_height", "boxes", "messages")


class GemexBuild(DatasetBuild):
    def __init__(self, settings: BuildSettings):
        super().__init__(settings, BuildReport("gemex", settings.to_dict()))
        self.features = features(settings.image_mode)

    def staging_schema(self) -> pa.Schema:
        text = [f for f in features("none").arrow_schema if f.name not in IMAGE_COLUMNS]
        return pa.schema(text + [pa.field("_file", pa.string()), pa.field("_record", pa.string())])

    def image_source(self) -> ImageSource | None:
        return ImageSource(self.settings, provenance=self.provenance) if self.settings.images else None

    def stage(self, staging: Staging) -> None:
        files = find_source_files(Path(self.settings.source), self.settings.split)
        if not files:
            raise BuildError(f"no GEMeX annotation files under {self.settings.source} (expected *_question.jsonl, *.json or *.jsonl + *.csv)")
        for src in tqdm(files, desc="reading annotations", unit="file", disable=len(files) < 4):
            for path in (src.path, src.csv) if src.csv else (src.path,):
                self.provenance.annotation_file(path)
            for item in read_file(src):
                self.report.records_read += 1
                if isinstance(item, Reject):
                    self.reject(item)
                    continue
                self.stage_question(staging, item)

    def stage_question(self, staging: Staging, raw: RawQuestion) -> None:
        try:
            row, notes = question_row(raw, ordinal=0)
        except RecordError as err:
            self.reject(Reject(raw.file, raw.record, err.field, err.reason))
            return
        except RecursionError:
            self.reject(Reject(raw.file, raw.record, None, "JSON nested too deeply to read"))
            return
        for region in notes.unknown_regions:
            self.report.count_unknown("region", region)
        del row["question_id"]
        row["_file"], row["_record"] = raw.file, raw.record
        staging.add(raw.split, row)

    def attach_images(self, rows: list[dict]) -> Iterator[tuple[list[dict], StoredImage | ImageError | None]]:
        """Rows grouped by image, each group with its loaded image (None without an image root).

        Images load ahead in the background (`ImageSource.load_ahead`) and each group is let go
        once yielded, so memory holds a few images, not a whole chunk's.
        """
        groups: dict[str, list[dict]] = {}
        for row in rows:
            groups.setdefault(row["image_path"], []).append(row)
        rows.clear()  # a group's rows get its image bytes: hold them only until the group is written
        paths = list(groups)
        for path, image in zip(paths, self.images.load_ahead(paths) if self.images else repeat(None)):
            yield groups.pop(path), image

    def image_group(self, split: str, rows: list[dict], image: StoredImage | ImageError | None) -> list[dict]:
        """The final rows of one image: ids, image columns and pixel boxes; repeats and image failures rejected."""
        if isinstance(image, ImageError):
            if self.settings.image_mode != "none":
                for row in rows:
                    self.reject(Reject(row["_file"], row["_record"], "image_path", f"{image.problem}: {image.path}"))
                return []
            self.report.notices["images unreadable in --image-mode none (boxes left in the 224 frame only)"] += 1
            image = None
        seen: dict[tuple, str] = {}
        ordinals: Counter = Counter()
        out = []
        for row in rows:
            qtype = QUESTION_TYPES[row["question_type"]]
            content = (qtype, row["question"], tuple(row["choices"]), row["answer"])
            if content in seen:
                self.reject(Reject(row.pop("_file"), row.pop("_record"), "question", f"the same question twice on one image (first kept as {seen[content]})"))
                continue
            key = row["dicom_id"] or row["image_path"].rsplit(".", 1)[0]
            row["question_id"] = f"{split}/{key}/{qtype}/{ordinals[qtype]}"
            ordinals[qtype] += 1
            seen[content] = row["question_id"]
            del row["_file"], row["_record"]
            self.add_image_columns(row, image)
            if "messages" in self.features:
                row["messages"] = to_messages(row)
            out.append(row)
        return out

    def add_image_columns(self, row: dict, image: StoredImage | None) -> None:
        if image is None:
            row.update(image_width=None, image_height=None, boxes=None)
        else:
            boxes = []
            for box in row["boxes_224"]:
                pixels, clipped = frame224_to_pixels(box, image.width, image.height)
                self.report.notices["boxes clipped to the image"] += clipped
                boxes.append(pixels)
            row.update(image_width=image.width, image_height=image.height, boxes=boxes)
        if self.settings.image_mode == "embed":
            row["image"] = {"bytes": image.bytes, "path": row["image_path"]}
        elif self.settings.image_mode == "reference":
            row["image"] = {"bytes": None, "path": image.path}

    def write_split(self, staging: Staging, split: str, out: Path) -> None:
        shards = self.split_shards(out, split, list(QUESTION_TYPES), self.features, lambda row: QUESTION_TYPES[row["question_type"]])
        images = 0
        with tqdm(desc=f"writing {split}", unit="row", disable=None) as bar:
            for table in staging.sorted_batches(split, "image_path"):
                for rows, image in self.attach_images(table.to_pylist()):
                    final = self.image_group(split, rows, image)
                    images += bool(final)
                    shards.add_image_rows(final, len(image.bytes) if isinstance(image, StoredImage) and image.bytes else 0)
                    bar.update(len(rows))
        self.finish_split(shards, split, out)
        self.report.images[split] = images

    def write_card(self, out: Path) -> None:
        filters = {qtype: [["question_type", "==", k]] for k, qtype in enumerate(QUESTION_TYPES)}
        configs, infos = build_configs(out, filters, self.features, self.report.shards, sft="messages" in self.features)
        synthetic = self.provenance.synthetic
        data = release_card_data(configs, infos, name="GEMeX", synthetic=synthetic,
                                 licence=("physionet-credentialed-health-data-license-1.5.0", "https://physionet.org/content/mimic-cxr-jpg/view-license/2.1.0/"),
                                 tags=["grounding", "mimic-cxr"], rows=self.report.rows_written,
                                 gated_prompt=GATED_PROMPT, gated_fields=GATED_FIELDS)
        counts = {s: {t: self.report.rows.get(f"{s}/{t}", 0) for t in QUESTION_TYPES} for s in self.report.images}
        card = render_card("gemex.md", data, synthetic=synthetic, settings=self.settings.to_dict(), shared_shards=self.settings.shared_shards, counts=counts,
                           images=dict(self.report.images), question_types=QUESTION_TYPES, report=self.report, sft="sft" in configs,
                           columns=list(self.features), column_docs=COLUMN_DOCS)
        card.save(out / "README.md")


GATED_PROMPT = (
    "This dataset contains MIMIC-CXR images and report text. Access requires a credentialed PhysioNet account "
    "and a signed data use agreement for MIMIC-CXR-JPG. Requests are approved by hand."
)
GATED_FIELDS = {
    "PhysioNet username": "text",
    "I hold credentialed access to MIMIC-CXR-JPG on PhysioNet": "checkbox",
    "I have signed the PhysioNet Credentialed Health Data Use Agreement 1.5.0 and will not share the data": "checkbox",
}


def build_gemex(settings: BuildSettings) -> BuildReport:
    """Build a GEMeX dataset folder from a raw release; see `cxr-vqa build gemex --help`."""
    return GemexBuild(settings).run()
