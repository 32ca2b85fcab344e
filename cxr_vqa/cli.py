"""`cxr-vqa`: one entry point, subcommands that read like the job.

Exit status 0 on success; otherwise one line on stderr naming what is wrong: 130 after
Ctrl-C (SIGINT), 143 after SIGTERM. Only the standard library is imported at module level,
so an interrupt while the heavy libraries load is caught like any other.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import traceback
from pathlib import Path

from builders.secrets import MaskingArgumentParser, mask_logged_secrets, mask_secrets
from cxr_vqa.options import folder_command


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so the build's cleanup runs as for Ctrl-C."""


def _terminate(signum, frame) -> None:
    raise Terminated()


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option taking a value with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or action.nargs == 0
            or action.default in (None, argparse.SUPPRESS)
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(MaskingArgumentParser):
    """The command's parsers, subcommands included (they are made of the parent's class): masked
    error lines, and every default shown in the help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)


def _build_parser(datasets, name: str, summary: str, options_help: dict[str, str]) -> None:
    from builders.assembly.settings import BuildSettings
    from cxr_vqa.options import add_options

    build = datasets.add_parser(name, help=summary, description=summary)
    add_options(build, BuildSettings, options_help)
    build.set_defaults(func=run_build)


def _print_report(report, out: Path) -> None:
    print(f"{out}: {report.summary()}")
    if report.rejects:
        print(f"rejected records are listed in {out / 'build_report.json'}")


def run_build(args: argparse.Namespace) -> int:
    from builders.assembly.settings import BuildSettings
    from cxr_vqa.options import parsed_options

    if args.dataset == "gemex":
        from gemex_dataset.build import build_gemex as build
    else:
        from rexvqa_dataset.build import build_rexvqa as build
    report = build(parsed_options(BuildSettings, args))
    _print_report(report, args.out)
    return 0


def run_synthesize(args: argparse.Namespace) -> int:
    if args.dataset == "gemex":
        from gemex_dataset.synthetic.release import generate
    else:
        from rexvqa_dataset.synthetic.release import generate
    release = generate(args.out, **{name: getattr(args, name) for name in args.generate_options})
    print(*release.summary(), sep="\n")
    return 0


SYNTHESIZE = {
    "gemex": (
        "GEMeX: all three layouts and chest-X-ray-like JPEGs",
        ("--num-images", 24, "images (the paper: 151025)"),
        (8, "images this many times smaller than MIMIC-CXR's per side"),
        "those a closed-ended 'Yes.' names, in their region",
    ),
    "rexvqa": (
        "ReXVQA: metadata/*_vqa_data.json and 16-bit PNGs under deid_png/",
        ("--num-studies", 20, "studies (the public release: 160000, about 4.09 questions each)"),
        (4, "images this many times smaller per side than the release's 600-800 px PNGs"),
        "those that make a correct option right: a presence question's finding, a negation question's three "
        "present ones, the finding a location, size or differential question is about",
    ),
}
"""Each dataset's `synthesize` parser: its help, its size option (flag, default, help), its `--downscale`
(default, help) and which findings `--plain-findings answered` draws plainly."""


def _synthesize_parser(
    datasets, name: str, summary: str, count: tuple[str, int, str], downscale: tuple[int, str], answered: str
):
    """`synthesize DATASET`'s parser: the options every generator takes, `count` (flag, default, help) the
    release's size, `downscale` (default, help) its images' and `answered` what `--plain-findings answered`
    draws plainly; a dataset's own options are added to it."""
    synth = datasets.add_parser(name, help=summary)
    synth.add_argument("--out", type=Path, required=True, help="the folder to write the release into")
    flag, default, count_help = count
    unit = flag.rsplit("-", 1)[1]
    options = [
        synth.add_argument(flag, type=int, default=default, help=count_help),
        synth.add_argument(
            f"--test-{unit}",
            type=int,
            help=f"{unit} of the test split, out of {flag} (default: the release's share; a held-out set to score "
            "a model trained on the train split)",
        ),
        synth.add_argument("--seed", type=int, default=0, help="the same seed writes the same bytes"),
        synth.add_argument("--downscale", type=int, default=downscale[0], help=downscale[1]),
        synth.add_argument("--num-proc", type=int, default=1, help="worker processes that draw and encode the images"),
        synth.add_argument(
            "--plain-findings",
            nargs="?",
            const="all",
            default="",
            choices=("all", "answered"),
            help="draw findings as large, high-contrast marks, one look per kind, where they are (for probes): "
            f"all of them (the default), or {answered}",
        ),
    ]
    synth.set_defaults(func=run_synthesize, generate_options=[option.dest for option in options])
    return synth


