"""The dataset card: YAML through `datasets`/`huggingface_hub`, prose from a template in `cards/`.

The YAML (`configs`, `dataset_info`, licence and gating fields, task categories, tags)
is assembled with `DatasetCardData`, `MetadataConfigs` and `DatasetInfosDict`, the same
objects `datasets` reads it back with, so key order and types (a config named `yes`
stays a string) are theirs. Every number in the prose comes from the build.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from datasets import DatasetInfo, Features, SplitDict, SplitInfo
from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCard, DatasetCardData
from huggingface_hub.repocard import REGEX_YAML_BLOCK

from builders.assembly.conversations import ConversationLayout
from builders.assembly.shards import SHARED_PREFIX, count_rows
from builders.built_folder import config_shards

SPLIT_ORDER = ("train", "validation", "test")


def config_files(out: Path, *patterns: str) -> dict[str, list[Path]]:
    """Shards per split matching any of `data/<split>/<pattern>`, splits in the usual order."""
    splits = sorted(
        (p.name for p in (out / "data").iterdir() if p.is_dir()), key=lambda s: (SPLIT_ORDER + (s,)).index(s)
    )
    found = {
        split: sorted({p for pattern in patterns for p in (out / "data" / split).glob(pattern)}) for split in splits
    }
    return {split: files for split, files in found.items() if files}


def config_entry(
    splits: list[str],
    patterns: list[str],
    checksums: dict[str, str],
    default: bool = False,
    filters: list | None = None,
) -> dict:
    """One `configs` entry: its globs per split (and Parquet filter), and a description naming the build's content.

    `datasets` caches a local folder under a hash of its card's YAML alone, not of the
    files; the shards' checksums in `description` make a rebuilt folder load afresh.
    """
    digest = hashlib.sha256("".join(sorted(checksums.values())).encode()).hexdigest()[:16]

    def paths(split):
        return [f"data/{split}/{p}" for p in patterns] if len(patterns) > 1 else f"data/{split}/{patterns[0]}"

    entry = {"data_files": [{"split": split, "path": paths(split)} for split in splits]}
    if filters is not None:
        entry["filters"] = filters
    entry["description"] = f"cxr-vqa build {digest}"
    if default:
        entry["default"] = True
    return entry


def build_configs(
    out: Path,
    filters: dict[str, list],
    features: Features,
    checksums: dict[str, str],
    sft: bool,
    conversations: ConversationLayout | None = None,
) -> tuple[dict, dict]:
    """`configs` and `dataset_info` of a build.

    Each config named in `filters` that has rows reads its own `<name>-*.parquet` shards or,
    when the build's shards are the shared `questions-*.parquet`, those with its filter
    (`filters[name]`, e.g. `[["question_type", "==", 3]]`). `default` reads every question
    shard (and `sft` the same rows, with `sft`), their files named explicitly so that other
    files (the conversation config's, `preview` added later) stay out. `conversations` is the
    build's one-conversation-per-image config (`builders.assembly.conversations`), read from
    its own `<config>-*.parquet` shards.
    """
    configs, infos = {}, {}
    shared = config_files(out, f"{SHARED_PREFIX}-*.parquet")
    patterns, typed = [], {}
    for name, name_filter in filters.items():
        prefix, config_filter = (SHARED_PREFIX, name_filter) if shared else (name, None)
        pattern = f"{prefix}-*.parquet"
        info = config_info(config_files(out, pattern), features, filters=config_filter)
        if not info.splits:
            continue
        patterns = sorted({*patterns, pattern})
        typed[name] = config_entry(list(info.splits), [pattern], checksums, filters=config_filter), info
    every = config_files(out, *patterns)
    configs["default"] = config_entry(list(every), patterns, checksums, default=True)
    infos["default"] = config_info(every, features)
    for name, (entry, info) in typed.items():
        configs[name], infos[name] = entry, info
    if sft:
        configs["sft"] = config_entry(list(every), patterns, checksums)
        infos["sft"] = config_info(every, features)
    if conversations is not None:
        pattern = f"{conversations.config}-*.parquet"
        info = config_info(config_files(out, pattern), conversations.features)
        if info.splits:
            configs[conversations.config] = config_entry(list(info.splits), [pattern], checksums)
            infos[conversations.config] = info
    return configs, infos


def config_info(
    files: dict[str, list[Path]], features: Features, description: str = "", filters: list | None = None
) -> DatasetInfo:
    """`dataset_info` of one config, counted from its shards (with its Parquet filter, if any); splits without rows left out."""
    splits = SplitDict()
    for split, paths in files.items():
        rows, size = count_rows(paths, filters)
        if rows:
            splits.add(SplitInfo(name=split, num_examples=rows, num_bytes=size))
    download = sum(p.stat().st_size for split in splits for p in files[split])
    return DatasetInfo(
        description=description,
        features=features,
        splits=splits,
        download_size=download,
        dataset_size=sum(s.num_bytes for s in splits.values()),
    )


def card_data(configs: dict[str, dict], infos: dict[str, DatasetInfo], **fields) -> DatasetCardData:
    """Card YAML for `configs` ({name: {"data_files": [...], ...}}) and their infos."""
    data = DatasetCardData(**fields)
    MetadataConfigs(configs).to_dataset_card_data(data)
    DatasetInfosDict(infos).to_dataset_card_data(data)
    return data


def release_facts(dataset: str) -> dict:
    """The source release of `dataset` as its card names it (`cards/<dataset>.yaml`): `release_card_data`'s
    name, licence, tags and gate."""
    import yaml

    facts = yaml.safe_load(resources.files("cards").joinpath(f"{dataset}.yaml").read_text(encoding="utf-8"))
    return {**facts, "licence": tuple(facts["licence"])}


def release_card_data(
    configs: dict[str, dict],
    infos: dict[str, DatasetInfo],
    *,
    name: str,
    synthetic: bool,
    licence: tuple[str, str],
    tags: list[str],
    rows: int,
    gated_prompt: str,
    gated_fields: dict[str, str],
) -> DatasetCardData:
    """Card YAML of a built dataset: a synthetic build is open (cc-by-4.0, tagged `synthetic`, no
    gate); a real one carries its source's licence (`licence`: name, link) and access gate."""
    licence_name, licence_link = licence
    return card_data(
        configs,
        infos,
        pretty_name=f"{name} (synthetic demo)" if synthetic else name,
        license="cc-by-4.0" if synthetic else "other",
        license_name=None if synthetic else licence_name,
        license_link=None if synthetic else licence_link,
        language=["en"],
        task_categories=["visual-question-answering"],
        tags=["medical", "chest-x-ray", "radiology", *tags] + (["synthetic"] if synthetic else []),
        size_categories=[size_category(rows)],
        extra_gated_prompt=None if synthetic else gated_prompt,
        extra_gated_fields=None if synthetic else gated_fields,
    )


def render_card(template: str, data: DatasetCardData, **context) -> str:
    """The card's text from `cards/<template>` (Jinja), with `data` as its YAML header.

    As `DatasetCard.from_template` renders it, without making the card object: that parses the
    YAML it has just written, and saving writes it again (a large header: configs, features).
    """
    import jinja2

    template_text = resources.files("cards").joinpath(template).read_text(encoding="utf-8")
    return jinja2.Template(template_text).render(card_data=data.to_yaml(), **{**data.to_dict(), **context})


def size_category(rows: int) -> str:
    for limit, name in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
    ):
        if rows < limit:
            return name
    return "10M<n<100M"


