"""A synthetic GEMeX raw release, in all three released layouts, with chest-X-ray-like images.

No real record or image is used: report sentences, questions and answers come from small
templates, and each image is drawn from a simple chest model (lungs, heart, spine,
trachea, diaphragm, ribs). Each region's 224-frame box is computed from the drawn
anatomy through the letterbox of `builders.box_frame`, so a built row's boxes sit on
the structure they name. Everything is deterministic in `seed`: image *i* of a release
depends only on (seed, i), so the release can be made in parallel and at any scale.

Layout on disk (MIMIC-CXR-JPG keeps images under `files/`; annotations name them
without that prefix)::

    <out>/files/pNN/pSUBJECT/sSTUDY/<dicom_id>.jpg
    <out>/per_type/<split>/{open_ended,closed_ended,single_choice,multi_choice}_question.jsonl
    <out>/llava/<split>/<split>_conversations.json
    <out>/grouped/<split>/<split>_questions.jsonl + <split>_images.csv
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from builders.box_frame import pixels_to_frame224
from builders.provenance import ManifestWriter, image_tag
from builders.synthetic_release import Chunk, ReleaseKind, SyntheticRelease, write_release
from gemex_dataset.anatomy import region_layout
from gemex_dataset.synthetic.distributions import (
    KEEP_RATE,
    PAPER_IMAGES,
    QUESTIONS_PER_IMAGE,
    TEST_QUESTIONS_PER_IMAGE,
)
from gemex_dataset.synthetic.drawing import draw_chest
from gemex_dataset.synthetic.layouts import LAYOUTS, SplitWriter
from gemex_dataset.synthetic.questions import Findings, QuestionWriter, Shown, described, healthy

MIMIC_SIZES = ((2544, 3056), (2539, 3050), (2544, 3056), (3056, 2544), (2048, 2500), (3050, 2539))

SYNTHETIC_NOTE = """# Synthetic GEMeX release

Made by `cxr-vqa synthesize gemex` (gemex_dataset/synthetic/). Every image, report and question
is generated; there is no patient data and no MIMIC-CXR content. Builds made from this folder say so
in their card: SYNTHETIC_MANIFEST.json holds a keyed hash of every annotation file and every image
carries a tag in its metadata (builders/provenance.py). This note itself proves nothing.
"""
RELEASE = ReleaseKind(
    dataset="gemex",
    title="GEMeX",
    note=SYNTHETIC_NOTE,
    item="image",
    items="images",
    chunk_size=256,
    annotations=LAYOUTS,
    images="files",
    image_root="files",
)


@dataclass
class SyntheticImage:
    """One synthetic MIMIC-CXR-JPG image: its ids, size and the 224-frame box of every region."""

    subject_id: int
    study_id: int
    dicom_id: str
    width: int
    height: int
    region_boxes: dict[str, list[int]]
    layout: dict[str, tuple[float, float, float, float]]  # region -> box as fractions of the image
    shown: list[Shown] = field(default_factory=list)  # the findings drawn into the image
    questions: dict[str, list[dict]] = field(default_factory=dict)  # per type, as the per-type files hold them

    @property
    def image_path(self) -> str:
        s = str(self.subject_id)
        return f"p{s[:2]}/p{s}/s{self.study_id}/{self.dicom_id}.jpg"


def split_sizes(num_images: int, test_images: int | None = None) -> dict[str, int]:
    """Images per split in the paper's proportions, at least two per split; `test_images` sets the test split's
    (refused where it leaves the others fewer than two)."""
    total = sum(PAPER_IMAGES.values())
    test = max(2, round(num_images * PAPER_IMAGES["test"] / total)) if test_images is None else test_images
    valid = max(2, round(num_images * PAPER_IMAGES["valid"] / total))
    if test_images is not None and (test < 1 or num_images - test - valid < 2):
        raise ValueError(f"{test} test images of {num_images}: the test split needs 1 or more, train and valid 2 each")
    return {"train": max(2, num_images - test - valid), "valid": valid, "test": test}


def _chest(rng: random.Random, width: int, height: int) -> dict[str, tuple[float, float, float, float]]:
    layout = region_layout(
        lung_top=rng.uniform(0.1, 0.16),
        lung_bottom=rng.uniform(0.66, 0.74),
        midline=rng.uniform(0.48, 0.52),
        lung_width=rng.uniform(0.40, 0.45),
    )
    squeeze = min(1.0, height / width)  # a landscape detector shows the chest narrower
    return {
        name: (0.5 + (x1 - 0.5) * squeeze, y1, 0.5 + (x2 - 0.5) * squeeze, y2)
        for name, (x1, y1, x2, y2) in layout.items()
    }


def question_counts(rng: random.Random, test: bool) -> dict[str, int]:
    """Questions of each type for one image: the test split's 13.2 an image (up to 5 of a type) or train's."""
    if test:
        return {t: rng.choice(TEST_QUESTIONS_PER_IMAGE[t]) for t in TEST_QUESTIONS_PER_IMAGE}
    return dict(QUESTIONS_PER_IMAGE)


def distinct_question(ask, asked: set[str], tries: int = 20) -> dict:
    """A question `ask` writes whose wording is not in `asked`: a question stands once on an image's type
    (the release has no question twice on one image, and a build rejects the second)."""
    for _ in range(tries):
        q = ask()
        if q["question"] not in asked:
            return q
    raise RuntimeError(f"no new question in {tries} tries: {q['question']!r}")


def plan_questions(image: SyntheticImage, seed: int, index: int, test: bool) -> None:
    """Write the image's questions and decide, as they are asked, the findings it shows."""
    rng = random.Random(f"{seed}/questions/{index}")
    writer = QuestionWriter(rng, Findings(healthy(rng)))
    for qtype, n in question_counts(rng, test).items():
        items = []
        for _ in range(n):
            q = distinct_question(getattr(writer, qtype), {item["question"] for item in items})
            regions = q.pop("regions")
            items.append({**q, "visual_regions": regions, "visual_locations": [image.region_boxes[r] for r in regions]})
        if not test:  # the paper's cleaning removed about 3% of train and valid questions
            items = [q for q in items if rng.random() < KEEP_RATE] or items[:1]
        image.questions[qtype] = items
    image.shown = writer.findings.shown


