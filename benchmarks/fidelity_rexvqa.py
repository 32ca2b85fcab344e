"""How close a synthetic ReXVQA raw release is to the paper and to the public records.

    python -m benchmarks.fidelity_rexvqa --studies 3000 --downscale 8     # makes a release, prints its table
    python -m benchmarks.fidelity_rexvqa --studies 2500 --images          # and whether its images carry the labels
    python -m benchmarks.fidelity_rexvqa --release path/to/release         # measures an existing one

`figures(release)` reads the release's `metadata/*_vqa_data.json` record by record and measures
it against ReXVQA (arXiv 2506.04353), formats.md and `../shared/samples/rexvqa` (the public
column: what those few real paths show); `text_only_baseline(release)` fits a bag-of-words
classifier on the question and each option of the train split and scores it on the test split,
beside chance (25%) and the most frequent answer letter; `image_probe(release)` fits the same kind
of classifier on the pixels of location questions' images instead, to show the images carry the labels.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from benchmarks.fidelity_figures import Figure, markdown_table
from builders.json_stream import Damage, RecordStream, open_text
from rexvqa_dataset.features import TASKS
from rexvqa_dataset.synthetic.profile import (
    ID_PATTERN,
    PUBLIC_QUESTIONS,
    PUBLIC_STUDIES,
    PUBLIC_TEST_QUESTIONS,
    TASK_SHARES,
    UID_SUFFIX_DIGITS,
)

DATASET = "ReXVQA"
ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples" / "rexvqa"
SPLITS = ("train", "valid", "test")
PAPER = "ReXVQA paper"
UID = re.compile(r"^1\.2\.826\.0\.1\.3680043\.8\.498\.(\d+)$")
COMMON_VIEWS = {"PA", "AP", "LATERAL"}
LETTERS = "ABCD"


def records(release: Path, split: str) -> Iterator[tuple[str, dict]]:
    """(question id, record) of one split's file, one at a time (the file may be larger than memory)."""
    with open_text(Path(release) / "metadata" / f"{split}_vqa_data.json") as f:
        for item in RecordStream(f, "object"):
            if isinstance(item, Damage):
                raise ValueError(f"{split}_vqa_data.json: record {item.record}: {item.reason}")
            yield item


def option_texts(record: dict) -> list[str]:
    return [option[3:] for option in record["options"]]


def _is_text(value: object) -> bool:
    return isinstance(value, str)


class Tally:
    """Everything `figures` counts, filled one record at a time."""

    def __init__(self) -> None:
        self.questions, self.split_questions, self.tasks, self.categories = 0, Counter(), Counter(), Counter()
        self.studies: dict[str, tuple[int, list]] = {}
        self.ids_ok = self.ids = self.uids_ok = self.uids = 0
        self.negation_ok = self.negation_checked = 0
        self.subcategory_right = self.subcategory_chance = 0.0
        self.letters = Counter()
        self.right_length = self.wrong_length = 0.0
        self.longest_right = self.longest = 0

    def add(self, record: dict) -> None:
        self.questions += 1
        self.tasks[record["task_name"]] += 1
        self.categories[record["category"]] += 1
        texts, letter = option_texts(record), record["correct_answer"]
        right = texts[LETTERS.index(letter)]
        self.letters[letter] += 1
        subcategory = str(record["subcategory"]).lower()
        self.subcategory_right += subcategory == right.lower()
        self.subcategory_chance += sum(subcategory == t.lower() for t in texts) / len(texts)
        self.right_length += len(right)
        self.wrong_length += sum(len(t) for t in texts if t is not right) / (len(texts) - 1)
        lengths = sorted((len(t) for t in texts), reverse=True)
        if lengths[0] > lengths[1]:
            self.longest += 1
            self.longest_right += len(right) == lengths[0]
        if record["task_name"] == "Negation Assessment" and _is_text(record["Findings"]):
            report = record["Findings"].lower()
            self.negation_checked += 1
            self.negation_ok += right.lower() not in report and all(
                t.lower() in report for t in texts if t is not right
            )
        if record["study_id"] not in self.studies:
            self._add_study(record)

    def _add_study(self, record: dict) -> None:
        self.studies[record["study_id"]] = (len(record["ImagePath"]), list(record["ImageViewPosition"]))
        for key in ("PatientID", "AccessionNumber"):
            self.ids += 1
            self.ids_ok += bool(re.match(ID_PATTERN, str(record.get(key))))
        for uid in uids_of(record["ImagePath"]):
            self.uids += 1
            self.uids_ok += bool((m := UID.match(uid)) and len(m.group(1)) == UID_SUFFIX_DIGITS)


