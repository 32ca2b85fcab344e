"""`cxr-vqa validate`: is a built folder ready for the Hub and its dataset viewer?

Checked before any upload (`publish` runs it too). Each problem names the file and
the rule it breaks, so a failure reads as one line:

- `link`: the folder holds no symbolic link (file or folder), hidden entries aside, and no file the
  report lists is reached through one: every check then reads exactly the files `publish` uploads,
  never a folder that a glob enters and another walk does not. Nothing else is checked until they go.
- `parquet`: every shard is a readable Parquet file.
- `card`: README.md exists and its YAML parses into `configs` and `dataset_info`.
- `config-name`: names the viewer and `datasets` accept.
- `data-files`: every pattern of a config matches at least one shard on disk.
- `splits`: the splits the card counts are the splits on disk, with the same row counts.
- `features`: the card's features are the shards' features.
- `columns`: every file of a config has the same columns (name and type).
- `row-group-size`: a row group stays under the viewer's limit on what it reads at once.
- `shard-size`: a shard stays under the Hub's size guidance.
- `stray-file`: a Parquet file under `data/` that no config reads.
- `build-report`: `build_report.json` is there and parses: it is the list of what may be uploaded.
- `checksum`: every shard (and tool-added file, e.g. `preview.png`) `build_report.json` lists is
  there with the sha256 written with it (a shard edited or replaced after the build is caught).
- `unlisted-file`: a file in the folder that is neither the card, the report nor a file the report
  lists (an image or raw annotations copied in): `publish` uploads only what the build wrote and
  verified, and refuses a folder holding anything else rather than guess what it is. Hidden files
  (a name starting with `.`) are never uploaded and not checked.
- `data-files` also: a pattern outside `data/` (absolute, `..`), or matching a file the report does not list.
- `missing-config`: the card still declares every config the build made.
- `built-configs`: each config of the card reads the files (with the Parquet filter) and counts the
  rows that the report recorded for it when the build wrote the card (`config_files`); a config the
  build did not make is refused. A card edited to point one config at another's shards, with its row
  counts edited to match, passes every other rule (the shards and checksums are the build's own).
- `duplicate-id`: every row of the default config has its own `question_id`.
- `conversations`: a one-conversation-per-image config (`sft_per_image`, `sft_per_study`) asks every
  question of `sft` exactly once per split, each reply the same text (`builders.hub.conversation_rows`).
- `image-parts`: every row with `messages` holds one image part per image it shows (its `images`, or its
  one `image`): TRL pairs the stored parts with the images as they are (`builders.hub.image_parts`).
- `viewer-rows`: the viewer reads a config's data files as they are (no `filters`): their rows
  must be the rows `load_dataset(folder, config)` returns, compared by count and `question_id`.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features
from datasets.info import DatasetInfosDict
from datasets.naming import INVALID_WINDOWS_CHARACTERS_IN_PATH

from builders.assembly.card import config_record
from builders.assembly.shards import count_rows, sha256
from builders.built_folder import (
    CARD,
    PREVIEW_IMAGE,
    REPORT,
    card_configs,
    config_shards,
    default_config,
    inside_data,
    listed_files,
    read_report,
    require_built_folder,
    split_patterns,
)
from builders.hub.conversation_rows import split_problems
from builders.hub.image_parts import file_problem as image_parts_problem

ID_COLUMN = "question_id"

VIEWER_ROW_GROUP_BYTES = 300_000_000
"""The dataset viewer refuses to read a row group larger than this uncompressed (about 286 MiB)."""
HUB_SHARD_BYTES = 5 << 30
"""Keep each Parquet file to a few GB at most: the viewer and `datasets` stream it whole per worker."""
CONFIG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TOOL_FILES = (PREVIEW_IMAGE,)
"""Files beside the shards that a tool writes and records in the report (`preview --add-config`)."""


@dataclass(frozen=True)
class Problem:
    """One way the folder is not ready: the file at fault, the rule, what was found."""

    file: str
    rule: str
    detail: str

    def line(self) -> str:
        return f"{self.file}: [{self.rule}] {self.detail}"


def _rel(folder: Path, path: Path) -> str:
    return str(path.relative_to(folder))


def check_config_name(name: str) -> list[Problem]:
    bad = [c for c in INVALID_WINDOWS_CHARACTERS_IN_PATH if c in name]
    if bad or not CONFIG_NAME.match(name):
        return [
            Problem(
                "README.md",
                "config-name",
                f"config {name!r} is not a legal name (letters, digits, _ . -; up to 64; none of {INVALID_WINDOWS_CHARACTERS_IN_PATH})",
            )
        ]
    return []


def check_shard(folder: Path, path: Path) -> list[Problem]:
    problems = []
    meta = pq.ParquetFile(path).metadata
    for g in range(meta.num_row_groups):
        size = meta.row_group(g).total_byte_size
        if size > VIEWER_ROW_GROUP_BYTES:
            problems.append(
                Problem(
                    _rel(folder, path),
                    "row-group-size",
                    f"row group {g} is {size / 2**20:.0f} MiB uncompressed (viewer limit {VIEWER_ROW_GROUP_BYTES / 2**20:.0f} MiB)",
                )
            )
    size = path.stat().st_size
    if size > HUB_SHARD_BYTES:
        problems.append(
            Problem(
                _rel(folder, path),
                "shard-size",
                f"{size / 2**30:.1f} GiB (keep shards under {HUB_SHARD_BYTES / 2**30:.0f} GiB)",
            )
        )
    return problems


def unreadable(path: Path) -> str | None:
    try:
        pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        return str(err).splitlines()[0]
    return None


def check_config(folder: Path, name: str, config: dict, info, broken: set[Path] = frozenset()) -> list[Problem]:
    problems = []
    shards = {split: [p for p in paths if p not in broken] for split, paths in config_shards(folder, config).items()}
    for split, paths in shards.items():
        patterns = split_patterns(config)[split]
        outside = [p for p in patterns if not inside_data(p)]
        if outside:
            problems.append(
                Problem(CARD, "data-files", f"config {name!r} split {split!r}: {outside[0]!r} points outside data/")
            )
        elif not paths:
            problems.append(Problem(CARD, "data-files", f"config {name!r} split {split!r}: {patterns} match no file"))
    files = [p for paths in shards.values() for p in paths]
    if not files:
        return problems
    first = pq.read_schema(files[0])
    for path in files[1:]:
        schema = pq.read_schema(path)
        if schema.remove_metadata() != first.remove_metadata():
            diff = sorted(set(map(str, schema)) ^ set(map(str, first)))
            problems.append(
                Problem(
                    _rel(folder, path),
                    "columns",
                    f"config {name!r}: columns differ from {_rel(folder, files[0])} ({'; '.join(diff[:4])})",
                )
            )
    if info is None:
        problems.append(Problem("README.md", "splits", f"config {name!r} has no dataset_info entry"))
        return problems
    if info.features is not None:
        on_disk = Features.from_arrow_schema(first)
        if on_disk != info.features:
            names = sorted(set(on_disk) ^ set(info.features))
            retyped = [c for c in on_disk if c in info.features and on_disk[c] != info.features[c]]
            detail = f"columns on one side only: {names}" if names else f"types differ: {retyped}"
            problems.append(
                Problem(
                    _rel(folder, files[0]),
                    "features",
                    f"config {name!r}: card features differ from the shard's: {detail}",
                )
            )
    counted = set(info.splits or {})
    on_disk_splits = {s for s, paths in shards.items() if paths}
    if counted != on_disk_splits:
        problems.append(
            Problem(
                "README.md",
                "splits",
                f"config {name!r}: the card counts splits {sorted(counted)}, on disk {sorted(on_disk_splits)}",
            )
        )
    for split in counted & on_disk_splits:
        rows, _ = count_rows(shards[split], config.get("filters"))
        if info.splits[split].num_examples != rows:
            problems.append(
                Problem(
                    "README.md",
                    "splits",
                    f"config {name!r} split {split!r}: the card counts {info.splits[split].num_examples} rows, the shards hold {rows}",
                )
            )
    return problems


def _written_by_a_build(rel: str) -> bool:
    """Whether a path the report lists is one a build (or `preview --add-config`) writes: a report edited to list
    other files does not get them uploaded."""
    return rel in TOOL_FILES or (inside_data(rel) and rel.endswith(".parquet") and not any(c in rel for c in "*?["))


def linked_entries(folder: Path) -> list[str]:
    """Every symbolic link in the folder (file or folder; not entered), by relative path; hidden entries
    (a name starting with `.`, never uploaded) are left out."""
    found = []
    for top, subfolders, files in os.walk(folder):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        found += [
            Path(top, name).relative_to(folder).as_posix()
            for name in [*subfolders, *files]
            if not name.startswith(".") and Path(top, name).is_symlink()
        ]
    return sorted(found)


def reached_through_link(folder: Path, rel: str) -> str | None:
    """The first part of `rel` (itself included) that is a link under `folder`, or None."""
    path = Path(folder)
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            return path.relative_to(folder).as_posix()
    return None


def check_links(folder: Path) -> list[Problem]:
    """`link`: links in the folder, and listed files reached through one (a hidden folder's included)."""
    problems = [
        Problem(
            rel,
            "link",
            "a symbolic link: a build folder holds the files it wrote, not links to them; "
            "replace it with what it points to (or rebuild the folder)",
        )
        for rel in linked_entries(folder)
    ]
    try:
        listed = listed_files(read_report(folder)) if not (folder / REPORT).is_symlink() else {}
    except ValueError:
        listed = {}
    named = {p.file for p in problems}
    for rel in sorted({CARD, *listed}):
        link = reached_through_link(folder, rel)
        if link and link not in named:
            named.add(link)
            problems.append(Problem(link, "link", f"a symbolic link on the way to {rel}, which would be uploaded"))
    return problems


def check_listed(folder: Path, report: dict, configs: dict[str, dict]) -> list[Problem]:
    """Only the card, the report and the files it lists are in the folder, and the configs read only those."""
    allowed = {CARD, REPORT, *listed_files(report)}
    problems = [
        Problem(
            REPORT,
            "build-report",
            f"lists {rel!r}, which no build writes (shards are data/**.parquet; other files: {', '.join(TOOL_FILES)})",
        )
        for rel in sorted(listed_files(report))
        if not _written_by_a_build(rel)
    ]
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in PurePosixPath(rel).parts) or path.is_dir():
            continue
        if rel not in allowed:
            problems.append(
                Problem(
                    rel,
                    "unlisted-file",
                    f"not written by the build ({REPORT} does not list it): "
                    "move it out of the folder; publish uploads only what the build wrote",
                )
            )
    for name, config in configs.items():
        for split, patterns in split_patterns(config).items():
            for pattern in filter(inside_data, patterns):  # the others: `check_config`
                for path in sorted(folder.glob(pattern)):
                    if path.is_file() and _rel(folder, path) not in allowed:
                        problems.append(
                            Problem(
                                CARD,
                                "data-files",
                                f"config {name!r} split {split!r}: {pattern!r} reads "
                                f"{_rel(folder, path)}, which {REPORT} does not list",
                            )
                        )
    return problems


