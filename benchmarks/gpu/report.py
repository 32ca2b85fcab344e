"""`results.md`: the kit's rows (results.jsonl) as one table per benchmark, the commands behind them."""

from __future__ import annotations

from benchmarks.step_profile import describe

COLUMNS: dict[str, list[tuple[str, str]]] = {
    "data": [("name", "step"), ("rows_written", "rows"), ("note", "note")],
    "B.1": [
        ("dataset", "dataset"),
        ("config", "config"),
        ("tuning", "tuning"),
        ("max_pixels", "max pixels"),
        ("speedups", "speed-ups"),
        ("batch_size", "batch"),
        ("samples_per_s", "samples/s"),
        ("tokens_per_s", "tokens/s"),
        ("tokens_per_sample", "tokens/sample"),
        ("mfu", "MFU"),
        ("peak_memory_gb", "peak GiB"),
        ("data_wait_share", "data wait"),
        ("padding_share", "padding"),
        ("missed_targets", "missed"),
    ],
    "B.2": [
        ("dataset", "dataset"),
        ("split", "split"),
        ("variant", "order / cache"),
        ("batch_size", "batch"),
        ("questions", "questions"),
        ("max_new_tokens", "max new tokens"),
        ("questions_per_s", "questions/s"),
        ("peak_memory_gb", "peak GiB"),
    ],
    "B.3": [
        ("name", "step"),
        ("steps", "steps"),
        ("samples_per_s", "samples/s"),
        ("peak_memory_gb", "peak GiB"),
        ("loss_first", "first loss"),
        ("loss_last", "last loss"),
        ("loss_falls", "loss falls"),
        ("replies_scored", "replies"),
        ("failed_extractions", "failed extractions"),
        ("missing", "missing"),
    ],
    "B.4": [
        ("dataset", "dataset"),
        ("layout", "layout"),
        ("train_rows", "train rows"),
        ("from", "from B.1 row"),
        ("samples_per_s", "samples/s"),
        ("hours_per_epoch", "hours/epoch"),
        ("hours_at_mfu_target", "hours at 40% MFU"),
    ],
    "B.5": [
        ("dataset", "dataset"),
        ("arm", "arm"),
        ("size", "probe"),
        ("steps", "steps"),
        ("questions", "questions"),
        ("accuracy", "accuracy"),
        ("both_ways_accuracy", "both ways (GEMeX)"),
    ],
    "B.6": [
        ("layout", "layout"),
        ("images", "images"),
        ("rows", "rows"),
        ("questions", "questions"),
        ("batch_size", "batch"),
        ("steps", "steps"),
        ("questions_per_s", "questions/s"),
        ("loss_first", "first loss"),
        ("loss_last", "last loss"),
        ("held_back_questions", "held-back questions"),
        ("held_back_loss", "held-back loss"),
        ("peak_memory_gb", "peak GiB"),
    ],
}
TITLES = {
    "env": "Environment",
    "data": "Data: full-size synthetic releases, built",
    "B.1": "B.1 Training throughput (benchmarks/train_throughput.py)",
    "B.2": "B.2 Generation throughput (training_recipes.generate)",
    "B.3": "B.3 The whole loop: LoRA fine-tune, predictions, cxr-vqa evaluate",
    "B.4": "B.4 Hours per epoch of the full releases' train splits",
    "B.5": "B.5 Learning signal: a probe trained on images, blank images, or the majority answer (held out)",
    "B.6": "B.6 Per question or per image: the same questions, wall time and loss on the same held-back questions",
}
PERCENT = {"mfu", "data_wait_share", "padding_share"}
RANDOM_WEIGHTS_NOTE = "Random weights: these replies and scores show the loop works, not any medical skill."


def cell(key: str, value) -> str:
    if value is None or value == []:
        return ""
    if key in PERCENT and isinstance(value, float):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, list):
        return "; ".join(map(str, value))
    return str(value).replace("|", "\\|")


def table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    keys = [*columns, ("status", "status"), ("seconds", "s")]
    lines = ["| " + " | ".join(title for _, title in keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(cell(key, row.get(key)) for key, _ in keys) + " |")
    return lines


def results_markdown(rows: list[dict], plan: dict, part: str, tiny: bool) -> str:
    device = next((r.get("device") for r in rows if r.get("device")), plan["device"])
    lines = [
        f"# GPU kit, part {part}{' (--tiny, CPU)' if tiny else ''}",
        "",
        f"Model: {plan['model']} (random weights, offline tokenizer), device: {device}. {RANDOM_WEIGHTS_NOTE}",
        "",
    ]
    for bench, title in TITLES.items():
        chosen = [r for r in rows if r["bench"] == bench]
        if not chosen:
            continue
        lines += [f"## {title}", ""]
        if bench == "env":
            lines += [f"- {r.get('versions') or r.get('error')}" for r in chosen] + [""]
            continue
        lines += table(chosen, COLUMNS[bench]) + [""]
        lines += [f"- `{r['name']}` {r['status']}: {r['error']}" for r in chosen if r.get("error")]
        lines += [
            f"- `{r['name']}` profile: {describe(r['profile_summary'])}" for r in chosen if r.get("profile_summary")
        ]
        lines += [f"\n### Scores: {r['name']}\n\n{r['table']}\n" for r in chosen if r.get("table")]
        lines.append("")
    broken = [r for r in rows if r["bench"] not in TITLES]
    if broken:
        lines += ["## Steps that broke", ""] + [f"- {r['name']}: {r.get('error')}" for r in broken] + [""]
    lines += ["## Commands", ""] + [f"- {r['bench']} {r['name']}: `{r['command']}`" for r in rows if r.get("command")]
    return "\n".join(lines) + "\n"
