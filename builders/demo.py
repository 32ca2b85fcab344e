"""`cxr-vqa demo`: synthetic raw releases in the real formats, built into dataset folders.

Needs no credentials and no network. The demo folder is the demo's own: it is replaced
on every run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from builders.build import BuildSettings


def run_demo(out: Path, num_images: int = 24) -> int:
    from datasets import load_dataset

    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic import generate

    out = Path(out)
    shutil.rmtree(out / "raw", ignore_errors=True)
    release = generate(out / "raw" / "gemex", num_images=num_images)
    report = build_gemex(BuildSettings(source=release.root / "per_type", out=out / "gemex", images=release.image_root,
                                       image_mode="embed", overwrite=True))
    print(f"GEMeX (synthetic): {report.summary()} -> {out / 'gemex'}")
    row = load_dataset(str(out / "gemex"), "multi_choice", split="test")[0]
    print(f"  e.g. {row['question_id']}: {row['question']} {row['choices']} -> {row['answer_letters']}; "
          f"regions {row['regions']} at {row['boxes']} on a {row['image_width']}x{row['image_height']} image")
    print(f"Load it: datasets.load_dataset({str(out / 'gemex')!r}, 'multi_choice')")
    return 0
