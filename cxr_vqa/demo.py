"""`cxr-vqa demo`: synthetic raw releases in the real formats, built into dataset folders.

Needs no credentials and no network. Each run replaces what the last one wrote in the demo
folder, and only that: `raw/gemex/` and `raw/rexvqa/` when every file in them holds the bytes
the synthetic generator wrote, as listed, images included, in the release's manifest
(`builders.provenance.list_release_files`, `foreign_release_file`), `gemex/` and `rexvqa/`
when they are build folders (`builders.assembly.lifecycle.check_replaceable`, what `build
--overwrite` replaces). Anything else there stops the run before it changes a file. Each raw
release is written beside its place and renamed into it, so a killed run leaves no half release.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from functools import partial
from pathlib import Path

from builders.assembly.lifecycle import check_replaceable, staged_output
from builders.assembly.settings import BuildSettings
from builders.provenance import list_release_files

DEMO_RULE = "cxr-vqa demo replaces only a folder an earlier demo wrote"


def run_demo(out: Path, num_images: int = 24) -> int:
    from datasets import load_dataset

    from builders.hub.preview import add_preview_config
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic.release import generate

    out = Path(out)
    check_demo_folder(out)
    with staged_output(out / "raw" / "gemex", True, *demo_release_owner("gemex")) as (staged, _):
        release = replace(generate(staged, num_images=num_images), root=out / "raw" / "gemex")  # renamed into place
        list_release_files(staged)
    report = build_gemex(
        BuildSettings(
            source=release.root / "per_type",
            out=out / "gemex",
            images=release.image_root,
            image_mode="embed",
            overwrite=True,
        )
    )
    print(f"GEMeX (synthetic): {report.summary()} -> {out / 'gemex'}")
    add_preview_config(out / "gemex", n=8)
    print(f"  preview config (boxes drawn in) and {out / 'gemex' / 'preview.png'} in the card")
    row = load_dataset(str(out / "gemex"), "multi_choice", split="test")[0]
    print(
        f"  e.g. {row['question_id']}: {row['question']} {row['choices']} -> {row['answer_letters']}; "
        f"regions {row['regions']} at {[[round(v) for v in box] for box in row['boxes']]} on a {row['image_width']}x{row['image_height']} image"
    )
    print(f"Load it: datasets.load_dataset({str(out / 'gemex')!r}, 'multi_choice')")
    run_rexvqa_demo(out)
    print("Next:")
    print(f"  {next_command(out)}    # score a baseline: the table a model's predictions get")
    print("  then fine-tune a model and score its replies: the quickstart in README.md")
    return 0


def next_command(out: Path) -> str:
    """The command the demo suggests next: `evaluate` on its GEMeX build, with the majority baseline."""
    return shlex.join(["cxr-vqa", "evaluate", str(out / "gemex"), "--baseline", "majority"])


def run_rexvqa_demo(out: Path, num_studies: int = 20, task_shares: dict[str, float] | None = None) -> None:
    """The ReXVQA part: a synthetic release of `num_studies` studies built in embed mode (`task_shares`:
    the paper's mix unless given, see `rexvqa_dataset.synthetic.generate`)."""
    from datasets import load_dataset

    from rexvqa_dataset.build import build_rexvqa
    from rexvqa_dataset.synthetic.release import generate

    check_demo_folder(out)
    with staged_output(out / "raw" / "rexvqa", True, *demo_release_owner("rexvqa")) as (staged, _):
        generate(staged, num_studies=num_studies, **({"task_shares": task_shares} if task_shares else {}))
        list_release_files(staged)
    report = build_rexvqa(
        BuildSettings(source=out / "raw" / "rexvqa", out=out / "rexvqa", image_mode="embed", overwrite=True)
    )
    print(f"ReXVQA (synthetic): {report.summary()} -> {out / 'rexvqa'}")
    row = load_dataset(str(out / "rexvqa"), split="test")[0]
    print(
        f"  e.g. {row['question_id']} ({row['task_name_raw']}): {row['question']} {row['options']} -> {row['answer']}; "
        f"{len(row['images'])} image(s), views {row['view_positions']}"
    )
    print(f"Load it: datasets.load_dataset({str(out / 'rexvqa')!r}, 'presence_assessment')")


def demo_release_owner(dataset: str) -> tuple:
    """`staged_output`'s ownership test and rule for the demo's raw release of `dataset`: only one whose every
    file its synthetic generator wrote (`foreign_release_file`) is replaced."""
    from builders.provenance import foreign_release_file
    from builders.synthetic_release import NOTE_NAME
    from gemex_dataset.synthetic.release import RELEASE as GEMEX
    from rexvqa_dataset.synthetic.release import RELEASE as REXVQA

    note = {"gemex": GEMEX.note, "rexvqa": REXVQA.note}[dataset]
    return partial(foreign_release_file, notes={NOTE_NAME: note}), DEMO_RULE


def check_demo_folder(out: Path) -> None:
    """Refuse (BuildError, one line) before anything is written unless each place the demo writes in `out` is
    free or holds what a demo wrote: the raw releases as the generator wrote them, the builds as builds."""
    raw = out / "raw"
    if raw.is_symlink() or (raw.exists() and not raw.is_dir()):
        check_replaceable(raw, True, lambda _: None, DEMO_RULE)
    for dataset in ("gemex", "rexvqa"):
        check_replaceable(raw / dataset, True, *demo_release_owner(dataset))
        check_replaceable(out / dataset, True, rule=DEMO_RULE)
