"""`cxr-vqa publish`: a built folder to a Hub dataset repo, with its card, under access rules.

GEMeX quotes MIMIC-CXR and uses its images; ReXVQA's images are ReXGradient-160K: a wrong
flag must never make either public. So the plan is made, and refused, before anything
touches the Hub:

- a build that carries images or report text (an `image`/`images` column, a non-null
  `report`/`findings`/`impression` column, a rendered `preview.png`) goes only to a private
  or gated repo;
- a gated repo gets the card's gating fields (`extra_gated_prompt`, `extra_gated_fields`
  asking for the credential and the agreement) and manual approval of every request;
- `--public` takes only a build made with `--image-mode none`, carrying neither, whose card
  names the licence its annotations are under (and not a credentialed-access one), and only
  with `--confirm-public`;
- a ReXVQA build of real data never goes public, whatever its columns: ReXGradient-160K is
  gated, and its ids, indications and explanations are its content too;
- a GEMeX build of real data whose `question` or `reason` text is present (derived from
  MIMIC-CXR reports) goes public only when the user names, with `--text-licence NAME`, a
  licence that allows it; the card then declares that licence;
- a synthetic build holds no patient data: it may go public, images included, with
  `--confirm-public`. Synthetic is read from the shards alone: every shard must carry the
  provenance stamp the build wrote from the generator's marks, matching its rows and text
  (`builders.provenance.verify_shard`); the card's tags and licence are never trusted;
- a `--image-mode reference` build is never uploaded: its image column holds paths to files
  on the builder's machine (read from the report's settings and from the shards themselves).

The folder must also pass `validate`, which requires `build_report.json` and refuses a folder
holding any file the report does not list, any symbolic link, or a card whose configs read other
files or count other rows than the build recorded. What is uploaded is exactly the card, the
report and the files it lists with their sha256 (`planned_files`, which refuses a path through a
link too), never a listing of the folder; the access rules above read exactly those shards. What goes
up is byte for byte what was checked: every file is opened and hashed against the checked sha256
before the first commit, and the commits read from those handles (`opened_uploads`), so a rebuild
into the same folder during the upload sends nothing of the new build. Uploading
is `HfApi.create_repo` and one `HfApi.create_commit` per config's shard set, then one with the
card and report (`upload_groups`); before the
upload the repo's actual visibility is read back, since `create_repo(exist_ok=True)` leaves
an existing repo's visibility as it was. The token comes from `huggingface_hub`'s usual
places (`HF_TOKEN`, the saved login) and is never printed.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from huggingface_hub import CommitOperationAdd, HfApi, get_token

from builders.assembly.card import load_card, update_card
from builders.assembly.shards import count_rows, sha256
from builders.built_folder import (
    CARD,
    PREVIEW_IMAGE,
    REPORT,
    card_configs,
    config_shards,
    listed_files,
    read_report,
)
from builders.files import write_text
from builders.hub.validate import check_ready, reached_through_link
from builders.provenance import folder_synthetic

Visibility = Literal["private", "gated", "public"]
IMAGE_COLUMNS = ("image", "images")
REPORT_COLUMNS = ("report", "findings", "impression")
MIMIC_TEXT_COLUMNS = ("question", "reason")
"""GEMeX text written from MIMIC-CXR reports: credentialed unless the user names a licence that allows it."""
CREDENTIALED_LICENCE_WORDS = ("physionet", "credentialed")
PUBLIC_TEXT_LICENCES = (
    "cc-by-4.0",
    "cc-by-sa-4.0",
    "cc0-1.0",
    "odc-by",
    "pddl",
    "cdla-permissive-2.0",
    "apache-2.0",
    "mit",
)
"""`--text-licence` takes only these Hub licence ids (any case): each allows anyone to redistribute the text.
Non-commercial and no-derivatives licences are left out (a public repo cannot enforce them),
and so is any free-text name: a data use agreement is not a licence to publish."""
SHARD_NAME = re.compile(r"data/[^/]+/(?P<prefix>.+)-\d{5}-of-\d{5}\.parquet")
Gating = tuple[str, dict[str, str]]
"""A dataset's gating prompt and the fields its access form asks for (`extra_gated_prompt`, `extra_gated_fields`)."""


class PublishRefused(ValueError):
    """The plan breaks an access rule; the message is the one line the CLI prints."""


