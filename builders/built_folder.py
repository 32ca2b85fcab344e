"""A built dataset folder, read: the card's configs and the one `load_dataset(folder)` reads, each config's
splits and shards, the build report, and the dataset it holds.

`evaluate`, `convert`, `preview`, `validate` and `publish` read a folder through these alone;
the card's writer (`builders.assembly.card`) reads back what it wrote through them too.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCard

CARD = "README.md"
REPORT = "build_report.json"
PREVIEW_IMAGE = "preview.png"
"""The picture `preview --add-config` writes beside the shards (the report lists it with them)."""


def require_built_folder(folder: Path) -> Path:
    """`folder` when it is a folder; otherwise a one-line ValueError saying what to name instead."""
    folder = Path(folder)
    if not folder.exists():
        raise ValueError(f"{folder}: no such folder; name the folder a build wrote (the --out of `cxr-vqa build`)")
    if not folder.is_dir():
        raise ValueError(
            f"{folder}: a file, not a built dataset folder; name the folder a build wrote (the --out of `cxr-vqa build`)"
        )
    return folder


def built_dataset(folder: Path) -> str | None:
    """The dataset a build report names (`gemex`, `rexvqa`); None without a readable report."""
    try:
        report = json.loads((Path(folder) / REPORT).read_text())
    except (OSError, ValueError):
        return None
    return report.get("dataset") if isinstance(report, dict) else None


def read_report(folder: Path) -> dict:
    """The folder's `build_report.json`; ValueError (one line) when it is missing or unusable."""
    path = folder / REPORT
    if not path.is_file():
        raise ValueError(
            f"no {REPORT}: nothing says which files the build wrote and their checksums (rebuild the folder)"
        )
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"{REPORT} does not parse as JSON: {err}") from None
    listed = {**report.get("shards", {}), **report.get("files", {})} if isinstance(report, dict) else None
    if not isinstance(listed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in listed.items()):
        raise ValueError(f"{REPORT} has no usable `shards` map (relative path -> sha256)")
    return report


def listed_files(report: dict) -> dict[str, str]:
    """{relative path: sha256} of every data file the build (or `preview --add-config`) wrote: what may be uploaded."""
    return {**report.get("shards", {}), **report.get("files", {})}


def card_configs(folder: Path) -> tuple[dict[str, dict], DatasetInfosDict]:
    """The card's configs ({name: {"data_files": [...]}}) and infos; raises ValueError if the card is unusable."""
    readme = require_built_folder(folder) / CARD
    if not readme.exists():
        raise ValueError(f"no {CARD} (the card)")
    try:
        data = DatasetCard.load(readme).data
    except Exception as err:  # the card parser raises several types for bad YAML
        raise ValueError(f"the YAML header does not parse: {err}") from err
    configs = MetadataConfigs.from_dataset_card_data(data)
    if not configs:
        raise ValueError("the YAML header declares no `configs`")
    return dict(configs), DatasetInfosDict.from_dataset_card_data(data)


class UsageError(ValueError):
    """A mistake in the command line, as argparse's are (exit 2)."""


class UnknownConfig(UsageError):
    """A config name the card does not declare."""


def refuse_out_inside(folder: Path, out: Path) -> None:
    """UsageError when `out` is the build `folder` or lies inside it, which would then no longer validate."""
    if Path(out).resolve().is_relative_to(Path(folder).resolve()):
        raise UsageError(f"--out {out}: inside the build {folder} it reads; choose an --out outside it")


def named_config(folder: Path, configs: dict[str, dict], name: str) -> dict:
    """The card's config `name`; UnknownConfig naming the folder and the configs it has otherwise."""
    if name not in configs:
        raise UnknownConfig(f"{folder}: no config {name!r} in the card (configs: {', '.join(configs)})")
    return configs[name]


def default_config(configs: dict[str, dict]) -> str:
    """The config `load_dataset(folder)` reads: the one marked default, else `default`, else the first."""
    return next(
        (name for name, c in configs.items() if c.get("default")),
        "default" if "default" in configs else next(iter(configs)),
    )


def default_shards(folder: Path, configs: dict[str, dict] | None = None) -> dict[str, list[Path]]:
    """{split: shards} of the config `load_dataset(folder)` reads (of `configs`, the card's unless given)."""
    configs = card_configs(folder)[0] if configs is None else configs
    return config_shards(Path(folder), configs[default_config(configs)])


def split_patterns(config: dict) -> dict[str, list[str]]:
    """{split: [glob, ...]} of one config's `data_files` (every form MetadataConfigs accepts)."""
    data_files = config.get("data_files", [])
    if isinstance(data_files, (str, list)) and (
        isinstance(data_files, str) or all(isinstance(d, str) for d in data_files)
    ):
        return {"train": [data_files] if isinstance(data_files, str) else list(data_files)}
    if isinstance(data_files, dict):
        data_files = [{"split": k, "path": v} for k, v in data_files.items()]
    out: dict[str, list[str]] = {}
    for entry in data_files:
        paths = entry["path"]
        out.setdefault(entry.get("split", "train"), []).extend([paths] if isinstance(paths, str) else paths)
    return out


def config_shards(folder: Path, config: dict) -> dict[str, list[Path]]:
    """{split: shards on disk} of one config, in path order; a pattern matching nothing gives an empty list,
    and one outside `data/` (`validate` reports it) is never followed out of the folder."""
    found = {}
    for split, patterns in split_patterns(config).items():
        paths = {p for pattern in patterns if inside_data(pattern) for p in folder.glob(pattern) if p.is_file()}
        found[split] = sorted(paths)
    return found


def inside_data(pattern: str) -> bool:
    """Whether a card's `data_files` pattern stays under the folder's `data/`."""
    parts = PurePosixPath(pattern).parts
    return len(parts) > 1 and parts[0] == "data" and ".." not in parts and "\\" not in pattern
