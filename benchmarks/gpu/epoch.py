"""B.4: hours for one epoch of each full release's train split, from the part's B.1 rows.

An epoch is every training row of the published release in that layout: GEMeX's questions or
images, ReXVQA's questions or studies (the counts the synthetic generators are sized by). Two
figures per layout: at the measured samples/s, and at the MFU target from the measured FLOPs per
sample (what the same tokens would cost at 40% MFU).
"""

from __future__ import annotations

from benchmarks.train_throughput import MFU_TARGET
from gemex_dataset.synthetic.distributions import PAPER_IMAGES, PAPER_QUESTIONS
from rexvqa_dataset.synthetic.profile import PUBLIC_QUESTIONS, PUBLIC_STUDIES, SPLIT_SHARES

GEMEX_TRAIN_SHARE = PAPER_IMAGES["train"] / sum(PAPER_IMAGES.values())
TRAIN_ROWS = {
    ("gemex", "per_question"): round(PAPER_QUESTIONS * GEMEX_TRAIN_SHARE),
    ("gemex", "per_image"): PAPER_IMAGES["train"],
    ("rexvqa", "per_question"): round(PUBLIC_QUESTIONS * SPLIT_SHARES["train"]),
    ("rexvqa", "per_study"): round(PUBLIC_STUDIES * SPLIT_SHARES["train"]),
}


def measured_row(rows: list[dict], dataset: str, layout: str, plan: dict) -> dict | None:
    """The B.1 full fine-tuning row of this layout as the recipe runs by default: the plan's pixel
    budget and default speed-ups (batches grouped by length)."""
    return next(
        (
            r
            for r in rows
            if r["bench"] == "B.1"
            and r["status"] == "ok"
            and r.get("tuning") == "full"
            and r.get("dataset") == dataset
            and r.get("layout") == layout
            and r.get("max_pixels") == plan["max_pixels"]
            and r.get("speedups", []) == plan["train"]["speedups"]
        ),
        None,
    )


def epoch_rows(rows: list[dict], plan: dict) -> list[dict]:
    result = []
    for (dataset, layout), train_rows in TRAIN_ROWS.items():
        facts = {"name": f"{dataset} {layout}", "dataset": dataset, "layout": layout, "train_rows": train_rows}
        row = measured_row(rows, dataset, layout, plan)
        if row is None:
            result.append(
                {**facts, "status": "skipped", "error": "no full fine-tuning B.1 row of this layout in this part"}
            )
            continue
        peak = row["achieved_tflops"] / row["mfu"] if row.get("mfu") else None
        at_target = train_rows * row["flops_per_sample"] / (peak * 1e12 * MFU_TARGET) / 3600 if peak else None
        result.append(
            {
                **facts,
                "status": "ok",
                "from": row["name"],
                "device": row.get("device"),
                "samples_per_s": row["samples_per_s"],
                "hours_per_epoch": train_rows / row["samples_per_s"] / 3600,
                "hours_at_mfu_target": at_target,
                "tokens_per_sample": row["tokens_per_sample"],
            }
        )
    return result
