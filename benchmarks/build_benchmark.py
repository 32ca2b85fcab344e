"""GEMeX build: speed, memory and size against the machine's own limits, measured in one run.

    python benchmarks/build_benchmark.py --scales 200 2000

For each scale (number of images; about 10.6 questions each) it writes a synthetic release,
then measures, each build in a fresh process:
- the time to merely read every input byte (annotations and images): the floor,
- `cxr-vqa build gemex` in each image mode: records/s, images/s, peak memory, output bytes,
- the naive way: `Dataset.from_generator` over the records with the image bytes per row, then `to_parquet`.
Ratios are taken within the run, so a noisy machine moves both sides alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CHILD_BUILD = """
import json, sys, time
from pathlib import Path
def peak_mb():  # VmHWM is this process's own peak; ru_maxrss would carry the parent's over fork/exec
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
from builders.build import BuildSettings
from gemex_dataset.build import build_gemex
source, images, out, mode, size = sys.argv[1:6]
start = time.perf_counter()
report = build_gemex(BuildSettings(source=Path(source), out=Path(out), images=Path(images), image_mode=mode,
                                   image_size=int(size) or None, overwrite=True))
print(json.dumps({"seconds": time.perf_counter() - start, "rows": report.rows_written,
                  "images": sum(report.images.values()), "peak_mb": peak_mb()}))
"""

CHILD_NAIVE = """
import json, sys, time
from pathlib import Path
def peak_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
from datasets import Dataset, Features, Image, List, Value
source, images, out = sys.argv[1:4]
def records():
    for path in sorted(Path(source).rglob("*_question.jsonl")):
        for line in path.read_text().split("\\n"):
            r = json.loads(line)
            yield {"question": r["question"], "choices": r.get("choices", []), "answer": json.dumps(r["answer"]),
                   "reason": r["reason"], "regions": r["visual_regions"], "boxes": r["visual_locations"],
                   "report": r["ori_report"], "image": {"bytes": (Path(images) / r["image_path"]).read_bytes(), "path": r["image_path"]}}
features = Features({"question": Value("string"), "choices": List(Value("string")), "answer": Value("string"),
                     "reason": Value("string"), "regions": List(Value("string")), "boxes": List(List(Value("int32"))),
                     "report": Value("string"), "image": Image()})
start = time.perf_counter()
import tempfile
ds = Dataset.from_generator(records, features=features, cache_dir=tempfile.mkdtemp())
ds.to_parquet(out)
print(json.dumps({"seconds": time.perf_counter() - start, "rows": len(ds), "images": 0,
                  "peak_mb": peak_mb()}))
"""


def run_child(code: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                            env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                                 "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin"})
    if result.returncode:
        raise SystemExit(result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def read_everything(folders: list[Path]) -> float:
    start = time.perf_counter()
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    while f.read(1 << 20):
                        pass
    return time.perf_counter() - start


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def dedup_bytes(folder: Path, window: int = 48, mask: int = (1 << 16) - 1) -> int:
    """Bytes left after content-defined chunking (~64 KiB chunks) and keeping each distinct chunk once.

    An estimate of what the Hub's Xet storage keeps of an upload: chunk boundaries fall where a
    windowed sum of random byte weights has its low 16 bits zero, so they depend on content only.
    """
    weights = np.random.default_rng(0).integers(0, 2**32, 256, dtype=np.uint64)
    seen: set[bytes] = set()
    kept = 0
    for path in sorted(folder.rglob("*.parquet")):
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        sums = np.cumsum(weights[data], dtype=np.uint64)
        rolling = sums[window:] - sums[:-window]
        cuts = np.flatnonzero((rolling & np.uint64(mask)) == 0) + window + 1
        start = 0
        for end in list(cuts) + [len(data)]:
            if end - start < 4096 and end != len(data):
                continue
            chunk = data[start:end].tobytes()
            digest = hashlib.blake2b(chunk, digest_size=16).digest()
            if digest not in seen:
                seen.add(digest)
                kept += len(chunk)
            start = end
    return kept


def bench(scale: int, work: Path, downscale: int) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from gemex_dataset.synthetic import generate

    release = generate(work / f"release-{scale}", num_images=scale, downscale=downscale, layouts=("per_type",), num_proc=2)
    source, images = release.root / "per_type", release.image_root
    distinct, text = folder_bytes(images), folder_bytes(source)
    read_seconds = min(read_everything([source, images]) for _ in range(3))
    rows = []
    for mode, size in (("none", 0), ("reference", 0), ("embed", 0), ("embed", 512)):
        out = work / f"out-{scale}-{mode}-{size}"
        result = run_child(CHILD_BUILD, str(source), str(images), str(out), mode, str(size))
        output = folder_bytes(out, "*.parquet")
        biggest_config = max(folder_bytes(out, f"{t}-*.parquet") for t in ("open_ended", "closed_ended", "single_choice", "multi_choice"))
        rows.append({"scale": scale, "way": f"build {mode}" + (f" --image-size {size}" if size else ""), **result,
                     "output_mb": output / 1e6, "vs_read": result["seconds"] / read_seconds,
                     "vs_distinct": output / (distinct + text) if mode == "embed" and not size else None,
                     "dedup_vs_distinct": dedup_bytes(out) / (distinct + text) if mode == "embed" and not size else None,
                     "config_vs_distinct": biggest_config / (distinct + text) if mode == "embed" and not size else None})
    naive = run_child(CHILD_NAIVE, str(source), str(images), str(work / f"naive-{scale}.parquet"))
    naive_bytes = (work / f"naive-{scale}.parquet").stat().st_size
    embed = next(r for r in rows if r["way"] == "build embed")
    rows.append({"scale": scale, "way": "naive from_generator", **naive, "output_mb": naive_bytes / 1e6,
                 "vs_read": naive["seconds"] / read_seconds, "vs_distinct": naive_bytes / (distinct + text),
                 "naive_over_embed_bytes": naive_bytes / (embed["output_mb"] * 1e6),
                 "naive_over_embed_time": naive["seconds"] / embed["seconds"]})
    print(f"scale {scale}: {scale} images, {embed['rows']} questions, input {(distinct + text) / 1e6:.1f} MB "
          f"(images {distinct / 1e6:.1f} MB), read-only {read_seconds:.3f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = ["scale", "way", "seconds", "records/s", "images/s", "peak MB", "output MB", "x read-only", "out/(img+text)",
            "dedup/(img+text)", "1 config/(img+text)", "naive/embed bytes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v, f="{:.2f}": "" if v is None else f.format(v)
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["scale"]), r["way"], fmt(r["seconds"]), fmt(r["rows"] / r["seconds"], "{:.0f}"),
            fmt(r["images"] / r["seconds"] if r["images"] else None, "{:.0f}"), fmt(r["peak_mb"], "{:.0f}"),
            fmt(r["output_mb"], "{:.1f}"), fmt(r["vs_read"], "{:.1f}"), fmt(r.get("vs_distinct")),
            fmt(r.get("dedup_vs_distinct")), fmt(r.get("config_vs_distinct")), fmt(r.get("naive_over_embed_bytes"), "{:.1f}"),
        ]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", type=int, nargs="+", default=[200, 2000], help="images per synthetic release")
    parser.add_argument("--downscale", type=int, default=4, help="synthetic images this many times smaller than MIMIC's per side")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        rows = [row for scale in args.scales for row in bench(scale, work, args.downscale)]
    print(table(rows))


if __name__ == "__main__":
    main()