def check_configs_as_built(
    folder: Path, report: dict, configs: dict[str, dict], infos: DatasetInfosDict
) -> list[Problem]:
    """`built-configs`: each config of the card reads the files, with the filter, and counts the rows the build
    recorded for it (`config_files`): a card pointed at another config's shards, with its counts edited to
    match, is caught here, since its shards and checksums are all the build's own."""
    recorded = report.get("config_files")
    if not isinstance(recorded, dict) or not recorded:
        return [
            Problem(
                REPORT,
                "built-configs",
                "records no `config_files` (which files each config reads, its rows): "
                "written by an older cxr-vqa; rebuild the folder",
            )
        ]
    problems = []
    for name, config in configs.items():
        built = recorded.get(name)
        if not isinstance(built, dict):
            problems.append(
                Problem(
                    CARD,
                    "built-configs",
                    f"config {name!r} was not made by the build ({REPORT} records no such config)",
                )
            )
            continue
        now = config_record(folder, config, infos.get(name))
        if now["filters"] != built.get("filters"):
            problems.append(
                Problem(
                    CARD,
                    "built-configs",
                    f"config {name!r}: filters {now['filters']!r}, the build wrote {built.get('filters')!r}",
                )
            )
        splits = built.get("splits") if isinstance(built.get("splits"), dict) else {}
        for split in sorted(set(now["splits"]) | set(splits)):
            read, wrote = now["splits"].get(split, {}), splits.get(split) or {}
            if read.get("files") != wrote.get("files"):
                files, expected = read.get("files", []), wrote.get("files", [])
                differ = sorted(set(files) ^ set(expected))
                problems.append(
                    Problem(
                        CARD,
                        "built-configs",
                        f"config {name!r} split {split!r}: reads {len(files)} file(s), the build "
                        f"made it read {len(expected)} ({'; '.join(differ[:2]) or 'another order'} differ)",
                    )
                )
            elif read.get("rows") != wrote.get("rows"):
                problems.append(
                    Problem(
                        CARD,
                        "built-configs",
                        f"config {name!r} split {split!r}: the card counts {read.get('rows')} rows, "
                        f"the build counted {wrote.get('rows')}",
                    )
                )
    return problems


