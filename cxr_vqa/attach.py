"""`cxr-vqa attach FOLDER --image-root DIR --out FOLDER2`: an annotations-only build meets local images.

A build made with `--image-mode none` (or a `reference` build made on another machine) holds every
question and the released path of its image(s). `attach` writes its rows back as the release's own
records (`gemex_dataset.rows.raw_record` in the layout each row came from, `rexvqa_dataset.rows.raw_record`),
into a scratch folder beside the output, and builds that release with `--images DIR`: the result is
a build like any other (the same question ids, every config, `cxr-vqa validate` passes), made with
the first build's settings but the image mode asked for. Its `build_report.json` says where its
annotations and images came from (`attached`).
"""

from __future__ import annotations

import csv
import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from datasets import load_dataset

from builders.assembly.report import BuildReport
from builders.assembly.settings import BuildSettings
from builders.built_folder import card_configs, default_config
from builders.files import write_text

CARRIED_SETTINGS = ("shard_layout", "turn_seed", "conversation_tokens", "no_conversations", "image_ext", "keep_16bit")
"""The first build's settings the attached build keeps (how it is laid out); the image settings are attach's own."""
RELEASE_SPLIT = {"train": "train", "validation": "valid", "test": "test"}
"""The release's name of each split (folder and file names)."""


def build_rows(folder: Path) -> dict[str, list[dict]]:
    """Every question row of the build, per split (its default config, which holds every question)."""
    configs, _ = card_configs(folder)
    loaded = load_dataset(str(folder), default_config(configs))
    drop = [c for c in ("image", "images", "messages") if c in next(iter(loaded.values())).column_names]
    return {split: dataset.remove_columns(drop).to_list() for split, dataset in loaded.items()}


def write_rexvqa_release(rows: dict[str, list[dict]], root: Path) -> Path:
    """`metadata/<split>_vqa_data.json`: each question's released record under its id."""
    from rexvqa_dataset.rows import raw_record

    for split, split_rows in rows.items():
        records = {row["question_id"]: raw_record(row) for row in split_rows}
        write_text(root / "metadata" / f"{RELEASE_SPLIT[split]}_vqa_data.json", json.dumps(records, ensure_ascii=False))
    return root


def _ordinal(row: dict) -> int:
    return int(row["question_id"].rsplit("/", 1)[1])


def write_gemex_release(rows: dict[str, list[dict]], root: Path) -> Path:
    """Each split's rows in the layout each came from (`source_layout`), in release order (the question ids'
    ordinals, which the build counts again from it)."""
    from gemex_dataset.features import LLAVA_Q_TYPES, QUESTION_TYPES
    from gemex_dataset.rows import raw_record

    for split, split_rows in rows.items():
        folder = root / RELEASE_SPLIT[split]
        ordered = sorted(split_rows, key=lambda r: (r["image_path"], r["question_type"], _ordinal(r)))
        by_layout: dict[str, list[dict]] = defaultdict(list)
        for row in ordered:
            by_layout[row["source_layout"]].append(row)
        for question_type in QUESTION_TYPES:
            of_type = [r for r in by_layout["per_type"] if QUESTION_TYPES[r["question_type"]] == question_type]
            if of_type:
                lines = "".join(json.dumps(raw_record(r, "per_type"), ensure_ascii=False) + "\n" for r in of_type)
                write_text(folder / f"{question_type}_question.jsonl", lines)
        if by_layout["llava"]:
            records = [raw_record(r, "llava") for r in by_layout["llava"]]
            write_text(folder / f"{RELEASE_SPLIT[split]}_conversations.json", json.dumps(records, ensure_ascii=False))
        if by_layout["grouped"]:
            write_grouped(by_layout["grouped"], folder, RELEASE_SPLIT[split], LLAVA_Q_TYPES, QUESTION_TYPES)
    return root


def write_grouped(rows: list[dict], folder: Path, name: str, group_names: dict, question_types: tuple) -> None:
    """The grouped layout: line k of the questions file holds the questions of the image on row k of the CSV
    (`row_id` ``row_<k>``); a row no question names is written with no questions."""
    from gemex_dataset.rows import raw_record

    lines: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    paths: dict[int, str] = {}
    for row in rows:
        k = int(row["row_id"].removeprefix("row_"))
        lines[k][group_names[question_types[row["question_type"]]]].append(raw_record(row, "grouped"))
        paths[k] = row["image_path"]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}_images.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["mimic_image_file_path"])
        for k in range(max(paths) + 1):
            writer.writerow([f"files/{paths.get(k, 'none.jpg')}"])
    text = "".join(json.dumps(lines.get(k, {}), ensure_ascii=False) + "\n" for k in range(max(paths) + 1))
    write_text(folder / f"{name}_questions.jsonl", text)


def attach_images(
    folder: Path, image_root: Path, out: Path, image_mode: str = "reference", overwrite: bool = False
) -> BuildReport:
    """Build `out` from the annotations of the build `folder` and the images under `image_root`."""
    folder, image_root, out = Path(folder), Path(image_root), Path(out)
    report_path = folder / "build_report.json"
    try:
        first = json.loads(report_path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{report_path}: unreadable ({err}); attach reads a cxr-vqa build") from err
    if image_mode not in ("embed", "reference"):
        raise ValueError(f"--image-mode {image_mode}: attach writes embed or reference builds")
    if not image_root.is_dir():
        raise ValueError(f"--image-root {image_root}: no such folder")
    dataset = first.get("dataset")
    if dataset not in ("gemex", "rexvqa"):
        raise ValueError(f"{report_path}: names no dataset gemex or rexvqa")
    rows = build_rows(folder)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".attach-", dir=out.parent))
    try:
        carried = {k: first["settings"][k] for k in CARRIED_SETTINGS if k in first.get("settings", {})}
        settings = BuildSettings(
            source=scratch, out=out, images=image_root, image_mode=image_mode, overwrite=overwrite, **carried
        )
        if dataset == "gemex":
            from gemex_dataset.build import build_gemex

            write_gemex_release(rows, scratch)
            report = build_gemex(settings)
        else:
            from rexvqa_dataset.build import build_rexvqa

            write_rexvqa_release(rows, scratch)
            report = build_rexvqa(settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    saved = json.loads((out / "build_report.json").read_text())
    saved["attached"] = {"annotations": str(folder.absolute()), "images": str(image_root.absolute())}
    saved["settings"]["source"] = str(folder)
    write_text(out / "build_report.json", json.dumps(saved, indent=2, ensure_ascii=False) + "\n")
    return report
