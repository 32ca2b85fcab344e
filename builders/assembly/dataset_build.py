"""The steps every dataset build takes, in order (`DatasetBuild`); its options: `builders.assembly.settings`.

A build writes into a hidden `.<name>.partial-<pid>` folder beside the output, under the
output's lock, and renames it into place only when everything (shards, card, report) is
written (`builders.assembly.lifecycle`): a failed, interrupted or killed build leaves nothing
that looks like a dataset, and an existing output is replaced only with `overwrite`. Rows are
staged on disk and read back sorted (`builders.assembly.staging`); images are read by
`builders.assembly.image_source`.
"""

from __future__ import annotations

import errno
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Features
from tqdm.auto import tqdm

from builders.assembly.card import (
    build_configs,
    configs_as_built,
    declared_configs,
    release_card_data,
    release_facts,
    render_card,
)
from builders.assembly.conversations import CHARS_PER_TOKEN, ConversationLayout
from builders.assembly.cycle_collector import rare_collections
from builders.assembly.image_source import ImageSource, Loaded
from builders.assembly.lifecycle import staged_output
from builders.assembly.report import BuildError, BuildReport, Reject
from builders.assembly.settings import BuildSettings
from builders.assembly.shards import SplitShards, sha256
from builders.assembly.staging import Staging
from builders.columns import empty_lists
from builders.images import StoredImage
from builders.provenance import Provenance
from builders.stop_points import stop_point


