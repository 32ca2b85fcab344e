"""GEMeX fidelity: a raw synthetic release's figures beside the paper's and the public records', read
with plain Python from the per-type files (as a new user would), and a text-only baseline.
`python -m benchmarks.fidelity` prints them with ReXVQA's.

The public column is measured on ../shared/samples/gemex-public (its test per-type files) when that
folder is there; it is a handful of records, so it locates a figure rather than pins it.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from benchmarks.fidelity_figures import Figure

DATASET = "GEMeX"
TYPES = ("open_ended", "closed_ended", "single_choice", "multi_choice")
SAMPLES = Path(os.environ.get("CXR_VQA_SAMPLES", "/work/shared/samples")) / "gemex-public"
PAPER_QUESTIONS_PER_IMAGE = 1_605_575 / 151_025  # GEMeX Table 3
HEALTHY_REPORT = "No acute cardiopulmonary process."  # what the synthetic report of a healthy image says


def read_split(root: Path, split: str) -> dict[str, list[dict]]:
    """A split's records per question type, from `<root>/<split>/<type>_question.jsonl`."""
    out = {}
    for qtype in TYPES:
        path = root / split / f"{qtype}_question.jsonl"
        out[qtype] = (
            [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            if path.is_file()
            else []
        )
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _share(flags: list[bool]) -> float:
    return _mean([float(f) for f in flags])


def _option_text(choice: str) -> str:
    return choice.split(": ", 1)[-1]


def measures(splits: dict[str, dict[str, list[dict]]]) -> dict[str, float]:
    """Every figure of one release (or of the public samples), by name."""
    test = splits.get("test", {})
    records = [r for split in splits.values() for rs in split.values() for r in rs]
    by_type = {t: [r for split in splits.values() for r in split.get(t, [])] for t in TYPES}
    m: dict[str, float] = {}
    for qtype in TYPES:
        m[f"boxes per question, {qtype}"] = _mean([len(r["visual_locations"]) for r in by_type[qtype]])
    m["most boxes on a question"] = max((len(r["visual_locations"]) for r in records), default=0)
    types = Counter(r["type"] for r in records)
    for ctype in ("abnormality", "size", "implication", "finding"):
        m[f"content type {ctype} share"] = types[ctype] / max(1, len(records))
    for name, split in (("test", test), ("train", splits.get("train", {}))):
        per_image = Counter(r["image_path"] for rs in split.values() for r in rs)
        m[f"{name} questions per image"] = _mean(list(per_image.values()))
    m["test most questions of a type per image"] = max(
        (n for rs in test.values() for n in Counter(r["image_path"] for r in rs).values()), default=0
    )
    m["multi-choice correct options, mean"] = _mean([len(r["answer"]) for r in by_type["multi_choice"]])
    m["multi-choice most correct options"] = max((len(r["answer"]) for r in by_type["multi_choice"]), default=0)
    m["single-choice with 4 options share"] = _share([len(r["choices"]) == 4 for r in by_type["single_choice"]])
    m["closed-ended Yes. share"] = _share([r["answer"] == "Yes." for r in by_type["closed_ended"]])
    options = [_option_text(c) for t in ("single_choice", "multi_choice") for r in by_type[t] for c in r["choices"]]
    m["options that are negations or sizes share"] = _share(
        [bool(re.match(r"(no |absence)|[\d.]+ ?cm", o, re.I)) for o in options]
    )
    regions = Counter(name for r in records for name in r["visual_regions"])
    total = sum(regions.values()) or 1
    m["region bilateral lung share"] = regions["bilateral lung"] / total
    m["region cardiac region share"] = regions["cardiac region"] / total
    m["box area share of the 224 frame"] = _mean(
        [(b[2] - b[0]) * (b[3] - b[1]) / 224**2 for r in records for b in r["visual_locations"]]
    )
    m["distinct question share"] = len({r["question"] for r in records}) / max(1, len(records))
    reasons = [len(r["reason"]) for r in records]
    m["reason length median"] = statistics.median(reasons) if reasons else float("nan")
    m["reasons of 60-150 characters share"] = _share([60 <= n <= 150 for n in reasons])
    images = {r["image_path"]: r["ori_report"] for r in records}
    m["healthy image share"] = _share([HEALTHY_REPORT in text for text in images.values()])
    return m


def region_boxes(splits: dict[str, dict[str, list[dict]]]) -> dict[str, list[float]]:
    """Each region's mean box over a release's records."""
    boxes = defaultdict(list)
    for split in splits.values():
        for rs in split.values():
            for r in rs:
                for name, box in zip(r["visual_regions"], r["visual_locations"]):
                    boxes[name].append(box)
    return {name: [statistics.fmean(b[i] for b in bs) for i in range(4)] for name, bs in boxes.items()}


def distinct_reason_share(split: dict[str, list[dict]]) -> float:
    """Distinct reason strings as a share of the questions' reasons, every type together."""
    reasons = [r["reason"] for rs in split.values() for r in rs]
    return len(set(reasons)) / max(1, len(reasons))


def iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes."""
    width, height = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, width) * max(0.0, height)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def public_box_iou(synthetic: dict[str, list[float]], public: dict[str, dict[str, list[dict]]]) -> float:
    """Mean IoU of each public box with the synthetic mean box of its region: how well one box a region
    (what a model that ignores the image would draw) fits the real boxes."""
    return _mean(
        [
            iou(box, synthetic[name])
            for split in public.values()
            for rs in split.values()
            for r in rs
            for name, box in zip(r["visual_regions"], r["visual_locations"])
            if name in synthetic
        ]
    )


def box_offset(synthetic: dict[str, list[float]], public: dict[str, list[float]]) -> float:
    """Mean absolute distance (224-frame pixels) of the synthetic regions' mean boxes from the public ones'."""
    shared = sorted(set(synthetic) & set(public))
    return _mean([abs(a - b) for name in shared for a, b in zip(synthetic[name], public[name])])


# figure name -> (paper value, where it comes from, low, high); None where the paper gives no number.
TARGETS: dict[str, tuple[float | None, str, float, float]] = {
    "boxes per question, open_ended": (1.04, "GEMeX Table 3 (1.02-1.06)", 1.0, 1.2),
    "boxes per question, closed_ended": (1.04, "GEMeX Table 3 (1.02-1.06)", 1.0, 1.2),
    "boxes per question, single_choice": (1.04, "GEMeX Table 3 (1.02-1.06)", 1.0, 1.2),
    "boxes per question, multi_choice": (1.99, "GEMeX Table 3", 1.69, 2.29),
    "most boxes on a question": (None, "public samples", 4, 4),
    "content type abnormality share": (0.577, "GEMeX Table 3", 0.52, 0.63),
    "content type size share": (None, "GEMeX Table 3 (present)", 0.01, 0.1),
    "content type implication share": (None, "GEMeX Table 3 (present)", 0.01, 0.1),
    "content type finding share": (None, "not a GEMeX type", 0.0, 0.0),
    "test questions per image": (13.2, "GEMeX Table 3", 11.2, 15.2),
    "train questions per image": (round(PAPER_QUESTIONS_PER_IMAGE, 2), "GEMeX Table 3 (all splits)", 9.0, 12.2),
    "test most questions of a type per image": (5, "public samples", 5, 5),
    "multi-choice correct options, mean": (None, "public samples", 2.2, 2.8),
    "multi-choice most correct options": (None, "public samples", 4, 4),
    "single-choice with 4 options share": (None, "public samples", 0.92, 1.0),
    "closed-ended Yes. share": (None, "public samples", 0.24, 0.34),
    "options that are negations or sizes share": (None, "public samples", 0.05, 0.35),
    "region bilateral lung share": (None, "public samples (~36%)", 0.31, 0.41),
    "region cardiac region share": (None, "public samples (~16%)", 0.12, 0.20),
    "box area share of the 224 frame": (None, "public samples (~25%)", 0.17, 0.29),
    "distinct question share": (None, "public samples (~98%)", 0.93, 1.0),
    "reason length median": (None, "GEMeX §3 (60-150) / public 83-98", 83, 98),
    "reasons of 60-150 characters share": (None, 'GEMeX §3 ("mostly")', 0.8, 1.0),
    "healthy image share": (0.125, "GEMeX Fig. 6", 0.09, 0.16),
}


def public_splits() -> dict[str, dict[str, list[dict]]] | None:
    return {"test": read_split(SAMPLES, "test")} if (SAMPLES / "test").is_dir() else None


def figures(release: Path) -> list[Figure]:
    """The GEMeX figures of the raw release at `release` (its root, holding per_type/)."""
    splits = {split: read_split(Path(release) / "per_type", split) for split in ("train", "valid", "test")}
    ours = measures(splits)
    public = public_splits()
    theirs = measures(public) if public else {}
    out = [
        Figure(DATASET, name, ours[name], paper, source, theirs.get(name), low, high)
        for name, (paper, source, low, high) in TARGETS.items()
    ]
    out.append(
        Figure(
            DATASET,
            "distinct reasons share, train",
            distinct_reason_share(splits["train"]),
            None,
            "public records (60% or more)",
            distinct_reason_share(public["test"]) if public else None,
            0.60,
            1.0,
        )
    )
    if public:
        out.append(
            Figure(
                DATASET,
                "public box IoU with its region's mean box, train",
                public_box_iou(region_boxes({"train": splits["train"]}), public),
                None,
                "public samples",
                None,
                0.60,
                1.0,
            )
        )
        out.append(
            Figure(
                DATASET,
                "region mean box offset from public (px)",
                box_offset(region_boxes(splits), region_boxes(public)),
                None,
                "public samples",
                0.0,
                0.0,
                20.0,
            )
        )
    return out


def _text(record: dict) -> str:
    return record["question"] + " || " + " | ".join(record.get("choices", []))


def _held_out(root: Path) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Train's first 80% of images (by first appearance), and the rest of train with valid and test."""
    train = read_split(root, "train")
    images = list(dict.fromkeys(r["image_path"] for rs in train.values() for r in rs))
    fit = set(images[: int(len(images) * 0.8)])
    later = {t: read_split(root, "valid")[t] + read_split(root, "test")[t] for t in TYPES}
    return (
        {t: [r for r in rs if r["image_path"] in fit] for t, rs in train.items()},
        {t: [r for r in rs if r["image_path"] not in fit] + later[t] for t, rs in train.items()},
    )


def text_only_baseline(release: Path) -> list[Figure]:
    """Bag-of-words logistic regression on question and options, fit on train's first 80% of images and
    scored on the rest of train, valid and test, beside the majority answer of the fitted part: per
    question type, accuracy minus majority (<= 0.10 wanted). Multi-choice is scored per option (is this
    option correct?), the others per answer."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    root = Path(release) / "per_type"
    train, held = _held_out(root)
    out = []
    for qtype in ("closed_ended", "single_choice", "multi_choice"):

        def samples(records: list[dict], qtype: str = qtype) -> tuple[list[str], list[str]]:
            if qtype != "multi_choice":
                return [_text(r) for r in records], [str(r["answer"]) for r in records]
            pairs = [
                (r["question"] + " || " + _option_text(c), str(c[0] in r["answer"]))
                for r in records
                for c in r["choices"]
            ]
            return [p[0] for p in pairs], [p[1] for p in pairs]

        x_train, y_train = samples(train[qtype])
        x_test, y_test = samples(held[qtype])
        if not x_test or len(set(y_train)) < 2:
            continue
        vectorizer = CountVectorizer(ngram_range=(1, 2), min_df=2)
        model = LogisticRegression(max_iter=2000).fit(vectorizer.fit_transform(x_train), y_train)
        accuracy = _mean([float(p == y) for p, y in zip(model.predict(vectorizer.transform(x_test)), y_test)])
        majority = Counter(y_train).most_common(1)[0][0]
        prior = _mean([float(y == majority) for y in y_test])
        out.append(
            Figure(
                DATASET,
                f"text-only accuracy minus majority, {qtype}",
                accuracy - prior,
                None,
                f"majority {prior:.3f}, n={len(y_test)}",
                None,
                -1.0,
                0.10,
            )
        )
    return out
