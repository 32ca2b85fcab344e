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
from pathlib import Path

import pyarrow as pa
from datasets import Features

from builders.assembly.card import build_configs, configs_as_built, declared_configs, release_card_data, render_card
from builders.assembly.conversations import CHARS_PER_TOKEN, ConversationLayout
from builders.assembly.cycle_collector import rare_collections
from builders.assembly.image_source import ImageSource, Loaded
from builders.assembly.lifecycle import staged_output
from builders.assembly.report import BuildError, BuildReport, Reject
from builders.assembly.settings import BuildSettings
from builders.assembly.shards import SplitShards, sha256
from builders.assembly.staging import Staging
from builders.files import stop_point
from builders.provenance import Provenance


class DatasetBuild(ABC):
    """The steps every dataset's build takes, in order; each dataset fills in its own.

    `stage` reads and checks the raw records into a `Staging`, `write_split` writes one
    split's shards, `write_card` the card; `run` wraps them in the atomic output folder
    and saves the report, which must account for every record read. Every annotation file
    and image read goes through `provenance`, which decides whether the build is synthetic.
    """

    def __init__(self, settings: BuildSettings, report: BuildReport):
        self.settings, self.report = settings, report
        self.provenance = Provenance()
        self.images: ImageSource | None = None
        self.checksums: dict[str, Future[str]] = {}
        self.hasher: ThreadPoolExecutor | None = None

    def reject(self, item: Reject) -> None:
        self.report.reject(item)
        if self.settings.strict:
            raise BuildError(f"--strict: rejected {item.line()}")

    staging_key: str
    """The staged column a split's rows are sorted by, which keeps an image's (or study's) rows together."""

    @abstractmethod
    def staging_schema(self) -> pa.Schema: ...

    @abstractmethod
    def image_source(self) -> ImageSource | None: ...

    @abstractmethod
    def stage(self, staging: Staging) -> None: ...

    @abstractmethod
    def write_split(self, staging: Staging, split: str, out: Path) -> None: ...

    features: Features
    """The build's columns, as its image mode makes them."""
    card_template: str
    """The card's Jinja template in `cards/` (`render_card`)."""

    @abstractmethod
    def config_filters(self) -> dict[str, list]:
        """Each question config's Parquet filter, by which it reads its rows from a shared shard set."""

    @abstractmethod
    def release_facts(self) -> dict:
        """The source release as the card's YAML names it: `release_card_data`'s name, licence, tags and gate."""

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
            configs, infos, synthetic=synthetic, rows=self.report.rows_written, **self.release_facts()
        )
        card = render_card(
            self.card_template,
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
        """The build's one-conversation-per-image config (`builders.assembly.conversations`), or None (a build without images)."""
        return None

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

    def split_shards(self, out: Path, split: str, configs: list[str], features, config_of) -> SplitShards:
        return SplitShards(
            out / "data" / split,
            configs,
            features,
            self.settings.shared_shards,
            config_of,
            synthetic=lambda: self.provenance.synthetic,
            conversations=self.conversation_layout(),
        )

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
