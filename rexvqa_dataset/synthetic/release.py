"""A synthetic ReXVQA raw release in the real layout, with 16-bit chest-X-ray-like PNGs.

No real record or image is used. Everything is deterministic in `seed`: study *i*
depends only on (seed, i), so a release can be made in parallel and at any scale (the
public release: 160,000 studies, 653,834 questions; `PUBLIC_STUDIES`, `PUBLIC_QUESTIONS`).
Its distributions (task shares, splits, views, images and findings per study, ids) are
in `profile.py`, each with its source; each study's findings are drawn into its
images (`drawing.py`) where its report and questions put them.

What a reader must cope with is all here: every key formats.md lists (sure, likely
and unsure), bare `NaN` tokens in report fields, options as `"A. text"`, studies of 1
to 4 images, view lists with null entries or shorter than the image list, and
single-channel 16-bit PNGs at a quarter of the release's size on a side (`downscale`).

Layout on disk::

    <out>/metadata/{train,valid,test}_vqa_data.json
    <out>/deid_png/<PatientID>/<AccessionNumber>/studies/<StudyUID>/series/<SeriesUID>/instances/<SOPUID>.png
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from PIL import Image
from PIL.PngImagePlugin import PngInfo
from tqdm.auto import tqdm

from builders.images import IMAGE_TAG_KEY
from builders.provenance import ManifestWriter, image_tag
from builders.synthetic_release import Chunk, ReleaseKind, SyntheticRelease, write_release
from rexvqa_dataset.synthetic.drawing import StudyFinding, chest_pixels
from rexvqa_dataset.synthetic.profile import (
    FINDINGS,
    FINDINGS_PER_STUDY,
    FRONTAL_VIEWS,
    ID_ALPHABET,
    IMAGES_PER_STUDY,
    LATERAL_VIEWS,
    LUNG_ZONES,
    NEGATION_CATEGORY,
    NULL_VIEW_RATE,
    QUESTIONS_PER_STUDY,
    RELEASE_SIDES,
    SHORT_VIEW_LIST_RATE,
    SIDES,
    SIZES,
    SPLIT_SHARES,
    TASK_SHARES,
    UID_ROOT,
    UID_SUFFIX_DIGITS,
    FindingKind,
)
from rexvqa_dataset.synthetic.questions import NEGATION, TASK_WEIGHTS, ask, pick_task, task_weights

SYNTHETIC_NOTE = """# Synthetic ReXVQA release

Made by `cxr-vqa synthesize rexvqa` (rexvqa_dataset/synthetic/). Every image, report and question
is generated; there is no patient data and no ReXGradient-160K content. Builds made from this folder
say so in their card: SYNTHETIC_MANIFEST.json holds a keyed hash of every annotation file and every
image carries a tag in its metadata (builders/provenance.py). This note itself proves nothing.

The findings of each study are drawn into its images where its report and questions put them;
the questions hold no medical knowledge and a score on them shows that a pipeline works, not that
a model reads chest radiographs.
"""
RELEASE = ReleaseKind(
    dataset="rexvqa",
    title="ReXVQA",
    note=SYNTHETIC_NOTE,
    item="study",
    items="studies",
    chunk_size=64,
    annotations=("metadata",),
    images="deid_png",
    image_root="metadata",
)


def split_sizes(num_studies: int, test_studies: int | None = None) -> dict[str, int]:
    """Studies per split (`train`, `valid`, `test`), each at least one; `test_studies` sets the test split's."""
    valid = max(1, round(num_studies * SPLIT_SHARES["valid"]))
    test = max(1, round(num_studies * SPLIT_SHARES["test"])) if test_studies is None else test_studies
    if test_studies is not None and (test < 1 or num_studies - valid - test < 1):
        raise ValueError(f"{test} test studies of {num_studies}: every split needs 1 or more")
    return {"train": max(1, num_studies - valid - test), "valid": valid, "test": test}


def _uid(rng: random.Random) -> str:
    return f"{UID_ROOT}.{rng.randrange(10 ** (UID_SUFFIX_DIGITS - 1), 10**UID_SUFFIX_DIGITS)}"


def _grdn_id(rng: random.Random) -> str:
    return "GRDN" + "".join(rng.choices(ID_ALPHABET, k=12))


def _pick(rng: random.Random, shares: dict) -> object:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


def _age(rng: random.Random) -> str:
    unit = rng.choices("YMWD", weights=(0.94, 0.03, 0.02, 0.01))[0]
    return f"{rng.randint(18, 95) if unit == 'Y' else rng.randint(1, 11):03d}{unit}"