class DatasetBuild(ABC):
    """The steps every dataset's build takes, in order; each dataset fills in what is its own.

    `stage` finds the release's files and reads and checks their records into a `Staging`
    (`stage_files`: the dataset's reader, which checks them; `stage_table` and `record_row` stage its rows);
    `write_split` writes one split's shards, an image's (a study's) rows at a time when images
    are embedded (`group_rows`), a sorted chunk at a time otherwise (`with_image_columns`);
    `write_card` the card. `run` wraps them in the atomic output folder and saves the report,
    which must account for every record read. Every annotation file and image read goes through
    `provenance`, which decides whether the build is synthetic.

    A dataset declares what its rows are: `question_features` (by image mode), the column its
    rows are staged, grouped and conversed by (`staging_key`), the column naming their images
    (`image_path_column`, one path or a list), the columns filled only when images are read
    (`unstaged_columns`) and those that locate a staged row's record (`source_columns`), its
    configs (`configs`, chosen by the class label in `config_column`), its conversation config
    (`conversations`), and what its card shows beyond every card's (`card_context`).
    """

    dataset: str
    """The dataset's name in the report (`gemex`, `rexvqa`); its card's template and release facts are
    `cards/<dataset>.md` and `.yaml` (`render_card`, `release_facts`)."""
    question_features: Callable[[str], Features]
    """The dataset's columns in an image mode (`features(image_mode)` of its `features` module)."""
    staging_key: str
    """The staged column a split's rows are sorted by, which keeps an image's (or study's) rows together."""
    image_path_column: str
    """The column naming a row's images as released: a path, or a list of them."""
    unstaged_columns: tuple[str, ...]
    """The columns of `question_features` made once images are read (the second pass), not staged."""
    source_columns: tuple[str, ...] = ("_file",)
    """Staged text columns (not written) that name where a row's record is in the release, for its rejects."""
    config_column: str
    """The class-label column that picks each row's question config: label k is `configs[k]`; a row with
    no label (-1) is in the last config."""
    configs: tuple[str, ...]
    conversations: ConversationLayout
    """The one-conversation-per-image config, seed and length limit as the settings give them (`conversation_layout`)."""
    missing_source: str
    """What a source holding none of the release's files is told: `{}` is the source."""
    find_source_files: Callable[[Path, str | None], list]
    """The release's annotation files under a source folder (or the one file), of one split or all."""

    def __init__(self, settings: BuildSettings):
        self.settings = settings
        self.report = BuildReport(self.dataset, settings.to_dict())
        self.features = self.question_features(settings.image_mode)
        self.provenance = Provenance()
        self.images: ImageSource | None = None
        self.checksums: dict[str, Future[str]] = {}
        self.hasher: ThreadPoolExecutor | None = None

    def reject(self, item: Reject) -> None:
        self.report.reject(item)
        if self.settings.strict:
            raise BuildError(f"--strict: rejected {item.line()}")

    @classmethod
    def staging_schema(cls) -> pa.Schema:
        """The staged text columns: the rows' columns less those images make, and where each record is."""
        text = [f for f in cls.question_features("none").arrow_schema if f.name not in cls.unstaged_columns]
        return pa.schema(text + [pa.field(name, pa.string()) for name in cls.source_columns])

    @abstractmethod
    def image_source(self) -> ImageSource | None: ...

    def stage(self, staging: Staging) -> None:
        files = self.find_source_files(Path(self.settings.source), self.settings.split)
        if not files:
            raise BuildError(self.missing_source.format(self.settings.source))
        self.stage_files(staging, files)

    @abstractmethod
    def stage_files(self, staging: Staging, files: list) -> None:
        """Read every file found (`stage_items` each one's questions)."""

    def stage_items(self, staging: Staging, split: str, items: Iterable) -> None:
        """Stage what a reader yields, each item counted as read: tables of rows checked a column at a time
        (`stage_table`), rejects, and checked records to stage one at a time (`stage_record`)."""
        for item in items:
            if isinstance(item, pa.Table):
                self.report.records_read += item.num_rows
                self.stage_table(staging, split, item)
                continue
            self.report.records_read += 1
            if isinstance(item, Reject):
                self.reject(item)
            else:
                self.stage_record(staging, item)

    def stage_record(self, staging: Staging, raw) -> None:
        """Stage one record the reader checked as its row (`record_row`)."""
        try:
            row = self.record_row(raw)
        except RecursionError:
            self.reject(Reject(raw.file, raw.record, None, "JSON nested too deeply to read"))
            return
        if row is not None:
            staging.add(raw.split, row)

    def record_row(self, raw) -> dict | None:
        """One checked record's staged row (its notes counted in the report), None for a record not to stage:
        for a reader that yields single records beside its tables."""
        raise NotImplementedError(f"{type(self).__name__} reads no single records")

    @abstractmethod
    def stage_table(self, staging: Staging, split: str, table: pa.Table) -> None:
        """Stage rows already checked and converted a column at a time (the reader's tables)."""

    def image_paths(self, row: dict) -> list[str]:
        paths = row[self.image_path_column]
        return paths if isinstance(paths, list) else [paths]

    def chunk_paths(self, table: pa.Table) -> pa.Array:
        """The distinct image paths of a chunk's rows, in order of first appearance."""
        paths = table[self.image_path_column]
        return pc.unique(pc.list_flatten(paths) if pa.types.is_list(paths.type) else paths)

    def config_of(self, row: dict) -> str:
        return self.configs[row[self.config_column] if row[self.config_column] >= 0 else -1]

    def config_index(self, table: pa.Table) -> np.ndarray:
        """Each row's config, as its position in `configs` (`config_of` a column at a time)."""
        label = table[self.config_column]
        return pc.if_else(pc.less(label, 0), len(self.configs) - 1, label).to_numpy()

    def config_filters(self) -> dict[str, list]:
        """Each question config's Parquet filter, by which it reads its rows from a shared shard set."""
        labels = len(self.features[self.config_column].names)
        return {config: [[self.config_column, "==", k if k < labels else -1]] for k, config in enumerate(self.configs)}

    def prepared(self, split: str, table: pa.Table) -> pa.Table:
        """A sorted chunk's rows as they are written (whole images, or studies); as staged unless a dataset says."""
        return table

    def write_split(self, staging: Staging, split: str, out: Path) -> None:
        """One split's shards; embedded image bytes are handed over an image's (a study's) rows at a time."""
        shards = SplitShards(
            out / "data" / split,
            list(self.configs),
            self.features,
            self.settings.shared_shards,
            self.config_of,
            synthetic=lambda: self.provenance.synthetic,
            conversations=self.conversation_layout(),
        )
        shown: set[str] = set()
        with tqdm(desc=f"writing {split}", unit="row", disable=None) as bar:
            if self.settings.image_mode == "embed":
                for table in staging.sorted_batches(split):
                    bar.update(table.num_rows)
                    for rows, images in self.image_groups(self.prepared(split, table).to_pylist()):
                        final = self.group_rows(rows, images)
                        used = {p for row in final for p in self.image_paths(row) if isinstance(images[p], StoredImage)}
                        shown |= used
                        shards.add_image_rows(final, sum(len(images[p].bytes or b"") for p in used))
            else:
                chunks = (self.prepared(split, table) for table in staging.sorted_batches(split, staging.BUCKET_ROWS))
                for table, loaded in self.chunks_with_images(chunks, lambda table: self.chunk_paths(table).to_pylist()):
                    bar.update(table.num_rows)
                    table, used = self.with_image_columns(table, loaded)
                    shown |= used
                    shards.add_table(table, self.config_index(table))
        self.finish_split(shards, split, out)
        self.report.images[split] = len(shown)

    def image_groups(self, rows: list[dict]) -> Iterator[tuple[list[dict], dict[str, Loaded]]]:
        """Rows grouped by `staging_key`, each group with its images (by released path) loaded once.

        Images load ahead in the background (`ImageSource.load_ahead`) and each group is let go
        once yielded, so memory holds a few images, not a whole chunk's.
        """
        groups: dict[str, list[dict]] = {}
        for row in rows:
            groups.setdefault(row[self.staging_key], []).append(row)
        rows.clear()  # a group's rows get its image bytes: hold them only until the group is written
        paths_of = {
            key: list(dict.fromkeys(p for row in group for p in self.image_paths(row))) for key, group in groups.items()
        }
        loaded = self.images.load_ahead(p for paths in paths_of.values() for p in paths)
        for key, paths in paths_of.items():
            yield groups.pop(key), {path: next(loaded) for path in paths}

    @abstractmethod
    def group_rows(self, rows: list[dict], images: dict[str, Loaded]) -> list[dict]:
        """The final rows of one image (study) in an embed build, a row at a time; rows without a usable image rejected."""

    @abstractmethod
    def with_image_columns(self, table: pa.Table, loaded: list[Loaded] | None) -> tuple[pa.Table, set[str]]:
        """A chunk's final rows made a column at a time, and the paths of the images they show.

        `loaded` holds the chunk's distinct images in `chunk_paths` order (`chunks_with_images`);
        None in a build that reads no image (`without_images`).
        """

    def without_images(self, table: pa.Table, empty: tuple[str, ...] = ()) -> pa.Table:
        """Rows of a build that reads no image: the image columns null, those of `empty` empty lists."""
        table = table.drop_columns(list(self.source_columns))
        for field in self.features.arrow_schema:
            if field.name not in table.column_names:
                column = empty_lists(table.num_rows) if field.name in empty else pa.nulls(table.num_rows, field.type)
                table = table.append_column(field, column)
        return table

    @abstractmethod
    def card_context(self, out: Path, configs: dict[str, dict]) -> dict:
        """What the dataset's card template shows beyond what every card shows (counts, column docs, ...)."""

    def write_card(self, out: Path) -> None:
        """README.md: the configs and features of the shards written, in the dataset's template."""
        configs, infos = build_configs(
            out,
            self.config_filters(),
            self.features,
            self.report.shards,
            sft="messages" in self.features,
            conversations=self.conversation_layout(),
        )
        synthetic = self.provenance.synthetic
        data = release_card_data(
            configs, infos, synthetic=synthetic, rows=self.report.rows_written, **release_facts(self.dataset)
        )
        card = render_card(
            f"{self.dataset}.md",
            data,
            synthetic=synthetic,
            settings=self.settings.to_dict(),
            shared_shards=self.settings.shared_shards,
            images=dict(self.report.images),
            report=self.report,
            columns=list(self.features),
            sft="sft" in configs,
            conversation=self.conversation_card(configs),
            **self.card_context(out, configs),
        )
        (out / "README.md").write_text(card, encoding="utf-8")

    def conversation_layout(self) -> ConversationLayout | None:
        """The build's one-conversation-per-image config (`builders.assembly.conversations`): in builds with
        images (`messages`) unless `--no-conversations`."""
        if "messages" not in self.features or self.settings.no_conversations:
            return None
        return replace(self.conversations, seed=self.settings.turn_seed, text_tokens=self.settings.conversation_tokens)

    def conversation_card(self, configs: dict[str, dict]) -> dict | None:
        """What the card says of the conversation config: its name, rows per split, length limit, seed and columns."""
        layout = self.conversation_layout()
        if layout is None or layout.config not in configs:
            return None
        rows = {split: self.report.conversation_rows.get(f"{split}/{layout.config}", 0) for split in self.report.images}
        return {
            "config": layout.config,
            "rows": rows,
            "text_tokens": layout.text_tokens,
            "seed": layout.seed,
            "chars_per_token": CHARS_PER_TOKEN,
            "columns": list(layout.features),
            "turn_columns": layout.turn_columns,
        }

    def chunks_with_images(
        self, chunks: Iterable[pa.Table], paths_of: Callable[[pa.Table], list[str]]
    ) -> Iterator[tuple[pa.Table, list[Loaded] | None]]:
        """Each sorted chunk with the images of its `paths_of` (read ahead: `ImageSource.chunks_with_images`),
        or with None when the build reads no image."""
        if self.images is None:
            yield from ((chunk, None) for chunk in chunks)
        else:
            yield from self.images.chunks_with_images(chunks, paths_of)

    def finish_split(self, shards: SplitShards, split: str, out: Path) -> None:
        """Close a split's shards and account for them: checksums (taken in the background while
        the next split is written), rows per config."""
        stop_point("shards")
        for path in shards.close():
            self.checksums[str(path.relative_to(out))] = self.hasher.submit(sha256, path)
        for config, rows in shards.rows.items():
            if rows:
                counts = self.report.rows if config in shards.configs else self.report.conversation_rows
                counts[f"{split}/{config}"] = rows
        self.report.rows_written += sum(shards.rows[config] for config in shards.configs)

    def run(self) -> BuildReport:
        self.settings.check()
        try:
            with rare_collections():
                return self._run()
        except OSError as err:
            raise BuildError(write_failure(err, Path(self.settings.out))) from err

    def _run(self) -> BuildReport:
        self.images = self.image_source()
        with staged_output(Path(self.settings.out), self.settings.overwrite) as (out, cleaned):
            for line in cleaned:
                self.report.notices[line] += 1
            staging = Staging(out / ".staging", self.staging_schema(), self.staging_key)
            self.hasher = ThreadPoolExecutor(1, thread_name_prefix="checksum")
            try:
                self.stage(staging)
                for split in staging.splits():
                    self.write_split(staging, split, out)
                self.report.shards.update({path: checksum.result() for path, checksum in self.checksums.items()})
            finally:
                if self.images:
                    self.images.close()
                    if self.images.workers_failed:
                        self.report.notices[self.images.workers_failed] += 1
                self.hasher.shutdown(cancel_futures=True)
                staging.close()
                shutil.rmtree(out / ".staging", ignore_errors=True)
            if self.report.rows_written == 0:
                first = self.report.rejects[0].line() if self.report.rejects else "no records"
                raise BuildError(f"no row written from {self.settings.source}: {self.report.summary()}; first: {first}")
            stop_point("card")
            self.report.provenance = self.provenance.summary()
            self.write_card(out)
            self.report.configs = declared_configs(out)
            self.report.config_files = configs_as_built(out)
            self.report.save(out / "build_report.json")
        return self.report


DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
"""What the kernel answers a write when the disk (or the process's file size limit, or quota) is full."""


def write_failure(err: OSError, out: Path) -> str:
    """One line for a build stopped by the file system, a full disk named as such.

    Arrow's writers raise `OSError` without `errno`, the error's name only in their text.
    """
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    full = err.errno in DISK_FULL or any(os.strerror(code) in text for code in DISK_FULL)
    if full:
        return f"{out}: the disk is full (or the file size limit reached) while building; nothing was written and any previous {out.name} is untouched ({text})"
    return f"{out}: the build stopped on a file error; nothing was written and any previous {out.name} is untouched ({text})"
