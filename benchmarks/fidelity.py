"""How close the synthetic releases are to the papers and the public records: one table, both datasets.

    python -m benchmarks.fidelity                                   # 3,000 GEMeX images, 3,000 ReXVQA studies
    python -m benchmarks.fidelity --scale 0.1 --downscale 32        # a tenth of that, quickly
    python -m benchmarks.fidelity --gemex-release PATH              # measure an existing GEMeX release

Each release is written through `cxr-vqa synthesize` (cxr_vqa.cli) into a temporary folder and read
back with plain Python by `fidelity_gemex.figures` / `fidelity_rexvqa.figures`, beside the text-only
baselines. Exits 1 if any figure is out of its range.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks import fidelity_gemex, fidelity_rexvqa
from benchmarks.fidelity_figures import Figure, markdown_table
from cxr_vqa.cli import main as cxr_vqa

GEMEX_IMAGES = 3_000  # the scale a new user would try: 3,000 of each at --downscale 8
REXVQA_STUDIES = 3_000


def synthesize(dataset: str, out: Path, count: int, seed: int, downscale: int) -> Path:
    flag = "--num-images" if dataset == "gemex" else "--num-studies"
    code = cxr_vqa(
        ["synthesize", dataset, "--out", str(out), flag, str(count), "--seed", str(seed), "--downscale", str(downscale)]
    )
    if code:
        raise SystemExit(f"cxr-vqa synthesize {dataset} exited {code}")
    return out


def gemex_figures(release: Path) -> list[Figure]:
    return fidelity_gemex.figures(release) + fidelity_gemex.text_only_baseline(release)


def rexvqa_figures(release: Path) -> list[Figure]:
    return fidelity_rexvqa.figures(release) + fidelity_rexvqa.text_only_baseline(release)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scale", type=float, default=1.0, help=f"fraction of {GEMEX_IMAGES} images / {REXVQA_STUDIES} studies"
    )
    parser.add_argument("--downscale", type=int, default=8, help="images this many times smaller per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gemex-release", type=Path, help="measure this GEMeX release instead of making one")
    parser.add_argument("--rexvqa-release", type=Path, help="measure this ReXVQA release instead of making one")
    args = parser.parse_args(argv)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="fidelity-") as work:
        gemex = args.gemex_release or synthesize(
            "gemex", Path(work) / "gemex", round(GEMEX_IMAGES * args.scale), args.seed, args.downscale
        )
        figures += gemex_figures(gemex)
        rexvqa = args.rexvqa_release or synthesize(
            "rexvqa", Path(work) / "rexvqa", round(REXVQA_STUDIES * args.scale), args.seed, max(1, args.downscale // 2)
        )
        figures += rexvqa_figures(rexvqa)
    print(markdown_table(figures))
    out = [f for f in figures if not f.within]
    if out:
        print(
            f"\n{len(out)} figure(s) out of range: " + "; ".join(f"{f.dataset} {f.figure}" for f in out),
            file=sys.stderr,
        )
    return 1 if out else 0


if __name__ == "__main__":
    raise SystemExit(main())
