"""`cxr-vqa synthesize`: peak memory stays flat as the release grows, measured in one run.

    python -m benchmarks.synthesize_benchmark                                  # the papers' full scale (minutes)
    python -m benchmarks.synthesize_benchmark --gemex 1500 15102 --rexvqa 1600 16000

Each release is written by `cxr-vqa synthesize` in a fresh process; the table gives its wall
time, its peak resident memory (VmHWM of the main process, and the largest image-writing
worker's) and the ratio of each peak to the smallest scale's of the same dataset. The
generators stream (annotations written as each image's questions are made, images by workers
one at a time), so the ratio should stay near 1 (target: within 1.3x from a tenth of the
release to all of it). Images are made tiny (`--downscale`) so the run measures the generator,
not the JPEG/PNG encoder; their size does not change what memory holds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys, time
from cxr_vqa.cli import main
argv = json.loads(sys.argv[1])
start = time.perf_counter()
code = main(argv)
wall = time.perf_counter() - start
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"code": code, "wall_s": wall, "peak_mb": peak, "worker_peak_mb": workers}))
"""


def run(dataset: str, scale: int, downscale: int, num_proc: int, work: Path) -> dict:
    out = work / f"{dataset}-{scale}"
    size = ["--num-images", str(scale)] if dataset == "gemex" else ["--num-studies", str(scale)]
    argv = ["synthesize", dataset, "--out", str(out), *size, "--downscale", str(downscale), "--num-proc", str(num_proc)]
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argv)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(
            f"{dataset} {scale}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.returncode}"
        )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    files = [p for p in out.rglob("*") if p.is_file()]
    questions = 0  # from the CLI's own summary line
    for line in result.stdout.splitlines():
        if "questions per split" in line:
            questions = sum(json.loads(line.split("questions per split ")[1].replace("'", '"')).values())
    shutil.rmtree(out)
    return {"dataset": dataset, "scale": scale, "questions": questions, "files": len(files), **measured}


def table(rows: list[dict]) -> str:
    lines = [
        "| dataset | scale | questions | files | wall s | peak MB | worker peak MB | peak / smallest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    smallest: dict[str, float] = {}
    for row in rows:
        base = smallest.setdefault(row["dataset"], row["peak_mb"])
        lines.append(
            f"| {row['dataset']} | {row['scale']:,} | {row['questions']:,} | {row['files']:,} | {row['wall_s']:.0f} | "
            f"{row['peak_mb']:.0f} | {row['worker_peak_mb']:.0f} | {row['peak_mb'] / base:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemex", type=int, nargs="*", default=[15_000, 151_025], help="GEMeX images per release")
    parser.add_argument("--rexvqa", type=int, nargs="*", default=[16_000, 160_000], help="ReXVQA studies per release")
    parser.add_argument(
        "--gemex-downscale", type=int, default=32, help="GEMeX images this many times smaller than MIMIC-CXR's"
    )
    parser.add_argument(
        "--rexvqa-downscale", type=int, default=16, help="ReXVQA images this many times smaller than the release's"
    )
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--work", type=Path, help="where to write the releases (default: a temporary folder)")
    args = parser.parse_args()
    runs = [("gemex", n, args.gemex_downscale) for n in sorted(args.gemex)] + [
        ("rexvqa", n, args.rexvqa_downscale) for n in sorted(args.rexvqa)
    ]
    rows = []
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        for dataset, scale, downscale in runs:
            rows.append(run(dataset, scale, downscale, args.num_proc, Path(work)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each row as measured: full scale takes a while
    print(table(rows))


if __name__ == "__main__":
    main()