def check_build_report(folder: Path, configs: dict[str, dict], infos: DatasetInfosDict | None = None) -> list[Problem]:
    """The folder against what its build wrote down: the files it lists, their checksums and the card's configs
    (each with the files it reads and its rows)."""
    try:
        report = read_report(folder)
    except ValueError as err:
        return [Problem(REPORT, "build-report", str(err))]
    problems = check_listed(folder, report, configs)
    listed = listed_files(report)
    shards = {rel: checksum for rel, checksum in listed.items() if (folder / rel).is_file()}
    for rel in sorted(set(listed) - set(shards)):
        problems.append(Problem(rel, "checksum", f"listed in {REPORT} but missing"))
    with ThreadPoolExecutor(4) as pool:
        found = dict(zip(shards, pool.map(lambda rel: sha256(folder / rel), shards)))
    for rel in sorted(shards):
        if found[rel] != shards[rel]:
            problems.append(
                Problem(
                    rel,
                    "checksum",
                    f"sha256 {found[rel][:12]}... is not the {shards[rel][:12]}... "
                    f"in {REPORT}: changed after the build",
                )
            )
    built = report.get("configs") or sorted({key.split("/", 1)[1] for key in report.get("rows", {})})
    for name in built:
        if name not in configs:
            problems.append(
                Problem("README.md", "missing-config", f"the build made config {name!r}; the card does not declare it")
            )
    return problems + check_configs_as_built(
        folder, report, configs, infos if infos is not None else DatasetInfosDict()
    )