@dataclass
class BuildFacts:
    """What the access rules need to know about a built folder."""

    dataset: str
    image_mode: str | None
    synthetic: bool
    licence: str | None
    licence_declared: bool
    credentialed_licence: bool
    carries: list[str] = field(default_factory=list)
    mimic_text: list[str] = field(default_factory=list)
    gated_prompt: str | None = None
    gated_fields: dict | None = None


def uploaded_names(folder: Path) -> list[str]:
    """What `publish` uploads, by relative path: the card, the report and every file the report lists."""
    return sorted({CARD, REPORT, *listed_files(read_report(folder))})


def shard_paths(folder: Path) -> list[Path]:
    """The Parquet files the access rules inspect: exactly those uploaded (`uploaded_names`). A folder without
    a usable report uploads nothing and is refused; its rules then read every Parquet file under `data/`."""
    try:
        return [folder / name for name in uploaded_names(folder) if name.endswith(".parquet")]
    except ValueError:
        return sorted(
            Path(top, name) for top, _, files in os.walk(folder / "data") for name in files if name.endswith(".parquet")
        )


def shard_dataset(folder: Path) -> str | None:
    """Which dataset the shards' own columns say they hold (the build report can be edited away)."""
    for path in shard_paths(folder):
        names = set(pq.read_schema(path).names)
        if {"options", "task_name"} <= names:
            return "rexvqa"
        if {"question_type", "reason"} <= names:
            return "gemex"
    return None


def filled_columns(folder: Path, columns: tuple[str, ...]) -> list[str]:
    """Which of `columns` hold a non-null value in some shard."""
    found = []
    for path in shard_paths(folder):
        names = pq.read_schema(path).names
        for column in (c for c in columns if c in names and c not in found):
            values = pq.read_table(path, columns=[column])[column]
            if values.null_count < len(values):
                found.append(column)
    return found


def carried_content(folder: Path) -> list[str]:
    """Images and report text the folder's files hold, each named with where it was found."""
    where: dict[tuple[str, str], list[str]] = {}
    for path in shard_paths(folder):
        names = pq.read_schema(path).names
        rel = str(path.relative_to(folder))
        for column in (c for c in IMAGE_COLUMNS if c in names):
            where.setdefault(("images", column), []).append(rel)
        for column in (c for c in REPORT_COLUMNS if c in names):
            values = pq.read_table(path, columns=[column])[column]
            if values.null_count < len(values):
                where.setdefault(("report text", column), []).append(rel)
    found = [
        f"{what} ({column!r} column in {len(files)} file(s), e.g. {files[0]})"
        for (what, column), files in where.items()
    ]
    if (folder / PREVIEW_IMAGE).exists() or PREVIEW_IMAGE in _uploaded_or_none(folder):
        found.append(f"rendered images ({PREVIEW_IMAGE})")
    return found


def _uploaded_or_none(folder: Path) -> list[str]:
    try:
        return uploaded_names(folder)
    except ValueError:
        return []


def holds_local_paths(folder: Path) -> bool:
    """Whether some shard's image cells hold a file path and no bytes: a `reference` build, whatever its report says."""
    for path in shard_paths(folder):
        schema = pq.read_schema(path)
        for column in (c for c in IMAGE_COLUMNS if c in schema.names):
            cells = pq.read_table(path, columns=[column])[column].combine_chunks()
            while pa.types.is_list(cells.type) or pa.types.is_large_list(cells.type):
                cells = cells.flatten()
            if pa.types.is_string(cells.type) or pa.types.is_large_string(cells.type):
                return cells.null_count < len(cells)
            if pa.types.is_struct(cells.type) and {"bytes", "path"} <= {f.name for f in cells.type}:
                paths, data = cells.field("path"), cells.field("bytes")
                if pc.any(pc.and_(pc.is_valid(paths), pc.is_null(data))).as_py():
                    return True
    return False


