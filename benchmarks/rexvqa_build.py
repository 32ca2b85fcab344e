"""Build benchmark for ReXVQA (not a test): records/s, images/s, peak memory and output bytes.

For each scale (studies in a synthetic release) it generates the release once, then
builds it in a fresh process per image mode, so each peak memory is that build's own:
`embed` (16-bit PNGs windowed to 8 bits), `embed --keep-16bit` (the release's PNGs copied
as they are) and `none` (text only). The last columns check the storage guarantee:

    ratio = embed output bytes / (distinct stored image bytes + text-only output bytes)

where the distinct stored image bytes are those of each different image stored once.
`ratio/file` counts an image once per file that holds it instead: near 1.0x means the
dictionary encoding stores a study's images once per file whatever its number of
questions. `copies` is how many times an image's bytes are stored on average: once per task file
that has a question on its study (the per-task shard layout), dictionary-encoded within
a file.

    python benchmarks/rexvqa_build.py --scales 200 2000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"embed": {"image_mode": "embed"}, "embed-16bit": {"image_mode": "embed", "keep_16bit": True}, "none": {"image_mode": "none"}}


def one_build(source: str, out: str, mode: str, num_proc: int) -> None:
    """Run in a child process: build, then print timings and this process's peak memory as JSON."""
    sys.path.insert(0, str(ROOT))
    from builders.build import BuildSettings
    from rexvqa_dataset.build import build_rexvqa

    start = time.perf_counter()
    report = build_rexvqa(BuildSettings(source=Path(source), out=Path(out), num_proc=num_proc, overwrite=True, **MODES[mode]))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "records": report.records_read, "images": sum(report.images.values()),
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def output_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in (out / "data").rglob("*.parquet"))


def stored_images(out: Path) -> tuple[int, int]:
    """(bytes of each distinct stored image once, bytes of all images as stored per file)."""
    import pyarrow.parquet as pq

    distinct: dict[str, int] = {}
    per_file = 0
    for path in (out / "data").rglob("*.parquet"):
        in_file: dict[str, int] = {}
        for row in pq.read_table(path, columns=["images"]).column("images").to_pylist():
            for image in row:
                in_file[hashlib.sha1(image["bytes"]).hexdigest()] = len(image["bytes"])
        distinct.update(in_file)
        per_file += sum(in_file.values())
    return sum(distinct.values()), per_file


def run_scale(studies: int, work: Path, num_proc: int) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from rexvqa_dataset.synthetic import generate

    release = generate(work / f"raw-{studies}", num_studies=studies, num_proc=num_proc)
    results = {}
    for mode in MODES:
        out = work / f"out-{studies}-{mode}"
        child = subprocess.run([sys.executable, __file__, "--one", str(release.root), str(out), mode, str(num_proc)],
                               capture_output=True, text=True, check=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
        results[mode] = json.loads(child.stdout.strip().splitlines()[-1]) | {"bytes": output_bytes(out), "out": out}
    text = results["none"]["bytes"]
    lines = []
    for mode in ("embed", "embed-16bit"):
        r = results[mode]
        distinct, per_file = stored_images(r["out"])
        lines.append({"studies": studies, "mode": mode, **{k: r[k] for k in ("records", "images", "seconds", "peak_mib", "bytes")},
                      "ratio": r["bytes"] / (distinct + text), "ratio_file": r["bytes"] / (per_file + text),
                      "copies": per_file / distinct})
    r = results["none"]
    lines.append({"studies": studies, "mode": "none", **{k: r[k] for k in ("records", "images", "seconds", "peak_mib", "bytes")},
                  "ratio": None, "ratio_file": None, "copies": None})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[200, 2000], help="studies per synthetic release")
    parser.add_argument("--num-proc", type=int, default=1)
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        source, out, mode, num_proc = args.one
        one_build(source, out, mode, int(num_proc))
        return
    print(f"{'studies':>7} {'mode':>11} {'records':>8} {'images':>7} {'rec/s':>8} {'img/s':>8} {'peak MiB':>9} {'out MiB':>8} {'ratio':>6} {'ratio/file':>10} {'copies':>6}")
    with tempfile.TemporaryDirectory(prefix="rexvqa-bench-") as tmp:
        for studies in args.scales:
            for r in run_scale(studies, Path(tmp), args.num_proc):
                ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
                copies = f"{r['copies']:.2f}" if r["copies"] else "-"
                per_file = f"{r['ratio_file']:.2f}x" if r["ratio_file"] else "-"
                print(f"{r['studies']:>7} {r['mode']:>11} {r['records']:>8} {r['images']:>7} {r['records'] / r['seconds']:>8.0f} "
                      f"{r['images'] / r['seconds']:>8.0f} {r['peak_mib']:>9.0f} {r['bytes'] / 2**20:>8.2f} {ratio:>6} {per_file:>10} {copies:>6}", flush=True)


if __name__ == "__main__":
    main()
