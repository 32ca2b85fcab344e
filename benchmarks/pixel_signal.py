"""Do the pixels carry the answer at the probe's resolution? A small net trained on the images alone.

    python -m benchmarks.pixel_signal --gemex BUILD --rexvqa BUILD --out runs/pixel-signal
    python -m benchmarks.pixel_signal --gemex BUILD --out runs/ps --image-sizes 112,224 --epochs 12
    python -m benchmarks.pixel_signal --rexvqa BUILD --out runs/pg --learner grid --epochs 3

Before asking why a VLM probe (`benchmarks/learning_signal.py`) learns nothing from the pixels, ask
whether there is anything to learn at the size it sees them. This trains a plain classifier (CPU, a
minute or two) to answer each question from its image and only what the question names, never its
wording:

- GEMeX closed-ended: the finding and region the question names (and the grade, for a severity
  question) -> "Yes." or "No.";
- ReXVQA: the task (presence, negation, ...) -> one of the row's offered options (each option text one
  output of the net; the study's first image).

`--learner cnn` (`AnswerNet`) is four conv layers that learn where a mark lies through two coordinate channels;
`--learner grid` (`GridNet`) pools the image to a coarse grid whose every cell is an input of its own, so where a
mark lies is given, not learnt. `--image-only` withholds what the
questions name: what the image alone says of the answer, before anything in it is tied to the question's words.

Each image is what the probe's processor makes of it (`--image-sizes 112`: the probe's Idefics3
processor, `training_recipes.tiny_model.idefics3_image_processor`, a 112 x 112 square; larger sizes the same
processor at that edge). The images of a build are split into
training and held-out ones (`--held-out-share`, by a hash of the image or study id); the same net is also
trained with every image a constant grey (`blank`: what the named finding and region alone predict), and
both are scored on the held-out questions next to the majority answer of the training questions.
`DIR/result.json` holds each run; a table is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image
from torch import nn

from benchmarks.tables import markdown_table
from gemex_dataset.synthetic.distributions import FINDING_BY_NAME, SEVERITIES
from training_recipes.data import to_rgb
from training_recipes.tiny_model import idefics3_image_processor

ARMS = ("images", "blank")
LEARNERS = ("cnn", "grid")
GEMEX_OPTIONS = ("Yes.", "No.")
PROBE_SIZE = 112
"""The probe's image edge (`benchmarks.probe_model.SIZES`)."""


class AnswerNet(nn.Module):
    """A small CNN over the grey image and two coordinate channels (so a region can be found by where it is),
    modulated half-way (FiLM) by the sum of the embeddings of what the question names, max- and mean-pooled,
    then one score per option text."""

    def __init__(self, conditions: int, options: int, width: int = 16, region_mask: bool = False):
        super().__init__()
        self.region_mask = region_mask

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU())

        self.stem = nn.Sequential(
            block(4 if region_mask else 3, width, 2), block(width, 2 * width, 2), block(2 * width, 2 * width, 1)
        )
        self.film = nn.Embedding(conditions, 4 * width)
        nn.init.zeros_(self.film.weight)
        self.head = nn.Sequential(block(2 * width, 4 * width, 2), block(4 * width, 4 * width, 1))
        self.condition = nn.Embedding(conditions, 8 * width)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(8 * width, options))

    def forward(
        self, images: torch.Tensor, conditions: torch.Tensor, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, _, h, w = images.shape
        ys = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(b, 1, h, w)
        xs = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)
        x = self.stem(torch.cat([images, ys, xs] + ([masks] if masks is not None else []), 1))
        gamma, beta = self.film(conditions).sum(1).chunk(2, dim=1)
        x = x * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]
        x = self.head(x)
        pooled = torch.cat([x.amax((2, 3)), x.mean((2, 3))], 1)
        return self.out(pooled + self.condition(conditions).sum(1))