def inspect_build(folder: Path) -> BuildFacts:
    import json

    folder = Path(folder)
    report_path = folder / REPORT
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else {}
    image_mode = report.get("settings", {}).get("image_mode")
    if image_mode != "none" and holds_local_paths(folder):
        image_mode = "reference"
    data = load_card(folder).data
    licence, name, link = data.get("license"), data.get("license_name"), data.get("license_link")
    licence = licence[0] if isinstance(licence, list) and licence else licence
    described = " ".join(str(v) for v in (licence, name, link) if v).lower()
    dataset = shard_dataset(folder) or report.get("dataset", "unknown")
    return BuildFacts(
        dataset=dataset,
        image_mode=image_mode,
        synthetic=folder_synthetic(folder, shard_paths(folder)),
        licence=name or licence,
        licence_declared=bool(licence) and (licence != "other" or bool(name or link)),
        credentialed_licence=is_credentialed(described),
        carries=carried_content(folder),
        mimic_text=filled_columns(folder, MIMIC_TEXT_COLUMNS) if dataset == "gemex" else [],
        gated_prompt=data.get("extra_gated_prompt"),
        gated_fields=data.get("extra_gated_fields"),
    )


def is_credentialed(licence: str) -> bool:
    return any(word in licence.lower() for word in CREDENTIALED_LICENCE_WORDS)


def access_refusal(
    facts: BuildFacts,
    visibility: Visibility,
    confirm_public: bool = False,
    text_licence: str | None = None,
    gating: Mapping[str, Gating] | None = None,
) -> str | None:
    """Why this build may not go to a repo of this visibility (one line), or None if it may.

    `gating` holds each dataset's own gating, for a card built without it (a synthetic build's)."""
    if facts.image_mode is None:
        return f"no {REPORT} says how this folder was built (image mode, checksums): rebuild it; nothing is uploaded"
    if facts.image_mode == "reference":
        return (
            "built with --image-mode reference: its image column holds paths to files on this machine; "
            "rebuild with --image-mode embed (private or gated repo) or none"
        )
    if visibility == "public":
        if not facts.synthetic:
            if facts.dataset == "rexvqa":
                return (
                    "--public refused: ReXVQA builds of real data carry ReXGradient-160K content (gated on the Hub under its "
                    "research licence), whatever their columns; publish with --gated"
                )
            if facts.image_mode != "none":
                return (
                    f"--public takes only a build made with --image-mode none (this one: {facts.image_mode or 'unknown, no build_report.json'}); "
                    "publish it with --private or --gated"
                )
            if facts.carries:
                return f"--public refused: the build carries {facts.carries[0]}, credentialed content; publish it with --private or --gated"
            if facts.mimic_text and not text_licence:
                return (
                    f"--public refused: the {' and '.join(facts.mimic_text)} text is derived from MIMIC-CXR reports (credentialed access); "
                    "publish with --gated, or, if a licence truly allows publishing this text, name it with --text-licence NAME"
                )
            if text_licence and is_credentialed(text_licence):
                return f"--public refused: --text-licence {text_licence} allows credentialed access only; publish with --gated"
            if text_licence and text_licence.strip().lower() not in PUBLIC_TEXT_LICENCES:
                return (
                    f"--public refused: --text-licence {text_licence!r} is not one of the licences that allow public "
                    f"redistribution: {', '.join(PUBLIC_TEXT_LICENCES)}; publish with --gated"
                )
            if not text_licence and not facts.licence_declared:
                return "--public refused: the card does not say which licence the annotations are under (license, or license_name for 'other')"
            if not text_licence and facts.credentialed_licence:
                return f"--public refused: the annotations are under {facts.licence}, which allows credentialed access only; publish with --gated"
        if not confirm_public:
            what = "synthetic demo data" if facts.synthetic else f"annotations under {text_licence or facts.licence}"
            return f"--public needs --confirm-public: anyone will be able to download this build ({what})"
    if (
        visibility == "gated"
        and not (facts.gated_prompt and facts.gated_fields)
        and facts.dataset not in (gating or {})
    ):
        return f"--gated refused: the card has no extra_gated_prompt/extra_gated_fields and none are known for {facts.dataset!r}"
    return None


