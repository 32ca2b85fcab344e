"""Dataset builds: speed, memory and size against the machine's own limits, measured in one run.

    python -m benchmarks.build_benchmark --scales 200 2000            # GEMeX and ReXVQA
    python -m benchmarks.build_benchmark --datasets gemex --scales 200 2000 --downscale 2
    python -m benchmarks.build_benchmark --full-scale --work /work/fullscale   # text path at the papers' scale

For each dataset and scale (GEMeX: images, about 10.6 questions each; ReXVQA: studies, about
4.1 questions and 1.7 images each) it writes a synthetic release, then measures, each build
in a fresh process (so each peak memory, VmHWM, is that build's own):
- the time to merely read every input byte (annotations and images): the machine's floor,
  and the time to read them and write them once into one file: the floor of a build that
  stores the images (`x copy`),
- `cxr-vqa build` in each image mode: records/s, images/s, peak memory, output bytes,
- for GEMeX, the naive way: `Dataset.from_generator` over the records with the image bytes per
  row, then `to_parquet`.
Ratios are taken within the run, so a noisy machine moves both sides alike. By default the
inputs sit in the page cache (they were just written); `--cold` evicts them before the
read-only pass and before each build (`posix_fadvise(DONTNEED)`, no root needed), as for a
release read from disk. Size columns
divide by the distinct image bytes stored plus the annotation text:
- `out/(img+text)`: all shards. An embed build writes one set per config (question type, task),
  so an image with questions of several types is stored in each of their files; with
  `--shard-layout shared` it writes one shared shard set per split, each image once;
- `1 config`: the largest single shard set (a config's own, or the shared one);
- `dedup`: the bytes left when all shards are cut into ~64 KiB content-defined chunks and each
  distinct chunk kept once: an estimate of what the Hub's Xet storage keeps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "gemex": ("open_ended", "closed_ended", "single_choice", "multi_choice"),
    "rexvqa": (
        "presence_assessment",
        "location_and_distribution_assessment",
        "negation_assessment",
        "differential_diagnosis",
        "geometric_information_assessment",
        "other_task",
    ),
}
SHARED = ("embed --shard-layout shared", {"shard_layout": "shared"})
MODES = {
    "gemex": (("none", {}), ("reference", {}), ("embed", {}), SHARED, ("embed --image-size 512", {"image_size": 512})),
    "rexvqa": (
        ("none", {}),
        ("reference", {}),
        ("embed", {}),
        SHARED,
        ("embed --keep-16bit", {"keep_16bit": True}),
        ("embed --image-size 512", {"image_size": 512}),
    ),
}

PEAK = 'def peak_mb():\n    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024\n'
CHILD_BUILD = (
    PEAK
    + """
import json, sys, time
from pathlib import Path
from builders.assembly.settings import BuildSettings
dataset, source, images, out, mode, options = sys.argv[1:7]
if dataset == "gemex":
    from gemex_dataset.build import build_gemex as build
else:
    from rexvqa_dataset.build import build_rexvqa as build
start = time.perf_counter()
report = build(BuildSettings(source=Path(source), out=Path(out), images=Path(images) if images else None, image_mode=mode.split()[0],
                             overwrite=True, **json.loads(options)))
print(json.dumps({"seconds": time.perf_counter() - start, "rows": report.rows_written,
                  "images": sum(report.images.values()), "peak_mb": peak_mb()}))
"""
)
CHILD_NAIVE = (
    PEAK
    + """
import json, sys, tempfile, time
from pathlib import Path
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
with tempfile.TemporaryDirectory() as cache:
    start = time.perf_counter()
    ds = Dataset.from_generator(records, features=features, cache_dir=cache)
    ds.to_parquet(out)
    seconds, rows = time.perf_counter() - start, len(ds)
    del ds
print(json.dumps({"seconds": seconds, "rows": rows, "images": 0, "peak_mb": peak_mb()}))
"""
)


CHILD_PARSE = (
    PEAK
    + """