class GridNet(nn.Module):
    """The image (and the named region's mask) averaged over a `grid` x `grid` grid of cells, every cell an input
    of a two-layer perceptron, plus the sum of the embeddings of what the question names; one score per option
    text. A mark's place is where it lands in the input, so nothing about position has to be learnt."""

    def __init__(self, conditions: int, options: int, hidden: int = 256, region_mask: bool = False, grid: int = 28):
        super().__init__()
        self.region_mask, self.grid = region_mask, grid
        self.cells = nn.Linear((2 if region_mask else 1) * grid * grid, hidden)
        self.condition = nn.Embedding(conditions, hidden)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, options))

    def forward(
        self, images: torch.Tensor, conditions: torch.Tensor, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = images if masks is None else torch.cat([images, masks], 1)
        cells = nn.functional.adaptive_avg_pool2d(x, self.grid).flatten(1)
        return self.out(self.cells(cells) + self.condition(conditions).sum(1))


@dataclass
class Question:
    """One question as the classifier sees it: an image key, what the question names, its options and answer."""

    key: str
    condition: tuple[str, ...]
    options: tuple[str, ...]
    answer: int
    kind: str
    box: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)
    """The named region's box as shares of the image's width and height (the whole image where none is named)."""


@dataclass
class Examples:
    """Questions with their images decoded once per image, as the probe's processor resizes them."""

    questions: list[Question]
    images: dict[str, np.ndarray]


@dataclass
class Run:
    dataset: str
    arm: str
    learner: str
    image_size: int
    region_mask: bool
    image_only: bool
    train_questions: int
    held_out_questions: int
    epochs: int
    seconds: float
    accuracy: float
    balanced_accuracy: float
    train_accuracy: float
    majority: float
    majority_answer: str
    per_kind: dict = field(default_factory=dict)


def finding_named(question: str) -> str:
    """The GEMeX finding a closed-ended question names: the longest finding name in it."""
    text = question.lower()
    names = [name for name in FINDING_BY_NAME if name in text]
    if not names:
        raise ValueError(f"closed-ended question names no known finding: {question!r}")
    return max(names, key=len)


def grade_named(question: str) -> str:
    """The grade a severity question asks about ('' for a presence question)."""
    words = set(question.lower().replace("?", " ").split())
    return next((s for s in SEVERITIES if s in words), "")


def parquet_files(build: Path, configs: tuple[str, ...] | None, exclude: str = "sft") -> list[Path]:
    files = sorted((build / "data").rglob("*.parquet"))
    if configs is not None:
        return [p for p in files if p.name.split("-")[0] in configs]
    return [p for p in files if not p.name.startswith(exclude)]


def gemex_questions(build: Path) -> tuple[list[Question], dict[str, bytes]]:
    """The build's closed-ended questions (every split) and each image's stored bytes."""
    questions, images = [], {}
    for path in parquet_files(build, ("closed_ended",)):
        columns = ["dicom_id", "image", "image_width", "image_height", "question", "answer", "regions", "boxes"]
        for row in pq.read_table(path, columns=columns).to_pylist():
            finding = finding_named(row["question"])
            region = row["regions"][0] if row["regions"] else ""
            condition = ("finding:" + finding, "region:" + region, "grade:" + grade_named(row["question"]))
            if row["answer"] not in GEMEX_OPTIONS:
                raise ValueError(f"{path}: question {row['question']!r}: answer {row['answer']!r} is not Yes./No.")
            kind = FINDING_BY_NAME[finding].kind
            x1, y1, x2, y2 = row["boxes"][0] if row["boxes"] else (0, 0, row["image_width"], row["image_height"])
            box = (x1 / row["image_width"], y1 / row["image_height"], x2 / row["image_width"], y2 / row["image_height"])
            answer = GEMEX_OPTIONS.index(row["answer"])
            questions.append(Question(row["dicom_id"], condition, GEMEX_OPTIONS, answer, kind, box))
            images.setdefault(row["dicom_id"], row["image"]["bytes"])
    return questions, images


def rexvqa_questions(build: Path) -> tuple[list[Question], dict[str, bytes]]:
    """The build's multiple-choice questions (every split and task) and each study's first image's bytes."""
    questions, images = [], {}
    for path in parquet_files(build, None):
        table = pq.read_table(path, columns=["study_id", "images", "options", "answer", "task_name_raw"])
        for row in table.to_pylist():
            options = tuple(row["options"])
            answer = ord(row["answer"]) - ord("A")
            if not 0 <= answer < len(options):
                raise ValueError(f"{path}: study {row['study_id']}: answer {row['answer']!r} is not one of its options")
            task = row["task_name_raw"]
            questions.append(Question(row["study_id"], ("task:" + task,), options, answer, task))
            images.setdefault(row["study_id"], row["images"][0]["bytes"])
    return questions, images