@dataclass
class PublishPlan:
    folder: Path
    repo_id: str
    visibility: Visibility
    revision: str
    files: list[tuple[str, int]]
    facts: BuildFacts
    configs: dict[str, dict[str, int]]
    card_fields: dict = field(default_factory=dict)
    """YAML fields publishing writes into the card before the upload (the gating fields)."""
    digests: dict[str, str] = field(default_factory=dict)
    """The sha256 of each planned file as checked (`checked_digests`): what `publish` sends must hash to it."""

    def lines(self) -> list[str]:
        f = self.facts
        total = sum(size for _, size in self.files)
        out = [
            f"repo: datasets/{self.repo_id} (revision {self.revision})",
            f"access: {self.visibility}" + (", requests approved by hand" if self.visibility == "gated" else ""),
            f"build: {f.dataset}, image mode {f.image_mode}, {'synthetic' if f.synthetic else 'real data'}",
            f"card: licence {self.card_fields.get('license_name') or f.licence or 'not declared'}"
            + (" [set by --text-licence]" if "license_name" in self.card_fields else "")
            + f"; carries {', '.join(f.carries) if f.carries else 'no images or report text'}",
        ]
        if self.visibility == "gated":
            prompt = self.card_fields.get("extra_gated_prompt", f.gated_prompt)
            fields = self.card_fields.get("extra_gated_fields", f.gated_fields) or {}
            out.append(
                f"gating: {len(fields)} fields ({'; '.join(fields)}); prompt: {prompt}"
                + (" [added to the card]" if self.card_fields else "")
            )
        for name, splits in self.configs.items():
            out.append(f"config {name}: " + ", ".join(f"{s} {n} rows" for s, n in splits.items()))
        out.append(
            f"files: {len(self.files)}, {_size(total)}, in {len(upload_groups(self.files))} commits (one per shard set, then the card)"
        )
        out += [f"  {path}  {_size(size)}" for path, size in self.files]
        out.append("token: " + ("found" if get_token() else "none found (set HF_TOKEN or run `hf auth login`)"))
        return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def planned_files(folder: Path) -> list[tuple[str, int]]:
    """The files to upload (relative path, size): the card, the report and every file the report lists,
    nothing else from the folder (`validate` has checked their checksums and that nothing else is there)."""
    names = uploaded_names(folder)
    for name in names:
        if link := reached_through_link(folder, name):
            raise PublishRefused(
                f"{folder / link} is a symbolic link: publish uploads the files a build wrote, never "
                "what a link points to; nothing is uploaded"
            )
    return [(name, (folder / name).stat().st_size) for name in names]


def upload_groups(files: list[tuple[str, int]]) -> list[list[str]]:
    """The planned files in the order and commits `publish` uploads them: one commit per config's
    shard set (`data/*/<config>-*.parquet`), the largest first, then the rest (card, report, preview image).

    The Hub stores files through Xet, which deduplicates content-defined chunks against what
    earlier uploads stored but not among the files of one upload (measured with `hf_xet` into a
    local store, `benchmarks/hub_benchmark.py`). Each config's files hold the images of its rows,
    so the first shard set stores them and later ones mostly reference them. The card goes
    last, so its configs name only files already in the repo.
    """
    sizes = dict(files)
    shard_sets: dict[str, list[str]] = {}
    rest = []
    for path, _ in files:
        if match := SHARD_NAME.fullmatch(path):
            shard_sets.setdefault(match["prefix"], []).append(path)
        else:
            rest.append(path)
    ordered = sorted(shard_sets.values(), key=lambda paths: -sum(sizes[p] for p in paths))
    return ordered + ([rest] if rest else [])


def plan_publish(
    folder: Path,
    repo_id: str,
    visibility: Visibility = "private",
    revision: str | None = None,
    confirm_public: bool = False,
    text_licence: str | None = None,
    gating: Mapping[str, Gating] | None = None,
) -> PublishPlan:
    """The upload, checked against the access rules and viewer readiness; raises PublishRefused.

    `gating` holds each dataset's own gating prompt and fields, written into a card that has none."""
    folder = Path(folder)
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PublishRefused(f"--repo {repo_id!r}: expected ORG/NAME")
    check_ready(folder)
    facts = inspect_build(folder)
    refusal = access_refusal(facts, visibility, confirm_public, text_licence, gating)
    if refusal:
        raise PublishRefused(refusal)
    card_fields = {}
    if visibility == "public" and text_licence and not facts.synthetic:
        card_fields = {"license": "other", "license_name": text_licence, "license_link": None}
    if visibility == "gated" and not (facts.gated_prompt and facts.gated_fields):
        prompt, fields = gating[facts.dataset]
        card_fields = {"extra_gated_prompt": prompt, "extra_gated_fields": fields}
    configs, _ = card_configs(folder)
    counts = {
        name: {
            split: count_rows(paths, config.get("filters"))[0] for split, paths in config_shards(folder, config).items()
        }
        for name, config in configs.items()
    }
    files = planned_files(folder)
    return PublishPlan(
        folder,
        repo_id,
        visibility,
        revision or "main",
        files,
        facts,
        counts,
        card_fields,
        checked_digests(folder, files),
    )