def run_convert(args: argparse.Namespace) -> int:
    from builders.built_folder import refuse_out_inside

    refuse_out_inside(args.dataset, args.out)
    if args.to == "llava":
        from gemex_dataset.conversion import write_llava

        count = write_llava(args.dataset, args.out, split=args.split or "train")
        print(f"{args.out}: {count} LLaVA conversation records")
        return 0
    from builders.pixel_budget import from_arguments
    from cxr_vqa.other_trainers import write_for_trainer

    splits = [args.split] if args.split else None
    written = write_for_trainer(
        args.dataset, args.out, args.to, args.box_convention, from_arguments(args), splits, args.num_proc
    )
    print("\n".join(written.lines(args.out)))
    return 0


def run_attach(args: argparse.Namespace) -> int:
    from builders.built_folder import refuse_out_inside
    from cxr_vqa.attach import attach_images

    refuse_out_inside(args.dataset, args.out)
    report = attach_images(args.dataset, args.image_root, args.out, args.image_mode, args.overwrite)
    _print_report(report, args.out)
    print(f"  annotations from {args.dataset}, images from {args.image_root} ({args.image_mode})")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from cxr_vqa.demo import run_demo as demo

    return demo(args.out, args.num_images)


def run_validate(args: argparse.Namespace) -> int:
    from builders.hub.validate import validate

    problems = validate(args.dataset)
    for problem in problems:
        print(problem.line())
    if problems:
        print(f"{args.dataset}: {len(problems)} problem(s); the Hub's viewer would fail on it", file=sys.stderr)
        return 1
    print(f"{args.dataset}: ready for the Hub and its dataset viewer")
    return 0


def run_preview(args: argparse.Namespace) -> int:
    from builders.hub.preview import PREVIEW_IMAGE, add_preview_config, write_preview

    if not args.out and not args.add_config:
        raise ValueError("give --out FILE.png|FILE.html, or --add-config")
    if args.out:
        written, shown = write_preview(args.dataset, args.out, n=args.n, config=args.config, split=args.split)
        print(f"{written}: {shown} rows")
    if args.add_config:
        target = add_preview_config(args.dataset, n=min(args.n, 16), split=args.split)
        print(f"{target}: the preview config (boxes drawn in); {args.dataset / PREVIEW_IMAGE} shown in the card")
    return 0


def run_publish(args: argparse.Namespace) -> int:
    from builders.hub.publish import plan_publish, publish
    from cxr_vqa.gating import GATING

    plan = plan_publish(
        args.dataset, args.repo, args.visibility, args.revision, args.confirm_public, args.text_licence, GATING
    )
    if args.dry_run:
        print("\n".join(["dry run: nothing is uploaded", *plan.lines()]))
        return 0
    print("\n".join(plan.lines()[:4]))
    url = publish(plan)
    print(f"published {len(plan.files)} files to datasets/{plan.repo_id} ({plan.visibility}): {mask_secrets(url)}")
    return 0