def uids_of(paths: list[str]) -> Iterator[str]:
    """The study, series and instance UIDs of `deid_png/<patient>/<accession>/studies/<uid>/series/<uid>/instances/<uid>.png` paths."""
    for path in paths:
        parts = path.removesuffix(".png").split("/")
        for i, part in enumerate(parts[:-1]):
            if part in ("studies", "series", "instances"):
                yield parts[i + 1]


def public_paths() -> list[str]:
    """The real image paths of the samples (after `deid_png/`), or none where the samples are not here."""
    path = SAMPLES / "rexgradient_real_image_paths.txt"
    if not path.is_file():
        return []
    return [
        line.strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]


def public_figures() -> dict[str, float]:
    """What the sample's real paths show: id pattern, UID length, images per study."""
    paths = public_paths()
    if not paths:
        return {}
    ids = [p.split("/")[k] for p in paths for k in (0, 1)]
    uids = list(uids_of(paths))
    studies = Counter(p.split("/studies/")[1].split("/")[0] for p in paths)
    return {
        "ids": 100 * sum(bool(re.match(ID_PATTERN, i)) for i in ids) / len(ids),
        "uids": 100 * sum(bool((m := UID.match(u)) and len(m.group(1)) == UID_SUFFIX_DIGITS) for u in uids) / len(uids),
        "images": len(paths) / len(studies),
    }