def load_card(folder: Path) -> DatasetCard:
    return DatasetCard.load(Path(folder) / "README.md")


def card_header(folder: Path) -> dict:
    """The card's YAML header, read with libyaml where PyYAML has it (`load_card` builds the whole card
    with the pure-Python parser: a large header takes a while)."""
    import yaml

    text = (Path(folder) / "README.md").read_text(encoding="utf-8")
    match = REGEX_YAML_BLOCK.search(text)
    header = yaml.load(match.group(2), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if match else None
    return header or {}


def declared_configs(folder: Path) -> list[str]:
    """The config names the card's YAML header declares."""
    return [config["config_name"] for config in card_header(folder).get("configs") or []]


def update_card(
    card: DatasetCard, configs: dict[str, dict] | None = None, infos: dict[str, DatasetInfo] | None = None, **fields
) -> None:
    """Merge configs, infos and top-level YAML fields (a value of None removes the field) into `card`."""
    if configs:
        MetadataConfigs(configs).to_dataset_card_data(card.data)
    if infos:
        DatasetInfosDict(infos).to_dataset_card_data(card.data)
    for key, value in fields.items():
        if value is None:
            card.data.pop(key, None)
        else:
            card.data[key] = value


def set_card_section(card: DatasetCard, key: str, markdown: str) -> None:
    """Put `markdown` in the card's prose between `<!-- cxr-vqa:key -->` markers, after the title block.

    Rerunning replaces the section instead of adding another; the markers are invisible on the Hub.
    """
    start, end = f"<!-- cxr-vqa:{key} -->", f"<!-- /cxr-vqa:{key} -->"
    section = f"{start}\n{markdown.strip()}\n{end}\n"
    text = card.text
    if start in text and end in text:
        before, rest = text.split(start, 1)
        card.text = before + section + rest.split(end, 1)[1].lstrip("\n")
        return
    lines = text.splitlines(keepends=True)
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), -1)
    after = next((i for i in range(title + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    card.text = "".join(lines[:after]) + section + "\n" + "".join(lines[after:])


def config_record(folder: Path, config: dict, info: DatasetInfo | None) -> dict:
    """What one config of a card reads, as the build report records it and `validate` compares it:
    its Parquet filter, and per split the files its patterns match (relative paths) and the rows the card counts."""
    counted = (info.splits or {}) if info is not None else {}
    splits = {}
    for split, paths in config_shards(folder, config).items():
        rows = counted[split].num_examples if split in counted else None
        splits[split] = {"files": [path.relative_to(folder).as_posix() for path in paths], "rows": rows}
    return {"filters": config.get("filters"), "splits": splits}


def configs_as_built(folder: Path) -> dict[str, dict]:
    """`config_record` of every config of the card in `folder` (read when the build, or `preview --add-config`,
    has just written it): the build report keeps it, so a card edited later is caught."""
    data = card_header(folder)
    infos = DatasetInfosDict.from_dataset_card_data(data)
    return {
        name: config_record(folder, config, infos.get(name))
        for name, config in MetadataConfigs.from_dataset_card_data(data).items()
    }