def probe_view(encoded: bytes, processor) -> np.ndarray:
    """The image as the probe's processor hands it to the model: one grey channel, normalised to [-1, 1]."""
    with Image.open(io.BytesIO(encoded)) as image:
        rgb = to_rgb(image)
    pixels = processor([[rgb]], return_tensors="np")["pixel_values"]
    return pixels[0, 0, 0].astype(np.float32)


def load(dataset: str, build: Path, image_size: int) -> Examples:
    questions, encoded = (gemex_questions if dataset == "gemex" else rexvqa_questions)(build)
    processor = idefics3_image_processor(image_size)
    return Examples(questions, {key: probe_view(data, processor) for key, data in encoded.items()})


def held_out(key: str, share: float) -> bool:
    """Whether an image (study) is held out: a fixed hash of its id, so every size and arm holds out the same."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def answer_net(settings: argparse.Namespace, conditions: int, options: int) -> nn.Module:
    """The classifier `--learner` names, at `--width` (the CNN's first channels; the grid's hidden units / 16)."""
    if settings.learner == "grid":
        return GridNet(conditions, options, 16 * settings.width, settings.region_mask)
    return AnswerNet(conditions, options, settings.width, settings.region_mask)


@dataclass
class Batches:
    """Questions as tensors: image index, condition ids, option ids (padded with -1), answer position and the
    named region's box (shares of the image)."""

    image: torch.Tensor
    conditions: torch.Tensor
    options: torch.Tensor
    answer: torch.Tensor
    box: torch.Tensor


def tensors(questions: list[Question], image_index: dict[str, int], vocab: dict, option_vocab: dict) -> Batches:
    width = max(len(q.options) for q in questions)
    options = [[option_vocab.get(o, -1) for o in q.options] + [-1] * (width - len(q.options)) for q in questions]
    return Batches(
        torch.tensor([image_index[q.key] for q in questions]),
        torch.tensor([[vocab.get(c, 0) for c in q.condition] for q in questions]),
        torch.tensor(options),
        torch.tensor([q.answer for q in questions]),
        torch.tensor([q.box for q in questions]),
    )