def _nan_or(rng: random.Random, text: str, nan_rate: float) -> object:
    return float("nan") if rng.random() < nan_rate else text


def _views(rng: random.Random, count: int) -> list[str | None]:
    """First image frontal, second lateral, any further one either (chosen: plausible)."""
    views = []
    for k in range(count):
        lateral = k == 1 or (k > 1 and rng.random() < 0.5)
        views.append(None if rng.random() < NULL_VIEW_RATE else _pick(rng, LATERAL_VIEWS if lateral else FRONTAL_VIEWS))
    if count > 1 and rng.random() < SHORT_VIEW_LIST_RATE:
        views = views[: rng.randrange(count)]
    return views


def _findings(rng: random.Random) -> list[StudyFinding]:
    """The study's findings: distinct kinds drawn uniformly, so that no finding is more often present than another."""
    kinds = rng.sample(FINDINGS, _pick(rng, FINDINGS_PER_STUDY))
    places = {"zone": LUNG_ZONES, "side": SIDES, "": ("",)}
    return [StudyFinding(kind, rng.choice(places[kind.where]), rng.randrange(len(SIZES))) for kind in kinds]


@dataclass
class SyntheticStudy:
    records: dict[str, dict]
    images: list[tuple[str, int, int, int]]  # (path under the release root, width, height, pixel seed)
    findings: list[StudyFinding]
    answered: frozenset[FindingKind] = frozenset()
    """The findings that make its questions' answers right (`Question.shows`)."""