def make_image(seed: int, index: int, downscale: int, test: bool = False) -> SyntheticImage:
    rng = random.Random(f"{seed}/image/{index}")
    width, height = (side // downscale for side in rng.choice(MIMIC_SIZES))
    layout = _chest(rng, width, height)
    boxes = {
        name: pixels_to_frame224((x1 * width, y1 * height, x2 * width, y2 * height), width, height)
        for name, (x1, y1, x2, y2) in layout.items()
    }
    dicom_id = "-".join(f"{rng.getrandbits(32):08x}" for _ in range(5))
    image = SyntheticImage(
        10_000_000 + rng.randrange(10_000_000),
        50_000_000 + rng.randrange(10_000_000),
        dicom_id,
        width,
        height,
        boxes,
        layout,
    )
    plan_questions(image, seed, index, test)
    return image


def answered_findings(image: SyntheticImage) -> frozenset[Shown]:
    """The findings a closed-ended question of the image answers "Yes." about: its finding in its region."""
    named = set()
    for q in image.questions.get("closed_ended", []):
        if q["answer"] == "Yes.":
            region = q["visual_regions"][0]
            named |= {s for s in image.shown if s.region == region and s.finding in q["question"]}
    return frozenset(named)


def write_image(image: SyntheticImage, image_root: Path, index: int, plain_findings: str = "") -> None:
    path = image_root / image.image_path
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = answered_findings(image) if plain_findings == "answered" else plain_findings == "all"
    draw_chest(image.layout, image.width, image.height, index, image.shown, plain).save(
        path, quality=90, comment=image_tag(path.name)
    )


def report(image: SyntheticImage, rng: random.Random) -> str:
    present = [f"{described(s).capitalize()} in the {s.region}." for s in image.shown]
    return " ".join(
        ["PA and lateral views of the chest."]
        + (present or ["No acute cardiopulmonary process."])
        + ["Synthetic report, not a patient."]
    )


def _split_records(
    seed: int, first: int, count: int, downscale: int, test: bool
) -> Iterator[tuple[SyntheticImage, dict[str, list[dict]], str]]:
    for index in range(first, first + count):
        image = make_image(seed, index, downscale, test)
        yield image, image.questions, report(image, random.Random(f"{seed}/report/{index}"))


def _write_images(seed: int, downscale: int, root: str, plain_findings: str, chunk: Chunk) -> int:
    for index in range(chunk.first, chunk.first + chunk.count):
        write_image(make_image(seed, index, downscale, chunk.split == "test"), Path(root), index, plain_findings)
    return chunk.count


def write_annotations(
    out: Path,
    split: str,
    seed: int,
    first: int,
    count: int,
    downscale: int,
    layouts: tuple[str, ...],
    manifest: ManifestWriter,
    progress: tqdm | None = None,
) -> int:
    """Write one split's annotation files in each layout as its images' questions are made, each file
    then listed in `manifest`; returns the split's number of questions. Memory holds one image's."""
    writer = SplitWriter(out, split, layouts)
    total = 0
    try:
        for row, (image, qs, text) in enumerate(_split_records(seed, first, count, downscale, split == "test")):
            written = writer.add_image(row, image.image_path, qs, text)
            total += written
            if progress is not None:
                progress.update(written)
    finally:
        writer.close(manifest)
    return total


def generate(
    out: Path,
    num_images: int = 24,
    seed: int = 0,
    downscale: int = 8,
    layouts: tuple[str, ...] = LAYOUTS,
    num_proc: int = 1,
    images: bool = True,
    plain_findings: str = "",
    test_images: int | None = None,
) -> SyntheticRelease:
    """Write a synthetic release of `num_images` images (the paper has 151,025) to `out`, `test_images` of
    them in the test split (by default the paper's share: 300 of 151,025).

    Images are `downscale` times smaller than MIMIC-CXR's on each side (8 by default:
    about 318 x 382 for a 2544 x 3056 original). `plain_findings` ("all" or "answered": only
    the findings a closed-ended "Yes." names, the rest drawn as by default) draws those findings as large,
    high-contrast marks of their kind filling their region's box (the same questions and answers), for
    probes that must see the answer at a small image size.
    """
    out = Path(out)
    sizes = split_sizes(num_images, test_images)

    def annotations(split: str, first: int, count: int, manifest: ManifestWriter, bar: tqdm) -> int:
        return write_annotations(out, split, seed, first, count, downscale, layouts, manifest, bar)

    return write_release(
        out,
        RELEASE,
        sizes,
        annotations,
        partial(_write_images, seed, downscale, str(out / RELEASE.images), plain_findings) if images else None,
        num_proc,
    )
