"""Do the pixels carry the answer at the probe's resolution? A small net trained on the images alone.

    python -m benchmarks.pixel_signal --gemex BUILD --rexvqa BUILD --out runs/pixel-signal
    python -m benchmarks.pixel_signal --gemex BUILD --out runs/ps --image-sizes 112,224 --epochs 12
    python -m benchmarks.pixel_signal --gemex BUILD --out runs/pt --learner tokens --probe-model PROBE --epochs 10
    python -m benchmarks.pixel_signal --gemex BUILD --out runs/pa --learner attention --probe-model PROBE --epochs 10
    python -m benchmarks.pixel_signal --rexvqa BUILD --out runs/pm --learner matching --probe-model PROBE --epochs 30
    python -m benchmarks.pixel_signal --rexvqa BUILD --out runs/pp --learner pointer --probe-model PROBE \
        --question-kinds "Presence Assessment" --epochs 20
    python -m benchmarks.pixel_signal --rexvqa BUILD --out runs/pv --learner verdicts --probe-model PROBE \
        --question-kinds "Presence Assessment,Negation Assessment" --epochs 4 --text-between 250

Before asking why a VLM probe (`benchmarks/learning_signal.py`) learns nothing from the pixels, ask
whether there is anything to learn at the size it sees them. This trains a plain classifier (CPU, a
minute or two) to answer each question from its image and only what the question names, never its
wording:

- GEMeX closed-ended: the finding and region the question names (and the grade, for a severity
  question) -> "Yes." or "No.";
- ReXVQA: the task (presence, negation, ...) -> one of the row's offered options (each option text one
  output of the net; the study's first image).

`--learner` picks the classifier (`benchmarks/pixel_learners.py`):

- `cnn` (`AnswerNet`): four conv layers; learns where a mark lies through two coordinate channels;
- `grid` (`GridNet`): the image pooled to a coarse grid whose every cell is an input of its own, so where a
  mark lies is given, not learnt;
- `tokens` (`TokensNet`): the grid's perceptron over the image tokens a probe's decoder receives
  (`--probe-model`'s vision tower and connector, frozen); above chance, those tokens carry the answer, and a
  probe that stays at chance falls short in its decoder;
- `attention` (`AttentionNet`): the probe's decoder less its text, two causal attention layers over the same
  frozen tokens and one token for each thing the question names; it must learn, as the probe must, which image
  tokens a question's words point to, and its examples are what that costs;
- `matching` (`MatchingNet`): the attention learner with the offered options as tokens after the task (each
  option's text and letter) and a letter as its answer, where the others score the option texts as outputs: it
  must also tie each option's words to its mark and answer where the option stands, as a ReXVQA reply does;
- `pointer` (`PointerNet`): the matching learner with each option scored from its own token's output: where
  the matching learner falls short of it, the cost is the letter (a later token finding the option that fits
  and copying where it stands), not the reading;
- `verdicts` (`VerdictNet`, ReXVQA): the probe's own decoder and LM head, from `--probe-model`'s weights, over
  the same frozen tokens, each offered option spelt in the probe's tokenizer and followed by its verdict token
  (" yes" / " no"), as a reply that checks each option would be; `--text-between N` puts N fixed tokens between
  the image and the question, as a prompt's words stand there: what the probe's decoder costs, and what the
  prompt's length costs it.

How many examples each needs before it answers held-out questions tells what a mark costs to read from what a
learner's shape costs. `--image-only` withholds what the
questions name: what the image alone says of the answer, before anything in it is tied to the question's words.

Each image is what the probe's processor makes of it (`--image-sizes 112`: the probe's Idefics3
processor, `training_recipes.tiny_model.idefics3_image_processor`, a 112 x 112 square; larger sizes the same
processor at that edge). Idefics3's processor has a fixed input size, so no `PixelBudget` applies to it
(`training_recipes.data.apply_pixel_budget` returns None for it). The images of a build are split into
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

from benchmarks.pixel_learners import (
    AnswerNet,
    AttentionNet,
    GridNet,
    MatchingNet,
    PointerNet,
    TokensNet,
    VerdictNet,
)
from benchmarks.probe_arms import GREY
from benchmarks.probe_model import SIZES
from gemex_dataset.synthetic.distributions import FINDING_BY_NAME, SEVERITIES
from training_recipes.data import to_rgb
from training_recipes.tiny_model import idefics3_image_processor

ARMS = ("images", "blank")
LEARNERS = ("cnn", "grid", "tokens", "attention", "matching", "pointer", "verdicts")
PROBE_LEARNERS = ("tokens", "attention", "matching", "pointer", "verdicts")
"""The learners that read a probe's image tokens (`--probe-model`) rather than its pixels."""
GEMEX_OPTIONS = ("Yes.", "No.")
PROBE_SIZE = SIZES["probe"].image_size
GREY_VIEW = 2 * GREY / 255 - 1
"""The learning-signal arms' blank grey as the probe's processor normalises it (its mean and spread 0.5)."""


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


