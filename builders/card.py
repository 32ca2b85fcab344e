"""The dataset card: YAML through `datasets`/`huggingface_hub`, prose from a template in `cards/`.

The YAML (`configs`, `dataset_info`, licence and gating fields, task categories, tags)
is assembled with `DatasetCardData`, `MetadataConfigs` and `DatasetInfosDict`, the same
objects `datasets` reads it back with, so key order and types (a config named `yes`
stays a string) are theirs. Every number in the prose comes from the build.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pyarrow.parquet as pq
from datasets import DatasetInfo, Features, SplitDict, SplitInfo
from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCard, DatasetCardData

SPLIT_ORDER = ("train", "validation", "test")


def config_files(out: Path, pattern: str) -> dict[str, list[Path]]:
    """Shards per split matching `data/<split>/<pattern>`, splits in the usual order."""
    splits = sorted((p.name for p in (out / "data").iterdir() if p.is_dir()), key=lambda s: (SPLIT_ORDER + (s,)).index(s))
    found = {split: sorted((out / "data" / split).glob(pattern)) for split in splits}
    return {split: files for split, files in found.items() if files}


def config_info(files: dict[str, list[Path]], features: Features, description: str = "") -> DatasetInfo:
    """`dataset_info` of one config, counted from its shards' Parquet metadata."""
    splits = SplitDict()
    for split, paths in files.items():
        metas = [pq.ParquetFile(p).metadata for p in paths]
        splits.add(SplitInfo(name=split, num_examples=sum(m.num_rows for m in metas),
                             num_bytes=sum(m.row_group(g).total_byte_size for m in metas for g in range(m.num_row_groups))))
    download = sum(p.stat().st_size for paths in files.values() for p in paths)
    return DatasetInfo(description=description, features=features, splits=splits, download_size=download,
                       dataset_size=sum(s.num_bytes for s in splits.values()))


def card_data(configs: dict[str, dict], infos: dict[str, DatasetInfo], **fields) -> DatasetCardData:
    """Card YAML for `configs` ({name: {"data_files": [...], ...}}) and their infos."""
    data = DatasetCardData(**fields)
    MetadataConfigs(configs).to_dataset_card_data(data)
    DatasetInfosDict(infos).to_dataset_card_data(data)
    return data


def render_card(template: str, data: DatasetCardData, **context) -> DatasetCard:
    """The card from `cards/<template>` (Jinja), with `data` as its YAML header."""
    with resources.as_file(resources.files("cards").joinpath(template)) as path:
        return DatasetCard.from_template(data, template_path=str(path), **context)


def size_category(rows: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if rows < limit:
            return name
    return "10M<n<100M"
