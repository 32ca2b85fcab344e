"""`cxr-vqa demo`: synthetic raw releases in the real formats, built into dataset folders.

Needs no credentials and no network. The demo folder is the demo's own: it is replaced
on every run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from builders.assembly.settings import BuildSettings


def run_demo(out: Path, num_images: int = 24) -> int:
    from datasets import load_dataset

    from builders.hub.preview import add_preview_config
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic import generate

    out = Path(out)
    shutil.rmtree(out / "raw", ignore_errors=True)
    release = generate(out / "raw" / "gemex", num_images=num_images)
    report = build_gemex(BuildSettings(source=release.root / "per_type", out=out / "gemex", images=release.image_root,
                                       image_mode="embed", overwrite=True))
    print(f"GEMeX (synthetic): {report.summary()} -> {out / 'gemex'}")
    add_preview_config(out / "gemex", n=8)
    print(f"  preview config (boxes drawn in) and {out / 'gemex' / 'preview.png'} in the card")
    row = load_dataset(str(out / "gemex"), "multi_choice", split="test")[0]
    print(f"  e.g. {row['question_id']}: {row['question']} {row['choices']} -> {row['answer_letters']}; "
          f"regions {row['regions']} at {[[round(v) for v in box] for box in row['boxes']]} on a {row['image_width']}x{row['image_height']} image")
    print(f"Load it: datasets.load_dataset({str(out / 'gemex')!r}, 'multi_choice')")
    run_rexvqa_demo(out)
    return 0


def run_rexvqa_demo(out: Path, num_studies: int = 20, task_shares: dict[str, float] | None = None) -> None:
    """The ReXVQA part: a synthetic release of `num_studies` studies built in embed mode (`task_shares`:
    the paper's mix unless given, see `rexvqa_dataset.synthetic.generate`)."""
    from datasets import load_dataset

    from rexvqa_dataset.build import build_rexvqa
    from rexvqa_dataset.synthetic import generate

    release = generate(out / "raw" / "rexvqa", num_studies=num_studies, **({"task_shares": task_shares} if task_shares else {}))
    report = build_rexvqa(BuildSettings(source=release.root, out=out / "rexvqa", image_mode="embed", overwrite=True))
    print(f"ReXVQA (synthetic): {report.summary()} -> {out / 'rexvqa'}")
    row = load_dataset(str(out / "rexvqa"), split="test")[0]
    print(f"  e.g. {row['question_id']} ({row['task_name_raw']}): {row['question']} {row['options']} -> {row['answer']}; "
          f"{len(row['images'])} image(s), views {row['view_positions']}")
    print(f"Load it: datasets.load_dataset({str(out / 'rexvqa')!r}, 'presence_assessment')")