import json, sys, time
from pathlib import Path
dataset, annotations = sys.argv[1:3]
start, records = time.perf_counter(), 0
if dataset == "gemex":
    for path in sorted(Path(annotations).rglob("*_question.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)
                records += 1
else:
    for path in sorted(Path(annotations).glob("*_vqa_data.json")):
        with open(path, "rb") as f:
            records += len(json.load(f))
print(json.dumps({"seconds": time.perf_counter() - start, "rows": records, "images": 0, "peak_mb": peak_mb()}))
"""
)
CHILD_HEADERS = (
    PEAK
    + """
import json, os, sys, time
from builders.assembly.image_source import ImageReader
images = sys.argv[1]
relatives = [os.path.relpath(os.path.join(folder, name), images) for folder, _, names in os.walk(images)
             for name in names if name.endswith((".jpg", ".png"))]
start = time.perf_counter()  # listing the files is not part of it: a build finds them from the annotations
ImageReader(images, "reference").read_all(relatives)
print(json.dumps({"seconds": time.perf_counter() - start, "rows": len(relatives), "images": len(relatives), "peak_mb": peak_mb()}))
"""
)
FULL_SCALE = {"gemex": 151_025, "rexvqa": 160_000}
"""The paper's GEMeX images and the public ReXVQA studies."""


def run_child(code: str, *args: str) -> dict:
    env = {
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TQDM_DISABLE": "1",
        "PATH": "/usr/bin:/bin",
    }
    result = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, env=env, check=False
    )
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


def copy_everything(folders: list[Path], target: Path) -> float:
    """Seconds to read every input byte and write it once into `target`: the floor of any build that stores the images."""
    start = time.perf_counter()
    with open(target, "wb") as out:
        for folder in folders:
            for path in folder.rglob("*"):
                if path.is_file():
                    with open(path, "rb") as f:
                        while block := f.read(1 << 20):
                            out.write(block)
    seconds = time.perf_counter() - start
    target.unlink()
    return seconds


def evict(folders: list[Path]) -> None:
    """Drop the files under `folders` from the page cache, so the next read comes from disk."""
    os.sync()  # dirty pages cannot be dropped
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def dedup_bytes(folder: Path, window: int = 48, mask: int = (1 << 16) - 1) -> int:
    """Bytes left after content-defined chunking (~64 KiB chunks) and keeping each distinct chunk once.

    Chunk boundaries fall where a windowed sum of random byte weights has its low 16 bits
    zero, so they depend on content only, as in the Hub's Xet storage.
    """
    weights = np.random.default_rng(0).integers(0, 2**32, 256, dtype=np.uint64)
    seen: set[bytes] = set()
    kept = 0
    for path in sorted(folder.rglob("*.parquet")):
        data = np.memmap(path, dtype=np.uint8, mode="r")
        cuts = []
        for block in range(0, len(data), 1 << 24):  # 16 MiB at a time, overlapping by the window
            part = data[max(0, block - window) : block + (1 << 24)]
            sums = np.cumsum(weights[part], dtype=np.uint64)
            hits = np.flatnonzero(((sums[window:] - sums[:-window]) & np.uint64(mask)) == 0) + window + 1
            cuts.extend((hits + max(0, block - window)).tolist())
        start = 0
        for end in [*sorted(set(cuts)), len(data)]:
            if end - start < 4096 and end != len(data):
                continue
            digest = hashlib.blake2b(data[start:end].tobytes(), digest_size=16).digest()
            if digest not in seen:
                seen.add(digest)
                kept += end - start
            start = end
    return kept


def release(dataset: str, scale: int, work: Path, downscale: int, images: bool = True) -> tuple[Path, Path, Path, int]:
    """(annotations, image root, annotation files to read, distinct image bytes) of a synthetic release.

    A release already generated into `work` with the same scale and downscale (its `.generated`
    file says so) is reused: at full scale generating takes minutes. `images=False` writes the
    annotations only (enough for `--image-mode none`), into a folder of its own.
    """
    folder = work / f"{dataset}-{scale}-d{downscale}{'' if images else '-text'}"
    done = folder / ".generated"
    if dataset == "gemex":
        from gemex_dataset.synthetic.release import generate

        if not done.exists():
            generate(folder, num_images=scale, downscale=downscale, layouts=("per_type",), num_proc=2, images=images)
            done.touch()
        return folder / "per_type", folder / "files", folder / "per_type", folder_bytes(folder / "files")
    from rexvqa_dataset.synthetic.release import generate

    if not done.exists():
        generate(folder, num_studies=scale, downscale=downscale, num_proc=2, images=images)
        done.touch()
    return folder, folder / "metadata", folder / "metadata", folder_bytes(folder / "deid_png")


def stored_image_bytes(out: Path) -> int:
    """Bytes of each distinct image stored in the shards, counted once."""
    import pyarrow.parquet as pq

    distinct: dict[bytes, int] = {}
    for path in out.rglob("*.parquet"):
        schema = pq.ParquetFile(path).schema_arrow
        column = "image" if "image" in schema.names else "images"
        for value in pq.read_table(path, columns=[column]).column(column).to_pylist():
            for image in value if isinstance(value, list) else [value]:
                distinct[hashlib.blake2b(image["bytes"], digest_size=16).digest()] = len(image["bytes"])
    return sum(distinct.values())


def bench(
    dataset: str, scale: int, work: Path, downscale: int, cold: bool, ways: list[str] | None = None
) -> list[dict]:
    source, images, annotations, image_bytes = release(dataset, scale, work, downscale)
    text = folder_bytes(annotations)
    inputs = [annotations, images.parent if dataset == "rexvqa" else images]
    settle = (lambda: evict(inputs)) if cold else (lambda: None)
    read_seconds = min((settle(), read_everything(inputs))[1] for _ in range(3))
    copy_seconds = min((settle(), copy_everything(inputs, work / "copy.bin"))[1] for _ in range(2))
    rows = []
    for way, options in MODES[dataset]:
        if ways and way not in ways and way.split()[0] != "none":
            continue
        out = work / f"out-{dataset}-{scale}-{way.replace(' ', '')}"
        settle()
        result = run_child(CHILD_BUILD, dataset, str(source), str(images), str(out), way, json.dumps(options))
        row = {
            "dataset": dataset,
            "scale": scale,
            "way": f"build {way}",
            **result,
            "output_mb": folder_bytes(out, "*.parquet") / 1e6,
            "vs_read": result["seconds"] / read_seconds,
            "vs_copy": result["seconds"] / copy_seconds,
        }
        if way.startswith("embed"):
            distinct = stored_image_bytes(out) + text
            biggest = max(folder_bytes(out, f"{c}-*.parquet") for c in (*CONFIGS[dataset], "questions"))
            row.update(
                vs_distinct=folder_bytes(out, "*.parquet") / distinct,
                config_vs_distinct=biggest / distinct,
                dedup_vs_distinct=dedup_bytes(out) / distinct,
            )
        rows.append(row)
    if dataset == "gemex" and (not ways or "naive" in ways):
        naive_path = work / f"naive-{scale}.parquet"
        settle()
        naive = run_child(CHILD_NAIVE, str(source), str(images), str(naive_path))
        embed = next(r for r in rows if r["way"] == "build embed")
        rows.append(
            {
                "dataset": dataset,
                "scale": scale,
                "way": "naive from_generator",
                **naive,
                "output_mb": naive_path.stat().st_size / 1e6,
                "vs_read": naive["seconds"] / read_seconds,
                "vs_copy": naive["seconds"] / copy_seconds,
                "vs_distinct": naive_path.stat().st_size / (image_bytes + text),
                "naive_over_embed": naive_path.stat().st_size / (embed["output_mb"] * 1e6),
            }
        )
    questions = next(r["rows"] for r in rows if r["way"] == "build none")
    print(
        f"{dataset} at scale {scale}: {questions} questions, input {(image_bytes + text) / 1e6:.1f} MB "
        f"(images {image_bytes / 1e6:.1f} MB), read-only {read_seconds:.3f} s, read and copy into one file "
        f"{copy_seconds:.3f} s{' from disk' if cold else ' from the page cache'}",
        flush=True,
    )
    return rows


ROW_KEY = ["dataset", "scale", "way"]
"""The columns that name a row of either table."""


def row_key(r: dict) -> list[str]:
    return [r["dataset"], str(r["scale"]), r["way"]]


def table(rows: list[dict]) -> str:
    head = [*ROW_KEY, "seconds", "records/s", "images/s", "peak MB", "output MB", "x read-only", "x copy"]
    head += ["out/(img+text)", "1 config/(img+text)", "dedup/(img+text)", "naive/embed bytes"]

    def fmt(value, spec="{:.2f}"):
        return "" if value is None else spec.format(value)

    return markdown_table(
        head,
        (
            [*row_key(r), fmt(r["seconds"]), fmt(r["rows"] / r["seconds"], "{:.0f}")]
            + [fmt(r["images"] / r["seconds"] if r["images"] else None, "{:.0f}"), fmt(r["peak_mb"], "{:.0f}")]
            + [fmt(r["output_mb"], "{:.1f}"), fmt(r["vs_read"], "{:.1f}"), fmt(r["vs_copy"], "{:.1f}")]
            + [fmt(r.get("vs_distinct")), fmt(r.get("config_vs_distinct")), fmt(r.get("dedup_vs_distinct"))]
            + [fmt(r.get("naive_over_embed"), "{:.1f}")]
            for r in rows
        ),
    )


def full_scale(work: Path, downscale: int, datasets: list[str], ways: list[str]) -> list[dict]:
    """Text-path builds (`none`, `reference`) at full scale and at a tenth of it, beside json-parsing every record once."""
    rows = []
    for dataset in datasets:
        for scale in (FULL_SCALE[dataset] // 10, FULL_SCALE[dataset]):
            source, images, annotations, _ = release(dataset, scale, work, downscale, images="reference" in ways)
            parse = run_child(CHILD_PARSE, dataset, str(annotations))
            rows.append(
                {
                    "dataset": dataset,
                    "scale": scale,
                    "way": "json-parse every record",
                    **parse,
                    "floor": parse["seconds"],
                }
            )
            headers = None
            if "reference" in ways:  # what a reference build must read beyond the text: each image's header, once
                headers = run_child(CHILD_HEADERS, str(images if dataset == "gemex" else images.parent / "deid_png"))
                rows.append(
                    {
                        "dataset": dataset,
                        "scale": scale,
                        "way": "read every image header once",
                        **headers,
                        "floor": parse["seconds"],
                        "floor_with_images": parse["seconds"] + headers["seconds"],
                    }
                )
            for way in ways:
                out = work / f"out-{dataset}-{scale}-{way}"
                given = "" if way == "none" else str(images)  # as `cxr-vqa build --image-mode none` without --images
                result = run_child(CHILD_BUILD, dataset, str(source), given, str(out), way, "{}")
                rows.append(
                    {
                        "dataset": dataset,
                        "scale": scale,
                        "way": f"build {way}",
                        **result,
                        "floor": parse["seconds"],
                        **({"floor_with_images": parse["seconds"] + headers["seconds"]} if way == "reference" else {}),
                    }
                )
                shutil.rmtree(out)
            print(
                f"{dataset} at scale {scale}: "
                + ", ".join(
                    f"{r['way']} {r['seconds']:.1f} s {r['peak_mb']:.0f} MB"
                    for r in rows
                    if (r["dataset"], r["scale"]) == (dataset, scale)
                ),
                flush=True,
            )
    smaller = {(r["dataset"], r["way"]): r for r in rows if r["scale"] != FULL_SCALE[r["dataset"]]}
    for r in rows:
        r["vs_floor"] = r["seconds"] / r["floor"]
        if "floor_with_images" in r:
            r["vs_floor_with_images"] = r["seconds"] / r["floor_with_images"]
        if r["scale"] == FULL_SCALE[r["dataset"]]:
            r["peak_vs_tenth"] = r["peak_mb"] / smaller[r["dataset"], r["way"]]["peak_mb"]
            r["seconds_vs_tenth"] = r["seconds"] / smaller[r["dataset"], r["way"]]["seconds"]
    return rows


def full_scale_table(rows: list[dict]) -> str:
    head = [*ROW_KEY, "records", "seconds", "peak MB", "x json-parse", "x (json-parse + headers)"]
    head += ["seconds / tenth's", "peak / tenth's"]

    def ratio(r: dict, key: str, spec: str) -> str:
        return spec.format(r[key]) if key in r else ""

    return markdown_table(
        head,
        (
            [*row_key(r), str(r["rows"]), f"{r['seconds']:.1f}", f"{r['peak_mb']:.0f}"]
            + [f"{r['vs_floor']:.1f}", ratio(r, "vs_floor_with_images", "{:.1f}")]
            + [ratio(r, "seconds_vs_tenth", "{:.1f}"), ratio(r, "peak_vs_tenth", "{:.2f}")]
            for r in rows
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", choices=sorted(CONFIGS), default=["gemex", "rexvqa"])
    parser.add_argument("--scales", type=int, nargs="+", default=[200, 2000], help="images (GEMeX) or studies (ReXVQA)")
    parser.add_argument(
        "--downscale",
        type=int,
        help="synthetic images this many times smaller than real per side (default 4; 16 with --full-scale)",
    )
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument(
        "--cold", action="store_true", help="read inputs from disk: evict them from the page cache before each pass"
    )
    parser.add_argument(
        "--ways", nargs="+", help="only these builds (e.g. embed 'embed --image-size 512' naive); `none` always runs"
    )
    parser.add_argument(
        "--full-scale",
        action="store_true",
        help="GEMeX at 151,025 images and ReXVQA at 160,000 studies (and a tenth of each), `none` and `reference` "
        "builds beside json-parsing every record; --downscale defaults to 16; reuse --work between runs",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        if args.full_scale:
            work.mkdir(parents=True, exist_ok=True)
            ways = [w for w in args.ways or ("none", "reference") if w in ("none", "reference")]
            print(full_scale_table(full_scale(work, args.downscale or 16, args.datasets, ways)))
            return
        args.downscale = args.downscale or 4
        rows = [
            row
            for dataset in args.datasets
            for scale in args.scales
            for row in bench(dataset, scale, work, args.downscale, args.cold, args.ways)
        ]
    print(table(rows))


if __name__ == "__main__":
    main()