def figures(release: Path) -> list[Figure]:
    """The ReXVQA figures of a raw synthetic release, each beside the paper's and the samples' value."""
    tally = Tally()
    for split in SPLITS:
        for _, record in records(release, split):
            tally.split_questions[split] += 1
            tally.add(record)
    public = public_figures()
    n, studies = tally.questions, tally.studies.values()
    views = [v for _, vs in studies for v in vs]
    named = [v for v in views if v is not None]
    out = [
        Figure(
            DATASET,
            f"task share %: {task}",
            100 * tally.tasks[task] / n,
            100 * TASK_SHARES[task],
            f"{PAPER}, task shares",
            None,
            max(0.0, 100 * TASK_SHARES[task] - 1.5),
            100 * TASK_SHARES[task] + 1.5,
        )
        for task in TASKS
    ]
    test = 100 * PUBLIC_TEST_QUESTIONS / PUBLIC_QUESTIONS
    per_study = PUBLIC_QUESTIONS / PUBLIC_STUDIES
    chance_letter = 100 / len(LETTERS)
    out += [
        Figure(
            DATASET,
            "test split, % of questions",
            100 * tally.split_questions["test"] / n,
            test,
            f"{PAPER}: 40,826 of 653,834",
            None,
            test - 1.5,
            test + 1.5,
        ),
        Figure(
            DATASET,
            "valid split, % of questions",
            100 * tally.split_questions["valid"] / n,
            None,
            "not published; chosen: the test's size",
            None,
            test - 1.5,
            test + 1.5,
        ),
        Figure(
            DATASET,
            "questions per study",
            n / len(tally.studies),
            per_study,
            f"{PAPER}: 653,834 over 160,000 studies",
            None,
            per_study * 0.85,
            per_study * 1.15,
        ),
        Figure(
            DATASET,
            "images per study",
            sum(c for c, _ in studies) / len(tally.studies),
            1.7,
            "ReXGradient-160K via formats.md: about 1.7",
            public.get("images"),
            1.7 * 0.85,
            1.7 * 1.15,
        ),
        Figure(
            DATASET,
            "views PA/AP/LATERAL, % of named views",
            100 * sum(v in COMMON_VIEWS for v in named) / len(named),
            None,
            "chosen: real studies are mostly PA/AP/LATERAL",
            None,
            90.0,
            100.0,
        ),
        Figure(
            DATASET,
            "null views, % of views",
            100 * (len(views) - len(named)) / len(views),
            None,
            "chosen: rare (formats.md lists null)",
            None,
            0.0,
            3.0,
        ),
        Figure(
            DATASET,
            "PatientID/AccessionNumber GRDN+12 [A-Z0-9], %",
            100 * tally.ids_ok / tally.ids,
            None,
            "samples: real image paths",
            public.get("ids"),
            100.0,
            100.0,
        ),
        Figure(
            DATASET,
            f"UIDs with a {UID_SUFFIX_DIGITS}-digit suffix, %",
            100 * tally.uids_ok / tally.uids,
            None,
            "samples: real image paths",
            public.get("uids"),
            100.0,
            100.0,
        ),
        Figure(
            DATASET, "categories", len(tally.categories), 35, "formats.md: about 35 values", None, 35 * 0.85, 35 * 1.15
        ),
        Figure(
            DATASET,
            "negation answers absent from the report, %",
            100 * tally.negation_ok / max(1, tally.negation_checked),
            100.0,
            "the task's definition (the other three present)",
            None,
            100.0,
            100.0,
        ),
        Figure(
            DATASET,
            "subcategory = correct option, points above chance",
            100 * (tally.subcategory_right - tally.subcategory_chance) / n,
            0.0,
            "no leak: as often as for any option",
            None,
            -3.0,
            3.0,
        ),
        Figure(
            DATASET,
            "largest answer-letter share, %",
            100 * max(tally.letters.values()) / n,
            chance_letter,
            "uniform letters",
            None,
            20.0,
            30.0,
        ),
        Figure(
            DATASET,
            "correct / other option length",
            tally.right_length / tally.wrong_length,
            1.0,
            "no leak: options alike",
            None,
            0.9,
            1.1,
        ),
        Figure(
            DATASET,
            "correct option is the longest, %",
            100 * tally.longest_right / max(1, tally.longest),
            chance_letter,
            "no leak: chance",
            None,
            18.0,
            32.0,
        ),
    ]
    return out


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _pair_features(context: str, option: str) -> list[str]:
    """Bag of words of the option, and each question word crossed with each option word (so a linear
    model can learn which options go with which questions, categories and subcategories)."""
    words = _tokens(option)
    return [f"o:{w}" for w in words] + [f"{q}|{w}" for q in set(_tokens(context)) for w in words]


def _context(record: dict) -> str:
    return f"{record['question']} {record['category']} {record['subcategory']}"


def _questions(release: Path, split: str, limit: int) -> list[dict]:
    out = []
    for _, record in records(release, split):
        out.append(
            {
                "context": _context(record),
                "options": option_texts(record),
                "answer": LETTERS.index(record["correct_answer"]),
                "task": record["task_name"],
            }
        )
        if len(out) >= limit:
            break
    return out