def region_masks(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """One channel per box: 1 inside it, 0 outside (the probe's square view stretches the image, so shares hold)."""
    ys = (torch.arange(height) + 0.5) / height
    xs = (torch.arange(width) + 0.5) / width
    inside_y = (ys[None, :] >= boxes[:, 1:2]) & (ys[None, :] <= boxes[:, 3:4])
    inside_x = (xs[None, :] >= boxes[:, 0:1]) & (xs[None, :] <= boxes[:, 2:3])
    return (inside_y[:, :, None] & inside_x[:, None, :]).float()[:, None]


def option_scores(net: nn.Module, images: torch.Tensor, batch: Batches, rows: torch.Tensor) -> torch.Tensor:
    """Each question's score of each of its offered options (an option never seen in training scores lowest)."""
    pictures = images[batch.image[rows]]
    options = batch.options[rows]
    masks = region_masks(batch.box[rows], *pictures.shape[2:]) if net.region_mask else None
    picked = net(pictures, batch.conditions[rows], masks).gather(1, options.clamp(min=0))
    return picked.masked_fill(options < 0, -1e4)


def answer_loss(net: nn.Module, images: torch.Tensor, batch: Batches, rows: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of each question's answer among its offered options."""
    return nn.functional.cross_entropy(option_scores(net, images, batch, rows), batch.answer[rows])


def predict(net: nn.Module, images: torch.Tensor, batch: Batches, size: int = 256) -> torch.Tensor:
    net.eval()
    with torch.no_grad():
        out = [
            option_scores(net, images, batch, torch.arange(i, min(i + size, len(batch.answer)))).argmax(1)
            for i in range(0, len(batch.answer), size)
        ]
    return torch.cat(out)


def balanced_accuracy(predicted: list[str], truth: list[str]) -> float:
    """The mean over answers of the share of that answer's questions answered right (majority: 1 / answers)."""
    by_answer = defaultdict(list)
    for p, t in zip(predicted, truth, strict=True):
        by_answer[t].append(p == t)
    return 100 * float(np.mean([np.mean(v) for v in by_answer.values()]))


def unnamed(questions: list[Question]) -> list[Question]:
    """The questions with what they name withheld: one condition for all, so only the image tells them apart."""
    return [replace(q, condition=("",)) for q in questions]


def of_kinds(questions: list[Question], kinds: str | None) -> list[Question]:
    """The questions of the comma-separated `kinds` (all where None); a kind the build does not hold is refused
    with the kinds it does."""
    if kinds is None:
        return questions
    wanted, held = set(kinds.split(",")), {q.kind for q in questions}
    if not wanted <= held:
        raise SystemExit(
            f"--question-kinds: no {', '.join(sorted(wanted - held))} in the build; it holds {', '.join(sorted(held))}"
        )
    return [q for q in questions if q.kind in wanted]


def train_and_score(dataset: str, examples: Examples, arm: str, image_size: int, settings: argparse.Namespace) -> Run:
    torch.manual_seed(settings.seed)
    questions = of_kinds(examples.questions, settings.question_kinds)
    questions = unnamed(questions) if settings.image_only else questions
    train = [q for q in questions if not held_out(q.key, settings.held_out_share)]
    test = [q for q in questions if held_out(q.key, settings.held_out_share)]
    if not (train and test):
        raise SystemExit(
            f"{dataset}: {len(train)} training and {len(test)} held-out questions at --held-out-share "
            f"{settings.held_out_share}: need some of each (a larger build or another share)"
        )
    keys = sorted(examples.images)
    stack = np.stack([examples.images[k] for k in keys])[:, None]
    images = torch.from_numpy(np.zeros_like(stack) if arm == "blank" else stack)
    image_index = {k: i for i, k in enumerate(keys)}
    vocab = {c: i + 1 for i, c in enumerate(sorted({c for q in train for c in q.condition}))}
    option_vocab = {o: i for i, o in enumerate(sorted({o for q in train for o in q.options}))}
    train_batch = tensors(train, image_index, vocab, option_vocab)
    test_batch = tensors(test, image_index, vocab, option_vocab)
    net = answer_net(settings, len(vocab) + 1, len(option_vocab))
    optimizer = torch.optim.AdamW(net.parameters(), lr=settings.learning_rate, weight_decay=1e-4)
    steps = settings.epochs * -(-len(train) // settings.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, settings.learning_rate, total_steps=steps)
    start = time.monotonic()
    generator = torch.Generator().manual_seed(settings.seed)
    for _ in range(settings.epochs):
        net.train()
        for rows in torch.randperm(len(train), generator=generator).split(settings.batch_size):
            loss = answer_loss(net, images, train_batch, rows)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    seconds = time.monotonic() - start

    truth = [q.options[q.answer] for q in test]
    predicted = [q.options[int(c)] for q, c in zip(test, predict(net, images, test_batch))]
    fitted = [q.options[int(c)] == q.options[q.answer] for q, c in zip(train, predict(net, images, train_batch))]
    common = Counter(majority_key(dataset, q) for q in train).most_common(1)[0][0]
    majority = 100 * float(np.mean([majority_key(dataset, q) == common for q in test]))
    per_kind = defaultdict(list)
    for q, p, t in zip(test, predicted, truth, strict=True):
        per_kind[q.kind].append(p == t)
    return Run(
        dataset=dataset,
        arm=arm,
        learner=settings.learner,
        image_size=image_size,
        region_mask=settings.region_mask,
        image_only=settings.image_only,
        train_questions=len(train),
        held_out_questions=len(test),
        epochs=settings.epochs,
        seconds=round(seconds, 1),
        accuracy=round(100 * float(np.mean([p == t for p, t in zip(predicted, truth)])), 2),
        balanced_accuracy=round(balanced_accuracy(predicted, truth), 2),
        train_accuracy=round(100 * float(np.mean(fitted)), 2),
        majority=round(majority, 2),
        majority_answer=common,
        per_kind={k: {"questions": len(v), "accuracy": round(100 * float(np.mean(v)), 1)} for k, v in per_kind.items()},
    )


def majority_key(dataset: str, question: Question) -> str:
    """What the majority baseline predicts by: GEMeX's answer ("No."), ReXVQA's letter (`evaluate --baseline
    majority` answers the letter most often right)."""
    return question.options[question.answer] if dataset == "gemex" else chr(65 + question.answer)


def table(runs: list[Run]) -> str:
    head = ["dataset", "arm", "learner", "image px", "train / held-out questions", "train s", "train acc"]
    rows = [
        [r.dataset, r.arm, r.learner, str(r.image_size), f"{r.train_questions} / {r.held_out_questions}"]
        + [f"{r.seconds:.0f}", f"{r.train_accuracy:.1f}", f"{r.accuracy:.1f}", f"{r.balanced_accuracy:.1f}"]
        + [f"{r.majority:.1f} ({r.majority_answer})"]
        for r in runs
    ]
    return markdown_table([*head, "held-out acc", "balanced acc", "majority"], rows)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gemex", type=Path, help="a built GEMeX folder (cxr-vqa build gemex --image-mode embed)")
    p.add_argument("--rexvqa", type=Path, help="a built ReXVQA folder (cxr-vqa build rexvqa --image-mode embed)")
    p.add_argument("--out", type=Path, required=True, help="the folder result.json is written to")
    p.add_argument(
        "--image-sizes",
        default=str(PROBE_SIZE),
        help=f"comma-separated square edges the probe's processor resizes to ({PROBE_SIZE}: the probe's own)",
    )
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated of {', '.join(ARMS)}")
    p.add_argument("--held-out-share", type=float, default=0.25, help="the images (studies) held out for scoring")
    p.add_argument(
        "--learner",
        choices=LEARNERS,
        default="cnn",
        help="cnn: conv layers, position learnt from coordinate channels; grid: a perceptron over a 28 x 28 grid",
    )
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument(
        "--width", type=int, default=16, help="the net's width: the CNN's first channels, the grid's hidden units / 16"
    )
    p.add_argument(
        "--region-mask",
        action="store_true",
        help="also give the net the named region's box as a mask channel (GEMeX): it need not learn where a region is",
    )
    p.add_argument(
        "--image-only",
        action="store_true",
        help="withhold what each question names (finding, region, task): how much the image alone tells the answer",
    )
    p.add_argument(
        "--question-kinds",
        help="comma-separated: only the questions of these kinds (ReXVQA's tasks as stored, 'Presence Assessment'; "
        "GEMeX's finding kinds, 'opacity')",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    a = p.parse_args(argv)
    if not (a.gemex or a.rexvqa):
        p.error("give --gemex BUILD, --rexvqa BUILD or both")
    unknown = set(a.arms.split(",")) - set(ARMS)
    if unknown:
        p.error(f"--arms: unknown {', '.join(sorted(unknown))}; one or more of {', '.join(ARMS)}")
    for name in ("gemex", "rexvqa"):
        build = getattr(a, name)
        if build is not None and not (build / "data").is_dir():
            p.error(f"--{name} {build}: not a built folder (no data/ in it)")
    return a


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    torch.set_num_threads(settings.threads)
    settings.out.mkdir(parents=True, exist_ok=True)
    runs = []
    sizes = [int(s) for s in settings.image_sizes.split(",")]
    for dataset in ("gemex", "rexvqa"):
        build = getattr(settings, dataset)
        if build is None:
            continue
        for size in sizes:
            examples = load(dataset, build, size)
            for arm in settings.arms.split(","):
                run = train_and_score(dataset, examples, arm, size, settings)
                print(
                    f"{dataset} {arm} {size} px: held-out {run.accuracy:.1f} (balanced {run.balanced_accuracy:.1f}), "
                    f"majority {run.majority:.1f}, train {run.train_accuracy:.1f}, {run.seconds:.0f} s",
                    flush=True,
                )
                runs.append(run)
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(settings).items()},
        "runs": [asdict(r) for r in runs],
    }
    (settings.out / "result.json").write_text(json.dumps(result, indent=1))
    print(table(runs))
    print(settings.out / "result.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