def checked_digests(folder: Path, files: list[tuple[str, int]]) -> dict[str, str]:
    """The sha256 of each planned file: the report's for the files it lists (`check_ready` has just
    compared them with the bytes), the file's own for the card and the report."""
    listed = listed_files(read_report(folder))
    return {name: listed.get(name) or sha256(folder / name) for name, _ in files}


@contextlib.contextmanager
def opened_uploads(plan: PublishPlan) -> Iterator[dict[str, tuple[CommitOperationAdd, os.stat_result]]]:
    """Each planned file opened once, before anything goes up, and hashed from that handle against the
    plan's checked sha256 (a difference stops the upload before its first commit). The commits read
    from these handles: a folder replaced after the check (`build --overwrite` renames a new build into
    place) changes nothing that goes up, and a file rewritten in place shows in its size or
    modification time (`check_unchanged`)."""
    with contextlib.ExitStack() as stack:
        operations = {}
        for name, _ in plan.files:
            handle = stack.enter_context(open(plan.folder / name, "rb"))
            operation = CommitOperationAdd(path_in_repo=name, path_or_fileobj=handle)
            if operation.upload_info.sha256.hex() != plan.digests.get(name):
                raise PublishRefused(
                    f"{plan.folder / name} is not the file that was checked (its sha256 differs); nothing uploaded"
                )
            operations[name] = (operation, os.fstat(handle.fileno()))
        yield operations


def check_unchanged(plan: PublishPlan, operations: dict, group: list[str], part: str) -> None:
    for name in group:
        operation, checked = operations[name]
        now = os.fstat(operation.path_or_fileobj.fileno())
        if (now.st_size, now.st_mtime_ns) != (checked.st_size, checked.st_mtime_ns):
            raise PublishRefused(f"{plan.folder / name} was rewritten during the upload; upload stopped before {part}")


def check_remote_access(api: HfApi, plan: PublishPlan) -> None:
    """Read the repo back: it must be as closed as the plan says before any file goes up."""
    info = api.repo_info(plan.repo_id, repo_type="dataset")
    if plan.visibility == "private" and not info.private:
        raise PublishRefused(
            f"datasets/{plan.repo_id} exists and is not private; nothing uploaded (make it private first)"
        )
    if plan.visibility == "gated" and not (info.private or info.gated == "manual"):
        raise PublishRefused(
            f"datasets/{plan.repo_id} is not gated with manual approval (gated={info.gated!r}); nothing uploaded"
        )


def publish(plan: PublishPlan, api: HfApi | None = None) -> str:
    """Create (or reuse) the repo, set its access, upload the planned files; returns the commit URL."""
    api = api or HfApi()
    if not (api.token or get_token()):
        raise PublishRefused("no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    if plan.card_fields:
        card = load_card(plan.folder)
        update_card(card, **plan.card_fields)
        write_text(plan.folder / CARD, str(card))
        plan.files = planned_files(plan.folder)
        plan.digests = checked_digests(plan.folder, plan.files)
    api.create_repo(plan.repo_id, repo_type="dataset", private=plan.visibility == "private", exist_ok=True)
    if plan.visibility == "gated":
        api.update_repo_settings(plan.repo_id, gated="manual", repo_type="dataset")
    check_remote_access(api, plan)
    if plan.revision != "main":
        api.create_branch(plan.repo_id, branch=plan.revision, repo_type="dataset", exist_ok=True)
    groups = upload_groups(plan.files)
    with opened_uploads(plan) as operations:
        for k, group in enumerate(groups, 1):
            check_unchanged(plan, operations, group, f"part {k}/{len(groups)}")
            commit = api.create_commit(
                repo_id=plan.repo_id,
                repo_type="dataset",
                revision=plan.revision,
                operations=[operations[name][0] for name in group],
                commit_message=f"cxr-vqa publish: {plan.facts.dataset} ({plan.facts.image_mode}), part {k}/{len(groups)}: {len(group)} files",
            )
    return commit.commit_url