def parser() -> argparse.ArgumentParser:
    root = CommandParser(
        prog="cxr-vqa", description="Chest X-ray VQA datasets (GEMeX, ReXVQA) as typed Hugging Face datasets."
    )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="generate synthetic raw releases and build them (no credentials needed)")
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("cxr-vqa-demo"),
        help="folder for the demo (a rerun replaces what the last demo wrote there, and refuses anything else)",
    )
    demo.add_argument(
        "--num-images", type=int, default=24, help="synthetic GEMeX images to generate (the ReXVQA part is 20 studies)"
    )
    demo.set_defaults(func=run_demo)

    build = commands.add_parser("build", help="build a dataset folder from a raw release")
    datasets = build.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    from gemex_dataset import build as gemex
    from rexvqa_dataset import build as rexvqa

    summaries = {
        "gemex": "GEMeX: any of its three layouts, MIMIC-CXR-JPG (or DICOM) images",
        "rexvqa": "ReXVQA: metadata/*_vqa_data.json, ReXGradient-160K PNG (or DICOM) images",
    }
    for name, package in (("gemex", gemex), ("rexvqa", rexvqa)):
        _build_parser(datasets, name, summaries[name], package.OPTION_HELP)

    synth = commands.add_parser("synthesize", help="write a synthetic raw release in the real formats")
    synth_datasets = synth.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    for name, spec in SYNTHESIZE.items():
        _synthesize_parser(synth_datasets, name, *spec)

    convert = folder_command(
        commands,
        "convert",
        "write a build for another trainer: LLaMA-Factory, ms-swift, or GEMeX's authors' LLaVA JSON",
    )
    convert.add_argument(
        "--to",
        choices=["llava", "llamafactory", "swift"],
        default="llava",
        help="llava: GEMeX's authors' LLaVA conversation JSON (one split, one file); llamafactory: sharegpt JSON "
        "Lines and dataset_info.json; swift: ms-swift's messages JSON Lines, boxes as grounding objects "
        "(docs/other-trainers.md)",
    )
    convert.add_argument(
        "--split",
        help="the split to write (default: train for llava; every split for llamafactory and swift)",
    )
    convert.add_argument(
        "--out", type=Path, required=True, help="the JSON file to write (llava); the folder to write (the others)"
    )
    from builders import pixel_budget
    from builders.box_frame import BOX_CONVENTIONS

    convert.add_argument(
        "--box-convention",
        choices=BOX_CONVENTIONS,
        default="qwen2.5-vl",
        help="llamafactory: how GEMeX boxes are written in the replies, the model family's convention; images are "
        "written at the pixel budget (their stored size for pixels)",
    )
    pixel_budget.add_arguments(convert)
    convert.add_argument(
        "--num-proc", type=int, default=4, help="llamafactory, swift: threads that decode and write the images"
    )
    convert.set_defaults(func=run_convert)

    attach = folder_command(
        commands,
        "attach",
        "build again a folder made without images (--image-mode none, or reference elsewhere) with local images",
    )
    attach.add_argument(
        "--image-root",
        type=Path,
        required=True,
        help="your copy of the images: the folder the rows' image paths are relative to (MIMIC-CXR-JPG's files/, "
        "ReXVQA's metadata/, beside deid_png/)",
    )
    attach.add_argument("--out", type=Path, required=True, help="the dataset folder to write")
    attach.add_argument(
        "--image-mode",
        choices=["reference", "embed"],
        default="reference",
        help="reference: absolute paths to your files; embed: image bytes in the Parquet",
    )
    attach.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    attach.set_defaults(func=run_attach)

    check = folder_command(commands, "validate", "check a built folder is ready for the Hub's dataset viewer")
    check.set_defaults(func=run_validate)

    preview = folder_command(commands, "preview", "draw rows of a built folder, boxes included, as PNG or HTML")
    preview.add_argument("--out", type=Path, help="FILE.png (a grid) or FILE.html (self-contained page)")
    preview.add_argument("--n", type=int, default=16, help="rows to show")
    preview.add_argument("--config", help="the config to read (default: the card's default)")
    preview.add_argument("--split", help="the split to read (default: test)")
    preview.add_argument(
        "--add-config",
        action="store_true",
        help="also add a small `preview` config with boxes drawn into the images, and preview.png to the card",
    )
    preview.set_defaults(func=run_preview)

    from builders.hub.publish import PUBLIC_TEXT_LICENCES

    push = folder_command(commands, "publish", "upload a built folder to a Hub dataset repo under the access rules")
    push.add_argument("--repo", required=True, help="ORG/NAME of the dataset repo")
    access = push.add_mutually_exclusive_group()
    access.add_argument(
        "--private", dest="visibility", action="store_const", const="private", help="private repo (default)"
    )
    access.add_argument(
        "--gated",
        dest="visibility",
        action="store_const",
        const="gated",
        help="gated repo: the card's gating fields, every request approved by hand",
    )
    access.add_argument(
        "--public",
        dest="visibility",
        action="store_const",
        const="public",
        help="public repo: only annotation-only builds (--image-mode none) under a declared licence, or synthetic data",
    )
    push.set_defaults(visibility="private")
    push.add_argument(
        "--confirm-public", action="store_true", help="confirm that --public may make this build downloadable by anyone"
    )
    push.add_argument(
        "--text-licence",
        metavar="NAME",
        help="with --public, a GEMeX build of real data: the licence that allows publishing its MIMIC-derived question "
        f"and reason text; one of {', '.join(PUBLIC_TEXT_LICENCES)} (licences that allow public redistribution)",
    )
    push.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    push.add_argument(
        "--dry-run", action="store_true", help="print the plan (repo settings, files, sizes, card) and upload nothing"
    )
    push.set_defaults(func=run_publish)
    from cxr_vqa import evaluate

    evaluate.add_parser(commands)
    return root