def check_viewer_rows(folder: Path, name: str, config: dict) -> list[Problem]:
    """The rows the viewer shows for a config (its files read whole with pyarrow) against `load_dataset`'s.

    `load_dataset` streams only the id column, so this reads no image and writes no cache. It is
    called once for the config's splits together: each call parses the card again.
    """
    from datasets import load_dataset

    problems = []
    hint = (
        "; the config uses `filters`, which the viewer ignores: build with --shard-layout by-config"
        if config.get("filters")
        else ""
    )
    shards = {split: paths for split, paths in config_shards(folder, config).items() if paths}
    if not shards:
        return problems
    names = pq.read_schema(next(iter(shards.values()))[0]).names
    column = ID_COLUMN if ID_COLUMN in names else names[0]
    try:
        loaded, failure = load_dataset(str(folder), name, streaming=True, columns=[column]), None
    except Exception as err:  # noqa: BLE001 - whatever datasets raises for a config it cannot read
        loaded, failure = {}, err
    for split, paths in shards.items():
        viewer = [value for path in paths for value in pq.read_table(path, columns=[column]).column(column).to_pylist()]
        try:
            if failure is not None:
                raise failure
            if split not in loaded:
                raise ValueError(f"it returns the splits {sorted(loaded)}")
            returned = [row[column] for row in loaded[split]]
        except Exception as err:  # noqa: BLE001 - whatever datasets raises for a config it cannot read
            problems.append(
                Problem(
                    _rel(folder, paths[0]), "viewer-rows", f"config {name!r} split {split!r}: load_dataset fails: {err}"
                )
            )
            continue
        if sorted(map(str, viewer)) != sorted(map(str, returned)):
            extra = next((v for v in viewer if v not in set(returned)), None)
            problems.append(
                Problem(
                    _rel(folder, paths[0]),
                    "viewer-rows",
                    f"config {name!r} split {split!r}: the viewer shows the files' {len(viewer)} rows, load_dataset returns {len(returned)}"
                    + (f" (e.g. {column} {extra!r} only in the viewer)" if extra is not None else "")
                    + hint,
                )
            )
    return problems


def check_unique_ids(
    folder: Path, configs: dict[str, dict], broken: set[Path] = frozenset(), shown: int = 10
) -> list[Problem]:
    """Every row of the default config (all rows, each once) has its own `question_id`: predictions are matched by it.

    The first `shown` repeats are named one by one, the rest counted.
    """
    paths = [
        p for ps in config_shards(folder, configs[default_config(configs)]).values() for p in ps if p not in broken
    ]
    seen: dict[str, Path] = {}
    problems, repeats = [], 0
    for path in paths:
        try:
            ids = (
                pq.read_table(path, columns=[ID_COLUMN]).column(ID_COLUMN).to_pylist()
                if ID_COLUMN in pq.read_schema(path).names
                else []
            )
        except (pa.ArrowException, OSError):  # damaged pages: the checksum check names the file
            continue
        for question_id in ids:
            if question_id not in seen:
                seen[question_id] = path
                continue
            repeats += 1
            if repeats <= shown:
                problems.append(
                    Problem(
                        _rel(folder, path),
                        "duplicate-id",
                        f"{ID_COLUMN} {question_id!r} is also a row of {_rel(folder, seen[question_id])}",
                    )
                )
    if repeats > shown:
        problems.append(Problem("data", "duplicate-id", f"{repeats - shown} more rows repeat a {ID_COLUMN}"))
    return problems


