"""What an embedded build costs on the Hub and on its users' disks, per layout, measured in one run.

    python -m benchmarks.hub_benchmark --images 2000 --rexvqa-downscale 2
    python -m benchmarks.hub_benchmark --images 200 --local-only   # local bytes per layout, in minutes

For each dataset it writes a synthetic release (GEMeX: `--images` images, about 10.6 questions
each; ReXVQA: enough studies for `--images` images, about 1.7 a study), builds it with
`--image-mode embed` in each layout, and measures, all as ratios to the distinct image bytes
stored plus the annotation text (`img+text`):

- `local`: the build's Parquet files on disk;
- `hub`: what the Hub would store: the real Xet client (`hf_xet.upload_files`) uploads the
  folder into a local content store (`local://DIR`), in the commits `cxr-vqa publish` makes
  (`builders.hub.publish.upload_groups`: one per config's shard set, then the card); the bytes
  under `DIR/xet/xorbs/xorbs/` are what it keeps. `hub 1 call` sends every file in one call,
  to show what the grouping buys (files of one call are not deduplicated against each other);
- per config, a consumer's disk after `load_dataset(folder, config)` into an empty cache: the
  config's Parquet files (a Hub download) plus the Arrow cache `datasets` writes, and the load
  time; with `streaming=True` nothing is written, and the time is that of reading every row.

Layouts: `by-config` (the default: each config's files hold its rows, Parquet written with
content-defined chunking), `by-config, no CDC` (the same without it), `shared` (one shard
set per split, configs as Parquet filters; not viewer-correct, for comparison) and
`by-config, no sft_per_image` and `shared, no sft_per_image` (each layout less the
one-conversation-per-image config, GEMeX `sft_per_image` / ReXVQA `sft_per_study`: `--no-conversations`;
what that config adds is the ratio of each layout to it, printed last). The consumer's
`cache / img+text` column is the Arrow cache of a non-streaming load of one config over the distinct
image bytes plus the text. `--local-only` measures the builds' local bytes alone (no Xet upload, no loads).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.tables import markdown_table

LAYOUTS = {
    "by-config": ("by-config", True, True),
    "by-config, no CDC": ("by-config", False, True),
    "shared": ("shared", True, True),
    "by-config, no sft_per_image": ("by-config", True, False),
    "shared, no sft_per_image": ("shared", True, False),
}
"""label: (--shard-layout, content-defined chunking, with the one-conversation-per-image config)."""


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob(pattern) if p.is_file())


def release(dataset: str, images: int, work: Path, downscale: int) -> tuple[Path, Path | None, Path]:
    """(source, image root, annotation files) of a new synthetic release with at least `images` images."""
    if dataset == "gemex":
        from gemex_dataset.synthetic.release import generate

        made = generate(
            work / "gemex-release", num_images=images, downscale=downscale, layouts=("per_type",), num_proc=2
        )
        return made.root / "per_type", made.image_root, made.root / "per_type"
    from rexvqa_dataset.synthetic.release import generate

    made = generate(work / "rexvqa-release", num_studies=math.ceil(images / 1.7), downscale=downscale, num_proc=2)
    return made.root, None, made.root / "metadata"


def build(
    dataset: str, source: Path, images: Path | None, out: Path, layout: str, cdc: bool, conversations: bool = True
) -> float:
    from builders.assembly.settings import BuildSettings
    from builders.assembly.shards import ShardWriter

    if dataset == "gemex":
        from gemex_dataset.build import GemexBuild as Build
    else:
        from rexvqa_dataset.build import RexvqaBuild as Build
    ShardWriter.CONTENT_DEFINED_CHUNKING = cdc
    start = time.perf_counter()
    try:
        Build(
            BuildSettings(
                source=source,
                out=out,
                images=images,
                image_mode="embed",
                shard_layout=layout,
                num_proc=2,
                no_conversations=not conversations,
            )
        ).run()
    finally:
        ShardWriter.CONTENT_DEFINED_CHUNKING = True
    return time.perf_counter() - start


def distinct_images(out: Path) -> tuple[int, int]:
    """(count, bytes) of the distinct images stored in the shards."""
    import pyarrow.parquet as pq

    distinct: dict[bytes, int] = {}
    for path in out.rglob("*.parquet"):
        column = "image" if "image" in pq.read_schema(path).names else "images"
        for value in pq.read_table(path, columns=[column]).column(column).to_pylist():
            for image in value if isinstance(value, list) else [value]:
                distinct[hashlib.blake2b(image["bytes"], digest_size=16).digest()] = len(image["bytes"])
    return len(distinct), sum(distinct.values())


def hub_stored(out: Path, store: Path, grouped: bool = True) -> int:
    """Bytes the Xet store keeps after uploading `out` as `publish` does (or in one call)."""
    import hf_xet

    from builders.hub.publish import planned_files, upload_groups

    files = planned_files(out)
    groups = upload_groups(files) if grouped else [[path for path, _ in files]]
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    for group in groups:
        hf_xet.upload_files([str(out / path) for path in group], "local://" + str(store), None, None, None, "dataset")
    stored = folder_bytes(store / "xet" / "xorbs" / "xorbs")
    shutil.rmtree(store, ignore_errors=True)
    return stored


def consumer(out: Path, work: Path) -> list[dict]:
    """Per config: download (its Parquet files) + Arrow cache after `load_dataset`, and the load times."""
    from datasets import load_dataset

    from builders.built_folder import card_configs, config_shards

    configs, _ = card_configs(out)
    rows = []
    for name, config in configs.items():
        files = {p for paths in config_shards(out, config).values() for p in paths}
        cache = work / f"cache-{name}"
        start = time.perf_counter()
        load_dataset(str(out), name, cache_dir=str(cache))
        loaded = time.perf_counter() - start
        cached = folder_bytes(cache)
        shutil.rmtree(cache, ignore_errors=True)
        start = time.perf_counter()
        for split in load_dataset(str(out), name, streaming=True, cache_dir=str(cache)).values():
            for _ in split:
                pass
        streamed = time.perf_counter() - start
        shutil.rmtree(cache, ignore_errors=True)
        rows.append(
            {
                "config": name,
                "download": sum(p.stat().st_size for p in files),
                "cache": cached,
                "load_s": loaded,
                "stream_s": streamed,
            }
        )
    return rows


def bench(
    dataset: str, images: int, downscale: int, work: Path, layouts_wanted: list[str], loads: bool, hub: bool = True
) -> tuple[list[dict], list[dict]]:
    source, image_root, annotations = release(dataset, images, work, downscale)
    text = folder_bytes(annotations)
    layouts, consumers = [], []
    for label, (layout, cdc, conversations) in ((label, LAYOUTS[label]) for label in layouts_wanted):
        out = work / f"{dataset}-{layout}-{cdc}-{conversations}"
        seconds = build(dataset, source, image_root, out, layout, cdc, conversations=conversations)
        count, image_bytes = distinct_images(out)
        base = image_bytes + text
        row = {
            "dataset": dataset,
            "layout": label,
            "images": count,
            "base_mb": base / 1e6,
            "build_s": seconds,
            "local": folder_bytes(out, "*.parquet") / base,
            "hub": hub_stored(out, work / "xet") / base if hub else math.nan,
            "hub_one_call": hub_stored(out, work / "xet", grouped=False) / base if hub else math.nan,
        }
        layouts.append(row)
        print(f"{dataset} {label}: {row}", file=sys.stderr, flush=True)
        if loads and cdc and conversations:
            for c in consumer(out, work):
                consumers.append(
                    {
                        "dataset": dataset,
                        "layout": label,
                        **c,
                        "disk": (c["download"] + c["cache"]) / base,
                        "cache_ratio": c["cache"] / base,
                    }
                )
        shutil.rmtree(out, ignore_errors=True)
    return layouts, consumers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="images per dataset (at least)")
    parser.add_argument("--datasets", nargs="+", default=["gemex", "rexvqa"], choices=["gemex", "rexvqa"])
    parser.add_argument("--gemex-downscale", type=int, default=4, help="synthetic GEMeX images at 1/N of MIMIC's size")
    parser.add_argument(
        "--rexvqa-downscale", type=int, default=2, help="synthetic ReXVQA images at 1/N of the release's size"
    )
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--no-loads", action="store_true", help="sizes only: skip the consumer's load_dataset")
    parser.add_argument("--local-only", action="store_true", help="local bytes only: no Xet upload, no load_dataset")
    args = parser.parse_args()
    layouts, consumers = [], []
    with tempfile.TemporaryDirectory(prefix="hub-bench-") as tmp:
        for dataset in args.datasets:
            downscale = args.gemex_downscale if dataset == "gemex" else args.rexvqa_downscale
            mine = bench(
                dataset,
                args.images,
                downscale,
                Path(tmp) / dataset,
                args.layouts,
                loads=not (args.no_loads or args.local_only),
                hub=not args.local_only,
            )
            layouts += mine[0]
            consumers += mine[1]
    print("Sizes as ratios to distinct image bytes + annotation text (img+text)\n")
    print(
        markdown_table(
            [
                "dataset",
                "layout",
                "images",
                "img+text MB",
                "build s",
                "local",
                "hub (publish's commits)",
                "hub (1 call)",
            ],
            [
                [
                    r["dataset"],
                    r["layout"],
                    str(r["images"]),
                    f"{r['base_mb']:.1f}",
                    f"{r['build_s']:.1f}",
                    f"{r['local']:.2f}",
                    ratio(r["hub"]),
                    ratio(r["hub_one_call"]),
                ]
                for r in layouts
            ],
        )
    )
    if consumers:
        print(
            "\nA consumer's disk per config: download (its Parquet files) + `load_dataset` Arrow cache; streaming writes nothing\n"
        )
        print(
            markdown_table(
                [
                    "dataset",
                    "layout",
                    "config",
                    "download",
                    "cache",
                    "cache / img+text",
                    "disk (non-streaming)",
                    "disk (streaming)",
                    "load s",
                    "stream s",
                ],
                [
                    [
                        c["dataset"],
                        c["layout"],
                        c["config"],
                        f"{c['download'] / 1e6:.1f} MB",
                        f"{c['cache'] / 1e6:.1f} MB",
                        f"{c['cache_ratio']:.2f}",
                        f"{c['disk']:.2f}",
                        "0.00",
                        f"{c['load_s']:.1f}",
                        f"{c['stream_s']:.1f}",
                    ]
                    for c in consumers
                ],
            )
        )
    print("\nWith the one-conversation-per-image config over the same layout without it (--no-conversations)\n")
    print(
        markdown_table(["dataset", "layout", "local with / without", "hub with / without"], conversation_costs(layouts))
    )
    local = {(r["dataset"], r["layout"]): r["local"] for r in layouts}
    print("\nLocal bytes, shared over by-config\n")
    print(
        markdown_table(
            ["dataset", "conversations", "shared / by-config"],
            [
                [d, label, f"{local[d, 'shared' + suffix] / local[d, 'by-config' + suffix]:.2f}"]
                for d in dict.fromkeys(r["dataset"] for r in layouts)
                for label, suffix in (("with", ""), ("without", ", no sft_per_image"))
                if (d, "shared" + suffix) in local and (d, "by-config" + suffix) in local
            ],
        )
    )


def ratio(value: float, digits: int = 2) -> str:
    """A ratio as the tables print it; `-` where it was not measured (`--local-only`)."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def conversation_costs(layouts: list[dict]) -> list[list[str]]:
    """Per dataset and layout measured both ways: its bytes with the conversation config over those without it."""
    found = {(r["dataset"], r["layout"]): r for r in layouts}
    lines = []
    for (dataset, label), without in found.items():
        if not label.endswith(", no sft_per_image") or (dataset, label.split(",")[0]) not in found:
            continue
        with_them = found[dataset, label.split(",")[0]]
        lines.append(
            [
                dataset,
                label.split(",")[0],
                ratio(with_them["local"] / without["local"], 3),
                ratio(with_them["hub"] / without["hub"], 3),
            ]
        )
    return lines


if __name__ == "__main__":
    main()