def _error_line(err: Exception) -> str | None:
    """The one line for an error the user can act on; None for a bug (its masked traceback is shown)."""
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
        where = f"{err.filename}: " if err.filename else ""
        full = "the disk is full: " if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else ""
        return f"{where}{full}{err.strerror or str(err).splitlines()[0]}"
    from huggingface_hub.errors import HfHubHTTPError

    from builders.assembly.report import BuildError
    from builders.images import ImageError

    if isinstance(err, HfHubHTTPError):
        return f"the Hub answered: {str(err).splitlines()[0]}"
    if isinstance(err, (BuildError, ImageError, FileNotFoundError, ValueError)):
        return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    mask_logged_secrets()
    previous_handler = signal.signal(signal.SIGTERM, _terminate)
    args = None
    try:
        from builders.stop_points import stop_point

        stop_point("start-up")
        args = parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt as err:
        print(f"cxr-vqa: interrupted (Ctrl-C); {_output_state(err, args)}", file=sys.stderr)
        return 130
    except Terminated as err:
        print(f"cxr-vqa: terminated (SIGTERM); {_output_state(err, args)}", file=sys.stderr)
        return 143
    except Exception as err:  # noqa: BLE001 - every error ends in one masked line, or a bug's masked traceback
        line = _error_line(err)
        if line is None:  # a bug: its traceback, masked too (a key may sit in any value it shows)
            print(mask_secrets("".join(traceback.format_exception(err))), file=sys.stderr, end="")
            return 1
        print(mask_secrets(f"cxr-vqa: error: {line}"), file=sys.stderr)
        from builders.built_folder import UsageError

        return 2 if isinstance(err, UsageError) else 1
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        if argv is None:  # this process is the command: its outcome is told, a Ctrl-C while it exits changes nothing
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _output_state(signal_: BaseException, args: argparse.Namespace | None) -> str:
    """What a signal left on disk: an output already renamed into place (`written`: as the signal arrived,
    `builders.assembly.lifecycle.staged_output`, or by the time Python raised it, `renamed_into_place`) is whole."""
    from builders.assembly.lifecycle import renamed_into_place

    out = getattr(args, "out", None)
    written = getattr(signal_, "written", None) or (out if out and renamed_into_place(out) else None)
    if not written:
        return "no partial output was left behind"
    report = Path(written) / "build_report.json"
    return f"it came after the output was complete: {written} is written whole" + (
        f" (its report: {report})" if report.exists() else ""
    )


if __name__ == "__main__":
    sys.exit(main())