def check_conversations(folder: Path, configs: dict[str, dict]) -> list[Problem]:
    """Each config whose shards carry `question_ids` against the `sft` config, split by split."""
    if "sft" not in configs:
        return []
    asked = config_shards(folder, configs["sft"])
    problems = []
    for name, config in configs.items():
        shards = {split: paths for split, paths in config_shards(folder, config).items() if paths}
        if not shards or "question_ids" not in pq.read_schema(next(iter(shards.values()))[0]).names:
            continue
        for split, paths in shards.items():
            problems += [
                Problem(_rel(folder, paths[0]), "conversations", detail)
                for detail in split_problems(name, split, paths, asked.get(split, []))
            ]
    return problems


FolderState = tuple[str, tuple[tuple[str, int, int, int, int], ...]]
_problems_of: dict[FolderState, list[Problem]] = {}
"""`validate`'s answers in this process, by the state of the folder they were found in."""


def folder_state(folder: Path) -> FolderState:
    """The folder's resolved path and every entry under it (links not followed, hidden ones too) with its
    type, size, inode and status-change time (set by every write, rename or `chmod`, and never set back by
    `touch`): any file written, replaced, added, removed or linked changes it."""
    entries = []
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            entries.append((os.path.relpath(path, folder), st.st_mode, st.st_size, st.st_ctime_ns, st.st_ino))
    return str(folder.resolve()), tuple(sorted(entries))


def validate(folder: Path) -> list[Problem]:
    """Every viewer-readiness problem of a built dataset folder; empty when it is ready.

    Reading every config's rows back takes seconds: a folder validated before in this process
    (`publish` plans it again, a notebook re-runs a cell) is answered from the first check
    while nothing under it has changed (`folder_state`).
    """
    folder = require_built_folder(folder)
    state = folder_state(folder)
    if state not in _problems_of:
        _problems_of[state] = _validate(folder)
    return list(_problems_of[state])


def _validate(folder: Path) -> list[Problem]:
    if links := check_links(folder):
        return links
    try:
        configs, infos = card_configs(folder)
    except ValueError as err:
        return [Problem("README.md", "card", str(err))]
    problems, broken = [], set()
    for path in sorted((folder / "data").rglob("*.parquet")) if (folder / "data").is_dir() else []:
        if reason := unreadable(path):
            problems.append(Problem(_rel(folder, path), "parquet", f"not a readable Parquet file: {reason}"))
            broken.add(path)
    read: set[Path] = set()
    for name, config in configs.items():
        problems += check_config_name(name)
        problems += check_config(folder, name, config, infos.get(name), broken)
        read |= {p for paths in config_shards(folder, config).values() for p in paths}
    for path in sorted(read - broken):
        problems += check_shard(folder, path)
        if detail := image_parts_problem(path):
            problems.append(Problem(_rel(folder, path), "image-parts", detail))
    for path in sorted((folder / "data").rglob("*.parquet")) if (folder / "data").is_dir() else []:
        if path not in read:
            problems.append(Problem(_rel(folder, path), "stray-file", "no config of the card reads this file"))
    problems += check_build_report(folder, configs, infos)
    problems += check_unique_ids(folder, configs, broken)
    if not problems:  # reading rows needs sound files and card; otherwise the problems above say why
        problems += check_conversations(folder, configs)
    if not problems:
        for name, config in configs.items():
            problems += check_viewer_rows(folder, name, config)
    return problems


def check_ready(folder: Path) -> None:
    """Raise ValueError with the first problem (and how many more) unless the folder is viewer-ready."""
    problems = validate(folder)
    if problems:
        more = f" (and {len(problems) - 1} more; run `cxr-vqa validate {folder}`)" if len(problems) > 1 else ""
        raise ValueError(f"not ready for the Hub: {problems[0].line()}{more}")