def text_only_baseline(release: Path, train_limit: int = 40_000) -> list[Figure]:
    """A text-only classifier against the priors: logistic regression on bag-of-words features of
    (question, category, subcategory) crossed with each option, fit on train (at most `train_limit`
    questions), scored on test by picking the option scored highest; beside chance and the most
    frequent train letter scored on test. Within 10 points of the larger prior means no leak it finds."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train, test = _questions(release, "train", train_limit), _questions(release, "test", math.inf)
    vectorizer = CountVectorizer(analyzer=lambda pair: _pair_features(*pair), binary=True)
    x = vectorizer.fit_transform([(q["context"], o) for q in train for o in q["options"]])
    y = [k == q["answer"] for q in train for k in range(len(q["options"]))]
    model = LogisticRegression(solver="liblinear", C=1.0).fit(x, y)
    scores = model.decision_function(vectorizer.transform([(q["context"], o) for q in test for o in q["options"]]))
    right, start = 0, 0
    for q in test:
        chosen = max(range(len(q["options"])), key=lambda k: scores[start + k])
        right += chosen == q["answer"]
        start += len(q["options"])
    majority = Counter(q["answer"] for q in train).most_common(1)[0][0]
    majority_accuracy = 100 * sum(q["answer"] == majority for q in test) / len(test)
    prior = max(100 / len(LETTERS), majority_accuracy)
    return [
        Figure(
            DATASET,
            "text-only classifier accuracy on test, %",
            100 * right / len(test),
            None,
            "bag-of-words LR on question x option; prior +10",
            None,
            0.0,
            prior + 10,
        ),
        Figure(DATASET, "chance, %", 100 / len(LETTERS), None, "four options", None, 0.0, 100.0),
        Figure(DATASET, "majority train letter on test, %", majority_accuracy, None, "prior", None, 0.0, prior + 10),
    ]


def _location_questions(release: Path, splits: tuple[str, ...]) -> tuple[list, list[int], list[list[int]]]:
    """Pixels (the study's first image at 24 x 32, standardised), answer zone and option zones of each location question."""
    import numpy as np
    from PIL import Image

    from rexvqa_dataset.synthetic.profile import LUNG_ZONES

    pixels, answers, options = [], [], []
    for split in splits:
        for _, record in records(release, split):
            if record["task_name"] != "Location and Distribution Assessment":
                continue
            with Image.open(Path(release) / "metadata" / record["ImagePath"][0]) as image:
                small = np.asarray(Image.fromarray(np.asarray(image, dtype=np.float32)).resize((24, 32)))
            pixels.append(((small - small.mean()) / (small.std() + 1e-6)).ravel())
            zones = [LUNG_ZONES.index(text.lower()) for text in option_texts(record)]
            answers.append(zones[LETTERS.index(record["correct_answer"])])
            options.append(zones)
    return pixels, answers, options


def image_probe(release: Path) -> list[Figure]:
    """Whether the images carry the labels: a linear classifier (ridge) on the pixels of a location
    question's first image, fit on train, scored on valid + test by picking the option zone it rates
    highest. Needs a release with images; tens of location questions per split at least."""
    from sklearn.linear_model import RidgeClassifier

    train_x, train_y, _ = _location_questions(release, ("train",))
    test_x, test_y, test_options = _location_questions(release, ("valid", "test"))
    model = RidgeClassifier(alpha=100.0).fit(train_x, train_y)
    rated = model.decision_function(test_x)
    column = {zone: k for k, zone in enumerate(model.classes_)}
    right = sum(
        max(zones, key=lambda z: rated[i][column[z]] if z in column else -math.inf) == test_y[i]
        for i, zones in enumerate(test_options)
    )
    chance = 100 / len(LETTERS)
    return [
        Figure(
            DATASET,
            "pixel-only classifier on location questions, %",
            100 * right / max(1, len(test_y)),
            None,
            "ridge on 24x32 pixels of the first image; chance +10 or more",
            None,
            chance + 10,
            100.0,
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", type=Path, help="an existing raw release (default: make one)")
    parser.add_argument("--studies", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--downscale", type=int, default=8)
    parser.add_argument(
        "--images",
        action="store_true",
        help="also write the images and measure whether they carry the labels (a pixel-only classifier)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        release = args.release
        if release is None:
            from rexvqa_dataset.synthetic.release import generate

            release = generate(
                Path(work) / "rexvqa",
                num_studies=args.studies,
                seed=args.seed,
                downscale=args.downscale,
                images=args.images,
            ).root
        rows = figures(release) + text_only_baseline(release)
        if (Path(release) / "deid_png").is_dir():
            rows += image_probe(release)
    print(markdown_table(rows))
    return 0 if all(r.within for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
