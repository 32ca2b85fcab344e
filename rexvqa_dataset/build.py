"""Build ReXVQA: raw release -> schema check -> typed rows -> study images attached -> shards, card, report.

Two passes, as for GEMeX. The first reads the three `*_vqa_data.json` files, checks
each question and stages its text columns on disk. The second takes each split's rows
sorted by study, loads each of the study's images once, and writes the shards
(`builders.assembly.shards`: one set per task, or one shared set when images are embedded). A
study's rows stay in one row group, so its image bytes are stored once per file
(dictionary-encoded) however many questions name them.

Images: a row keeps the images that load and lists the others in `missing_images`
(noticed in the report); a row none of whose images loads is rejected, and so is a row
with an image path that escapes the release folder. `--image-mode none` reads no image.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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
from builders.columns import empty_lists, offsets
from builders.images import ImageError, StoredImage
from rexvqa_dataset import record_columns
from rexvqa_dataset.features import (
    COLUMN_DOCS,
    IMAGE_COLUMNS,
    OTHER_TASK,
    PER_STUDY_COLUMN_DOCS,
    PER_STUDY_CONFIG,
    TASK_CONFIGS,
    TASKS,
    TURN_COLUMNS,
    features,
    per_study_features,
)
from rexvqa_dataset.prompts import CONVERSATION, to_messages
from rexvqa_dataset.records import RawRecord, find_source_files, metadata_folder
from rexvqa_dataset.rows import drop_missing_views, question_row, study_columns

KEPT_IN_EXTRA = "{} kept as released in extra (not representable in its column)"


class RexvqaBuild(DatasetBuild):
    dataset = "rexvqa"
    question_features = staticmethod(features)
    staging_key = "study_id"
    image_path_column = "image_paths"
    unstaged_columns = IMAGE_COLUMNS
    config_column, configs = "task_name", (*TASK_CONFIGS, OTHER_TASK)
    conversations = ConversationLayout(
        PER_STUDY_CONFIG,
        "study_id",
        per_study_features("embed"),
        TURN_COLUMNS,
        group_columns=study_columns,
        group_id=lambda row: f"{row['split']}/{row['study_id']}",
    )
    """`sft_per_study`: a study's questions as one conversation with all its images."""
    missing_source = "no ReXVQA files under {} (expected metadata/{{train,valid,test}}_vqa_data.json)"
    find_source_files = staticmethod(find_source_files)

    def __init__(self, settings: BuildSettings):
        self.metadata = metadata_folder(Path(settings.source))
        if settings.images is None and settings.image_mode != "none":
            settings.images = self.metadata
        super().__init__(settings)
        self.ids_of: dict[str, set[str]] = {}  # each file read -> its question ids

    def image_source(self) -> ImageSource | None:
        """`ImagePath`s start with `../deid_png/`: they may leave the metadata folder, not the release."""
        if self.settings.image_mode == "none":
            return None
        return ImageSource(
            self.settings, allowed_root=Path(self.settings.images).absolute().parent, provenance=self.provenance
        )

    def stage_files(self, staging: Staging, files: list[tuple[Path, str]]) -> None:
        for path, split in files:
            self.provenance.annotation_file(path)
            seen: set[str] = set()
            with tqdm(desc=f"reading {path.name}", unit="question", disable=None) as bar:
                self.stage_items(staging, split, counted(record_columns.read(path, split, seen=seen), bar))
            self.ids_of[str(path)] = seen

    def repeated_ids(self, ids: list[str], file: str) -> list[int]:
        """Positions of the ids an earlier file had, each rejected as duplicate_question_id (the first kept).

        The files' own id sets are all that is kept of the ids (one string per question, not two),
        so an id counts as read even where its earlier record was rejected.
        """
        repeated = []
        for k, question_id in enumerate(ids):
            first = next((other for other, other_ids in self.ids_of.items() if question_id in other_ids), None)
            if first is not None:
                repeated.append(k)
                self.reject(Reject(file, question_id, "question_id", "duplicate_question_id"))
                self.report.notices[
                    f"question ids also in {Path(first).name} rejected as duplicate_question_id (first kept)"
                ] += 1
        return repeated

    def stage_table(self, staging: Staging, split: str, table: pa.Table) -> None:
        if table.num_rows and (
            repeated := self.repeated_ids(table["question_id"].to_pylist(), table["_file"][0].as_py())
        ):
            table = table.filter(pa.array(~np.isin(np.arange(table.num_rows), repeated)))
        views_kept = pc.sum(table[record_columns.VIEWS_KEPT]).as_py() or 0
        if views_kept:
            self.report.notices[KEPT_IN_EXTRA.format("ImageViewPosition")] += views_kept
        staging.add_table(split, table)

    def record_row(self, raw: RawRecord) -> dict | None:
        if self.repeated_ids([raw.question_id], raw.file):
            return None
        row, notes = question_row(raw)
        if notes.unknown_task is not None:
            self.report.count_unknown("task_name", notes.unknown_task)
        for age in notes.odd_ages:
            self.report.count_unknown("PatientAge", age)
        for key in notes.kept_in_extra:
            self.report.notices[KEPT_IN_EXTRA.format(key)] += 1
        row["_file"] = raw.file
        return row

    def group_rows(self, rows: list[dict], images: dict[str, StoredImage | ImageError]) -> list[dict]:
        """The final rows of one study, image columns attached; rows without a usable image rejected."""
        out = []
        for row in rows:
            file = row.pop("_file")
            loaded = [(path, images[path]) for path in row["image_paths"]]
            escaped = next(
                (img for _, img in loaded if isinstance(img, ImageError) and img.reason == "path_escape"), None
            )
            usable = [(path, img) for path, img in loaded if isinstance(img, StoredImage)]
            if escaped or not usable:
                error = escaped or loaded[0][1]
                what = (
                    "an image path escapes the release folder" if escaped else "none of the study's images can be read"
                )
                self.reject(Reject(file, row["question_id"], "ImagePath", f"{what}: {error.problem}: {error.path}"))
                continue
            missing = [path for path, img in loaded if isinstance(img, ImageError)]
            for path in missing:
                self.report.notices[f"images {images[path].reason} (row kept with its other images)"] += 1
            drop_missing_views(row, missing)
            row.update(
                missing_images=missing,
                image_widths=[img.width for _, img in usable],
                image_heights=[img.height for _, img in usable],
                images=[
                    {"bytes": img.bytes, "path": path}
                    if self.settings.image_mode == "embed"
                    else {"bytes": None, "path": img.path}
                    for path, img in usable
                ],
            )
            row["messages"] = to_messages(row)
            out.append(row)
        return out

    def with_image_columns(self, table: pa.Table, loaded: list[Loaded] | None) -> tuple[pa.Table, set[str]]:
        """A chunk's rows with their image columns, and the paths of the images they show.

        Rows whose every image loads get theirs a column at a time (`attach_loaded`); the others
        go through `group_rows`, a row at a time, which keeps them with their other images or
        rejects them. Rows keep their order.
        """
        if loaded is None:
            return self.without_images(table, empty=("missing_images",)), set()
        paths = table["image_paths"].combine_chunks()
        flat = pc.list_flatten(paths)
        unique = self.chunk_paths(table)
        usable = np.array([isinstance(image, StoredImage) for image in loaded], dtype=bool)
        image_of_item, row_of_item = pc.index_in(flat, unique).to_numpy(), pc.list_parent_indices(paths).to_numpy()
        whole = np.ones(table.num_rows, dtype=bool)
        whole[row_of_item[~usable[image_of_item]]] = False
        clean = self.attach_loaded(table.filter(pa.array(whole)), loaded, image_of_item[whole[row_of_item]])
        used = set(pc.unique(pc.list_flatten(clean["image_paths"])).to_pylist())
        if whole.all():
            return clean, used
        rows = table.filter(pa.array(~whole)).to_pylist()
        for position, row in zip(np.flatnonzero(~whole).tolist(), rows):
            row["_position"] = position
        by_path = dict(zip(unique.to_pylist(), loaded))
        final = self.group_rows(rows, {path: by_path[path] for row in rows for path in row["image_paths"]})
        used |= {p for row in final for p in row["image_paths"] if isinstance(by_path[p], StoredImage)}
        schema = self.features.arrow_schema
        merged = pa.concat_tables([clean.select(schema.names).cast(schema), pa.Table.from_pylist(final, schema=schema)])
        position = np.r_[np.flatnonzero(whole), [row["_position"] for row in final]].astype(np.int64)
        return merged.take(pa.array(np.argsort(position, kind="stable"))), used

    def attach_loaded(
        self, rows: pa.Table, loaded: list[StoredImage | ImageError], image_of_item: np.ndarray
    ) -> pa.Table:
        """The image columns of rows whose every image loaded: the rows' k-th path (flattened) is `loaded[image_of_item[k]]`."""
        counts = pc.list_value_length(rows["image_paths"]).to_numpy()
        stored = [image if isinstance(image, StoredImage) else None for image in loaded]

        def per_image(values: list, type_: pa.DataType) -> pa.Array:
            return pa.ListArray.from_arrays(offsets(counts), pa.array(values, type_).take(pa.array(image_of_item)))

        rows = (
            rows.append_column("missing_images", empty_lists(len(counts)))
            .append_column("image_widths", per_image([image and image.width for image in stored], pa.int32()))
            .append_column("image_heights", per_image([image and image.height for image in stored], pa.int32()))
        )
        if self.settings.image_mode == "reference":
            references = [image and {"bytes": None, "path": image.path} for image in stored]
            rows = rows.append_column(
                "images", per_image(references, self.features.arrow_schema.field("images").type.value_type)
            )
        if "messages" in self.features:
            rows = rows.append_column("messages", CONVERSATION.column(rows))
        return rows

    def card_context(self, out: Path, configs: dict[str, dict]) -> dict:
        splits = list(self.report.images)
        counts = {s: {c: self.report.rows.get(f"{s}/{c}", 0) for c in self.configs} for s in splits}
        return {
            "counts": counts,
            "totals": {c: sum(counts[s][c] for s in splits) for c in self.configs},
            "tasks": dict(zip(self.configs, [*TASKS, "other (unknown task)"])),
            "column_docs": COLUMN_DOCS,
            "conversation_column_docs": PER_STUDY_COLUMN_DOCS,
            "categories": self.category_counts(out),
            "missing_images": sum(n for k, n in self.report.notices.items() if k.startswith("images ")),
        }

    @staticmethod
    def category_counts(out: Path) -> list[tuple[str, int]]:
        """Rows per `category` over all splits, most frequent first, read back from the question shards."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        counts: dict[str, int] = {}
        for path in sorted((out / "data").rglob("*.parquet")):
            if path.name.startswith(f"{PER_STUDY_CONFIG}-"):
                continue
            table = pq.read_table(path, columns=["category"])
            for item in pc.value_counts(table.column("category")).to_pylist():
                counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
        return sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))


def counted(items: Iterable, bar: tqdm) -> Iterator:
    """`items`, each question counted on `bar` (a table's rows each)."""
    for item in items:
        bar.update(item.num_rows if isinstance(item, pa.Table) else 1)
        yield item


OPTION_HELP = {
    "source": "the raw release: its root or its metadata/ folder (or one *_vqa_data.json file)",
    "images": "the folder image paths are relative to (default: the metadata folder)",
    "split": "the split of every file read (default: from the file names, train/valid/test_vqa_data.json)",
    **layout_help(("task", "tasks"), PER_STUDY_CONFIG, by_config=("3.3", "2.3"), shared=("1.9", "0.95")),
}
"""How a ReXVQA build reads the options whose meaning is the dataset's own (`BuildSettings` holds the rest)."""


def build_rexvqa(settings: BuildSettings) -> BuildReport:
    """Build a ReXVQA dataset folder from a raw release; see `cxr-vqa build rexvqa --help`."""
    return RexvqaBuild(settings).run()
