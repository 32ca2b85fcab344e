"""`cxr-vqa`: one entry point, subcommands that read like the job.

Exit status 0 on success; otherwise one line on stderr naming what is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from builders.build import IMAGE_MODES, BuildSettings
from builders.images import ImageError
from builders.report import BuildError


def _add_build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", type=Path, required=True, help="the raw release: a folder (or one annotation file)")
    parser.add_argument("--out", type=Path, required=True, help="the dataset folder to write")
    parser.add_argument("--images", type=Path, help="the folder image paths are relative to (optional with --image-mode none)")
    parser.add_argument("--image-mode", choices=IMAGE_MODES, default="reference",
                        help="reference: absolute paths to your files (default); embed: image bytes in the Parquet; none: no image column")
    parser.add_argument("--image-size", type=int, help="with --image-mode embed: resize so the long side is N pixels (aspect kept)")
    parser.add_argument("--image-ext", help="image files carry this suffix instead of the released one (e.g. dcm for MIMIC-CXR DICOM)")
    parser.add_argument("--keep-16bit", action="store_true", help="embed 16-bit sources as 16-bit PNG instead of windowing them to 8 bits")
    parser.add_argument("--split", help="the split of every file read (default: from train/valid/test folder names)")
    parser.add_argument("--strict", action="store_true", help="fail on the first rejected record instead of reporting it")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    parser.add_argument("--num-proc", type=int, default=1, help="threads that read and encode images")


def _settings(args: argparse.Namespace) -> BuildSettings:
    return BuildSettings(source=args.source, out=args.out, images=args.images, image_mode=args.image_mode,
                         image_size=args.image_size, split=args.split, strict=args.strict, overwrite=args.overwrite,
                         num_proc=args.num_proc, image_ext=args.image_ext, keep_16bit=args.keep_16bit)


def _print_report(report, out: Path) -> None:
    print(f"{out}: {report.summary()}")
    if report.rejects:
        print(f"rejected records are listed in {out / 'build_report.json'}")


def run_build_gemex(args: argparse.Namespace) -> int:
    from gemex_dataset.build import build_gemex

    _print_report(build_gemex(_settings(args)), args.out)
    return 0


def run_synthesize_gemex(args: argparse.Namespace) -> int:
    from gemex_dataset.synthetic import generate

    release = generate(args.out, num_images=args.num_images, seed=args.seed, downscale=args.downscale, num_proc=args.num_proc)
    print(f"{args.out}: synthetic GEMeX release, images per split {release.images}, questions per split {release.questions}")
    print(f"  annotations: {args.out}/per_type, {args.out}/llava, {args.out}/grouped; images: {release.image_root}")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from gemex_dataset.conversion import write_llava

    count = write_llava(args.dataset, args.out, split=args.split)
    print(f"{args.out}: {count} LLaVA conversation records")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from builders.demo import run_demo as demo

    return demo(args.out, args.num_images)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="cxr-vqa", description="Chest X-ray VQA datasets (GEMeX, ReXVQA) as typed Hugging Face datasets.")
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="generate synthetic raw releases and build them (no credentials needed)")
    demo.add_argument("--out", type=Path, default=Path("cxr-vqa-demo"), help="folder for the demo (replaced if it exists)")
    demo.add_argument("--num-images", type=int, default=24, help="synthetic images to generate")
    demo.set_defaults(func=run_demo)

    build = commands.add_parser("build", help="build a dataset folder from a raw release")
    datasets = build.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    gemex = datasets.add_parser("gemex", help="GEMeX: any of its three layouts, MIMIC-CXR-JPG (or DICOM) images")
    _add_build_options(gemex)
    gemex.set_defaults(func=run_build_gemex)

    synth = commands.add_parser("synthesize", help="write a synthetic raw release in the real formats")
    synth_datasets = synth.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    synth_gemex = synth_datasets.add_parser("gemex", help="GEMeX: all three layouts and chest-X-ray-like JPEGs")
    synth_gemex.add_argument("--out", type=Path, required=True)
    synth_gemex.add_argument("--num-images", type=int, default=24, help="images (the paper: 151025)")
    synth_gemex.add_argument("--seed", type=int, default=0)
    synth_gemex.add_argument("--downscale", type=int, default=8, help="images this many times smaller than MIMIC-CXR's per side")
    synth_gemex.add_argument("--num-proc", type=int, default=1)
    synth_gemex.set_defaults(func=run_synthesize_gemex)

    convert = commands.add_parser("convert", help="write a built GEMeX dataset in the authors' LLaVA conversation layout")
    convert.add_argument("--dataset", type=Path, required=True, help="a built GEMeX folder")
    convert.add_argument("--to", choices=["llava"], default="llava")
    convert.add_argument("--split", default="train")
    convert.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    convert.set_defaults(func=run_convert)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (BuildError, ImageError, FileNotFoundError, ValueError) as err:
        print(f"cxr-vqa: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cxr-vqa: interrupted; no output was left behind", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