def probe_tokens(images: torch.Tensor, probe_model: Path, batch: int = 64) -> torch.Tensor:
    """Each image (the probe's grey view, `N x 1 x H x W`) as the probe's decoder receives it: the tokens its
    vision tower and connector make (`N x tokens x width`), standardised feature by feature. An
    Idefics3 probe (`benchmarks.probe_model`); it takes an all-zero image for padding, so a blank arm's zeros are
    encoded as the grey the learning-signal arms' blank images hold."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(probe_model).eval()
    edge = model.config.vision_config.image_size
    if images.shape[-1] != edge:
        raise SystemExit(f"--probe-model {probe_model} sees {edge} px images: give --image-sizes {edge}")
    images = torch.where(images.flatten(1).eq(0).all(1)[:, None, None, None], GREY_VIEW, images)
    encoded = []
    with torch.no_grad():
        for chunk in images.split(batch):
            output = model.model.get_image_features(pixel_values=chunk.expand(-1, 3, -1, -1)[:, None])
            tokens = getattr(output, "pooler_output", output)
            encoded.append(torch.stack(list(tokens)))
    tokens = torch.cat(encoded)
    return (tokens - tokens.mean(0)) / (tokens.std(0) + 1e-6)


def answer_net(
    settings: argparse.Namespace,
    conditions: int,
    options: int,
    image_shape: tuple[int, ...] = (),
    letters: int = 0,
    names: tuple[list[str], list[str]] = ([], []),
) -> nn.Module:
    """The classifier `--learner` names, at `--width` (the CNN's first channels; the grid's and the tokens'
    hidden units / 16; the attention learners' width is the tokens'); `image_shape`: one image's input;
    `letters`: the most options a question offers; `names`: the condition and option texts by id (the verdict
    learner spells them)."""
    if settings.learner == "verdicts":
        return VerdictNet(settings.probe_model, *names, settings.text_between, settings.seed)
    if settings.learner in ("matching", "pointer"):
        net = MatchingNet if settings.learner == "matching" else PointerNet
        return net(image_shape[-1], conditions, options, letters)
    if settings.learner == "attention":
        return AttentionNet(image_shape[-1], conditions, options)
    if settings.learner == "tokens":
        return TokensNet(int(np.prod(image_shape)), conditions, options, 16 * settings.width)
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
    if net.reads_options:
        picked = net(pictures, batch.conditions[rows], options)
    else:
        masks = region_masks(batch.box[rows], *pictures.shape[2:]) if net.region_mask else None
        picked = net(pictures, batch.conditions[rows], masks).gather(1, options.clamp(min=0))
    return picked.masked_fill(options < 0, -1e4)


def answer_loss(net: nn.Module, images: torch.Tensor, batch: Batches, rows: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of each question's answer among its offered options; the verdict learner's own LM loss."""
    if isinstance(net, VerdictNet):
        return net.loss(images[batch.image[rows]], batch.conditions[rows], batch.options[rows], batch.answer[rows])
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
    if settings.learner in PROBE_LEARNERS:
        images = probe_tokens(images, settings.probe_model)
    image_index = {k: i for i, k in enumerate(keys)}
    vocab = {c: i + 1 for i, c in enumerate(sorted({c for q in train for c in q.condition}))}
    option_vocab = {o: i for i, o in enumerate(sorted({o for q in train for o in q.options}))}
    train_batch = tensors(train, image_index, vocab, option_vocab)
    test_batch = tensors(test, image_index, vocab, option_vocab)
    letters = train_batch.options.shape[1]
    names = (sorted(vocab, key=vocab.get), sorted(option_vocab, key=option_vocab.get))
    net = answer_net(settings, len(vocab) + 1, len(option_vocab), tuple(images.shape[1:]), letters, names)
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
    lines = [
        "| dataset | arm | learner | image px | train / held-out questions | train s | train acc | held-out acc "
        "| balanced acc | majority |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.dataset} | {r.arm} | {r.learner} | {r.image_size} | {r.train_questions} / {r.held_out_questions} | {r.seconds:.0f} "
            f"| {r.train_accuracy:.1f} | {r.accuracy:.1f} | {r.balanced_accuracy:.1f} "
            f"| {r.majority:.1f} ({r.majority_answer}) |"
        )
    return "\n".join(lines)


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
        help="cnn: conv layers, position learnt from coordinate channels; grid: a perceptron over a 28 x 28 grid of "
        "cells; tokens: a perceptron over the image tokens --probe-model's frozen vision tower and connector make; "
        "attention: two causal attention layers over the same tokens and what the question names; matching: the "
        "same with the offered options as tokens, answering a letter; pointer: the same, each option scored from "
        "its own token; verdicts: the probe's own decoder, a yes/no token after each option's name (ReXVQA)",
    )
    p.add_argument(
        "--probe-model",
        type=Path,
        help="the Idefics3 probe whose image tokens `--learner tokens|attention|matching|pointer|verdicts` reads, and "
        "whose decoder `verdicts` trains (python -m benchmarks.probe_model, or a probe trained by "
        "sft.py)",
    )
    p.add_argument(
        "--text-between",
        type=int,
        default=0,
        help="--learner verdicts: this many fixed tokens between the image and the question, where a prompt's "
        "words stand (a ReXVQA row's question and options: about 150 of the probe's tokens)",
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
    if a.learner in PROBE_LEARNERS and a.probe_model is None:
        p.error(f"--learner {a.learner} reads a probe's image tokens: give --probe-model MODEL")
    if a.learner in PROBE_LEARNERS and a.region_mask:
        p.error(f"--region-mask is a channel of the image: --learner {a.learner} reads tokens, not pixels")
    if a.learner == "verdicts" and a.gemex:
        p.error("--learner verdicts checks ReXVQA's offered options one by one: give --rexvqa BUILD, not --gemex")
    if a.text_between and a.learner != "verdicts":
        p.error(f"--text-between is text before the verdict learner's question: --learner {a.learner} reads no text")
    if a.text_between < 0:
        p.error(f"--text-between {a.text_between}: a number of tokens, 0 or more")
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