def make_study(
    seed: int, index: int, split: str, downscale: int, weights: dict[str, float] = TASK_WEIGHTS
) -> SyntheticStudy:
    """Study `index` of the release: its questions (id -> record), the images they name and the findings those show.

    `weights`: of each task (`task_weights`); the paper's shares unless a release asks for others.
    """
    rng = random.Random(f"rexvqa:{seed}:{index}")
    patient, accession = _grdn_id(rng), _grdn_id(rng)
    study_uid = _uid(rng)
    count = _pick(rng, IMAGES_PER_STUDY)
    images, paths = [], []
    for _ in range(count):
        long_side, short_side = (rng.randint(*RELEASE_SIDES) // downscale for _ in range(2))
        width, height = (
            sorted((long_side, short_side)) if rng.random() < 0.8 else sorted((long_side, short_side), reverse=True)
        )
        relative = f"deid_png/{patient}/{accession}/studies/{study_uid}/series/{_uid(rng)}/instances/{_uid(rng)}.png"
        images.append((relative, width, height, rng.randrange(2**32)))
        paths.append(f"../{relative}")
    findings = _findings(rng)
    study = {
        "study_id": f"{patient}_{accession}",
        "ImagePath": paths,
        "ImageViewPosition": _views(rng, count),
        "PatientAge": _age(rng),
        "PatientSex": rng.choice("MF"),
        "Indication": _nan_or(
            rng, rng.choice(("Cough.", "Shortness of breath.", "Fever, rule out pneumonia.", "Chest pain.")), 0.15
        ),
        "Comparison": _nan_or(rng, "None.", 0.5),
        "Findings": _nan_or(rng, " ".join(f.phrase() for f in findings) + " No other acute abnormality.", 0.05),
        "Impression": _nan_or(rng, findings[0].phrase(), 0.05),
        "PatientID": patient,
        "AccessionNumber": accession,
        "StudyInstanceUid": study_uid,
        "StudyDate": f"20{rng.randint(10, 23)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}",
        "ImageModality": ["DX" if rng.random() < 0.7 else "CR"] * count,
        "validation_code": rng.randint(0, 1),
        "class": "abnormal",
        "Manufacturer": rng.choice(("Carestream", "Fujifilm", "GE Healthcare", None)),
        "ImageShape": [[h * downscale, w * downscale] for _, w, h, _ in images],
        "ImageBodyPart": ["CHEST"] * count,
    }
    records, answered = {}, set()
    for _q in range(max(1, round(rng.gauss(QUESTIONS_PER_STUDY, 1.2)))):
        asked = ask(rng, pick_task(rng, findings, weights), findings, study)
        answered.update(asked.shows)
        record = {
            "question": asked.question,
            "options": [f"{'ABCD'[k]}. {t}" for k, t in enumerate(asked.options)],
            "correct_answer": "ABCD"[asked.answer],
            "correct_answer_explanation": asked.explanation,
            "task_name": asked.task,
            "category": NEGATION_CATEGORY if asked.task == NEGATION else asked.topic.category,
            "subcategory": asked.topic.subcategory,
        }
        record.update(study)
        records[f"{split}_{rng.getrandbits(48):012x}"] = record
    return SyntheticStudy(records, images, findings, frozenset(answered))


def _studies(
    seed: int, first: int, count: int, split: str, downscale: int, weights: dict[str, float] = TASK_WEIGHTS
) -> Iterator[SyntheticStudy]:
    for index in range(first, first + count):
        yield make_study(seed, index, split, downscale, weights)


def plain_kinds(study: SyntheticStudy, plain_findings: str) -> bool | frozenset[FindingKind]:
    """What `chest_pixels` draws plainly: "all" every finding, "answered" those its answers rest on, "" none."""
    return study.answered if plain_findings == "answered" else plain_findings == "all"


def _write_images(
    seed: int, downscale: int, root: str, plain_findings: str, weights: dict[str, float], chunk: Chunk
) -> int:
    """Write the images of one chunk of studies; returns its number of studies. A study's images and findings
    are made before its questions, so they do not depend on the task shares (its plainly drawn answered
    findings do: `weights` are the release's)."""
    for study in _studies(seed, chunk.first, chunk.count, chunk.split, downscale, weights):
        plain = plain_kinds(study, plain_findings)
        for relative, width, height, pixel_seed in study.images:
            path = Path(root) / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            tag = PngInfo()
            tag.add_text(IMAGE_TAG_KEY, image_tag(path.name))
            Image.fromarray(chest_pixels(random.Random(pixel_seed), width, height, study.findings, plain)).save(
                path, "PNG", pnginfo=tag
            )
    return chunk.count


def write_split(path: Path, studies: Iterator[SyntheticStudy], progress: tqdm | None = None) -> int:
    """Write one split's `*_vqa_data.json` as its studies are made, byte for byte as
    `json.dumps(records, indent=1, allow_nan=True)` would; returns its number of questions.

    Question ids are 48 random bits under the split's name, so a repeat (which the whole-file
    dict once merged) is not looked for: at the public release's 653,834 questions its chance is
    below one in a thousand, and keeping every id would make memory grow with the release.
    """
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for study in studies:
            for question_id, record in study.records.items():
                item = json.dumps(record, indent=1, allow_nan=True).replace("\n", "\n ")
                f.write(("{\n " if written == 0 else ",\n ") + json.dumps(question_id) + ": " + item)
                written += 1
            if progress is not None:
                progress.update(len(study.records))
        f.write("\n}" if written else "{}")
    return written


def generate(
    out: Path,
    num_studies: int = 20,
    seed: int = 0,
    downscale: int = 4,
    num_proc: int = 1,
    images: bool = True,
    task_shares: dict[str, float] = TASK_SHARES,
    plain_findings: str = "",
    test_studies: int | None = None,
) -> SyntheticRelease:
    """Write a synthetic release of `num_studies` studies (the public release: 160,000) to `out`, `test_studies`
    of them in the test split (by default the release's share).

    About `QUESTIONS_PER_STUDY` (4.09) questions per study, so `PUBLIC_STUDIES` gives
    about `PUBLIC_QUESTIONS`. Images are `downscale` times smaller per side than the
    release's 600-800 px PNGs. `task_shares` (default: the paper's) lets a release too small
    to hold every task at the paper's mix (a test's, a demo's) ask for another. `plain_findings`
    ("all", or "answered": only the findings that make an answer right, `Question.shows`) draws those
    findings as large, high-contrast marks of their kind (`drawing.draw_plain`; the same questions and
    answers), for probes that must tell the four options apart at a small image size.
    """
    out = Path(out)
    sizes = split_sizes(num_studies, test_studies)
    weights = task_weights(task_shares)
    (out / "metadata").mkdir(parents=True, exist_ok=True)

    def annotations(split: str, first: int, count: int, manifest: ManifestWriter, bar: tqdm) -> int:
        path = out / "metadata" / f"{split}_vqa_data.json"
        written = write_split(path, _studies(seed, first, count, split, downscale, weights), bar)
        manifest.add(path)
        return written

    return write_release(
        out,
        RELEASE,
        sizes,
        annotations,
        partial(_write_images, seed, downscale, str(out), plain_findings, weights) if images else None,
        num_proc,
    )
