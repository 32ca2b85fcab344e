"""A synthetic ReXVQA raw release in the real layout, with 16-bit chest-X-ray-like PNGs.

No real record or image is used. Everything is deterministic in `seed`: study *i*
depends only on (seed, i), so a release can be made in parallel and at any scale (the
public release: 160,000 studies, 653,834 questions; `PUBLIC_STUDIES`, `PUBLIC_QUESTIONS`).
The per-split counts of the real release are not known; this one puts 80/10/10 percent
of the studies in train, valid and test.

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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from tqdm.auto import tqdm

from builders.images import IMAGE_TAG_KEY
from builders.provenance import ManifestWriter, image_tag
from rexvqa_dataset.features import TASKS

PUBLIC_STUDIES = 160_000
PUBLIC_QUESTIONS = 653_834
QUESTIONS_PER_STUDY = PUBLIC_QUESTIONS / PUBLIC_STUDIES
SPLIT_SHARES = {"train": 0.8, "valid": 0.1, "test": 0.1}
IMAGES_PER_STUDY = (1, 2, 3, 4)
IMAGES_WEIGHTS = (0.45, 0.42, 0.09, 0.04)
"""About 1.7 images per study, as the paper reports."""
TASK_WEIGHTS = (0.40, 0.25, 0.15, 0.12, 0.08)
RELEASE_SIDES = (600, 800)
"""The long and short side range of the release's PNGs (already a quarter of the original)."""
UID_ROOT = "1.2.826.0.1.3680043.8.498"
VIEWS = ("PA", "AP", "LATERAL", "LL", "UNKNOWN")
NOTE_NAME = "SYNTHETIC.md"

SYNTHETIC_NOTE = """# Synthetic ReXVQA release

Made by `cxr-vqa synthesize rexvqa` (rexvqa_dataset/synthetic.py). Every image, report and question
is generated; there is no patient data and no ReXGradient-160K content. Builds made from this folder
say so in their card: SYNTHETIC_MANIFEST.json holds a keyed hash of every annotation file and every
image carries a tag in its metadata (builders/provenance.py). This note itself proves nothing.
"""

FINDINGS = {
    "Lung and Pleural Opacity": ("pleural effusion", "consolidation", "atelectasis", "nodular opacity"),
    "Cardiac and Mediastinal": ("cardiomegaly", "widened mediastinum", "hilar enlargement"),
    "Devices and Lines": ("central venous catheter", "endotracheal tube", "pacemaker leads"),
    "Negation": ("pneumothorax", "pulmonary edema", "rib fracture"),
    "Exam/Patient Information": ("rotated positioning", "low lung volumes", "portable technique"),
}
LOCATIONS = ("right lower lobe", "left lower lobe", "right upper lobe", "left upper lobe", "bilateral bases", "retrocardiac region")


@dataclass
class SyntheticRelease:
    root: Path
    studies: dict[str, int]
    questions: dict[str, int]

    @property
    def metadata(self) -> Path:
        return self.root / "metadata"


def split_sizes(num_studies: int) -> dict[str, int]:
    """Studies per split (`train`, `valid`, `test`), each at least one."""
    valid = max(1, round(num_studies * SPLIT_SHARES["valid"]))
    test = max(1, round(num_studies * SPLIT_SHARES["test"]))
    return {"train": max(1, num_studies - valid - test), "valid": valid, "test": test}


def _uid(rng: random.Random) -> str:
    return f"{UID_ROOT}.{rng.randrange(10**20, 10**21)}"


def _age(rng: random.Random) -> str:
    unit = rng.choices("YMWD", weights=(0.94, 0.03, 0.02, 0.01))[0]
    return f"{rng.randint(18, 95) if unit == 'Y' else rng.randint(1, 11):03d}{unit}"


def _nan_or(rng: random.Random, text: str, nan_rate: float) -> object:
    return float("nan") if rng.random() < nan_rate else text


def _question(rng: random.Random, task: str, finding: str) -> tuple[str, list[str], int, str]:
    location = rng.choice(LOCATIONS)
    if task == "Presence Assessment":
        question, right = f"Is there evidence of {finding} on this chest radiograph?", f"Yes, {finding} is present"
        wrong = ["No, the lungs are clear", f"Only {rng.choice(LOCATIONS)} scarring", "The study is non-diagnostic"]
    elif task == "Location and Distribution Assessment":
        question, right = f"Where is the {finding} located?", f"In the {location}"
        wrong = [f"In the {loc}" for loc in rng.sample([x for x in LOCATIONS if x != location], 3)]
    elif task == "Negation Assessment":
        question, right = "Which finding is NOT present on this radiograph?", finding.capitalize()
        wrong = [f.capitalize() for f in rng.sample([f for fs in FINDINGS.values() for f in fs if f != finding], 3)]
    elif task == "Differential Diagnosis":
        question, right = "What is the most likely diagnosis given the imaging findings?", finding.capitalize()
        wrong = [f.capitalize() for f in rng.sample([f for fs in FINDINGS.values() for f in fs if f != finding], 3)]
    else:
        size = rng.choice(("small", "moderate", "large"))
        question, right = f"What is the size of the {finding}?", f"{size.capitalize()}"
        wrong = [s.capitalize() for s in ("small", "moderate", "large", "trace") if s != size][:3]
    answer = rng.randrange(4)
    texts = wrong[:answer] + [right] + wrong[answer:]
    return question, texts, answer, f"The report describes {finding} in the {location}, which supports '{right}'."


def _pixels(rng: random.Random, width: int, height: int) -> np.ndarray:
    """A 16-bit chest-like picture: dark lungs in a bright body, a spine, noise (12 bits used, as in many CR files)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    cx, cy = width / 2, height * 0.45
    body = 1800 + 900 * np.exp(-(((x - cx) / (width * 0.55)) ** 2))
    for side in (-1, 1):
        lung = (((x - cx - side * width * 0.2) / (width * 0.16)) ** 2 + ((y - cy) / (height * 0.3)) ** 2) < 1
        body = np.where(lung, body - 1100 - rng.randint(0, 200), body)
    body += 1200 * (np.abs(x - cx) < width * 0.035)
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0, 40, (height, width))
    return np.clip(body + noise, 0, 4095).astype(np.uint16)


@dataclass
class SyntheticStudy:
    records: dict[str, dict]
    images: list[tuple[str, int, int, int]]  # (path under the release root, width, height, pixel seed)


def make_study(seed: int, index: int, split: str, downscale: int) -> SyntheticStudy:
    """Study `index` of the release: its questions (id -> record) and the images they name."""
    rng = random.Random(f"rexvqa:{seed}:{index}")
    patient = f"pGRDN{rng.getrandbits(40):010X}"
    accession = f"GRDN{rng.getrandbits(36):09X}"
    study_uid, series_uid = _uid(rng), _uid(rng)
    count = rng.choices(IMAGES_PER_STUDY, weights=IMAGES_WEIGHTS)[0]
    images, paths = [], []
    for _ in range(count):
        long_side, short_side = (rng.randint(*RELEASE_SIDES) // downscale for _ in range(2))
        width, height = sorted((long_side, short_side)) if rng.random() < 0.8 else sorted((long_side, short_side), reverse=True)
        relative = f"deid_png/{patient}/{accession}/studies/{study_uid}/series/{series_uid}/instances/{_uid(rng)}.png"
        images.append((relative, width, height, rng.randrange(2**32)))
        paths.append(f"../{relative}")
    views = [rng.choice(VIEWS) if rng.random() > 0.08 else None for _ in paths]
    if count > 1 and rng.random() < 0.15:
        views = views[: rng.randrange(count)]
    category = rng.choice(list(FINDINGS))
    finding = rng.choice(FINDINGS[category])
    study = {
        "study_id": f"{patient}_{accession}", "ImagePath": paths, "ImageViewPosition": views,
        "PatientAge": _age(rng), "PatientSex": rng.choice("MF"),
        "Indication": _nan_or(rng, rng.choice(("Cough.", "Shortness of breath.", "Fever, rule out pneumonia.")), 0.15),
        "Comparison": _nan_or(rng, "None.", 0.5),
        "Findings": _nan_or(rng, f"There is {finding} in the {rng.choice(LOCATIONS)}. No pneumothorax.", 0.05),
        "Impression": _nan_or(rng, f"{finding.capitalize()}.", 0.05),
        "PatientID": patient, "AccessionNumber": accession, "StudyInstanceUid": study_uid,
        "StudyDate": f"20{rng.randint(10, 23)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}",
        "ImageModality": ["DX" if rng.random() < 0.7 else "CR"] * count, "validation_code": rng.randint(0, 1),
        "class": rng.choice(("normal", "abnormal")), "Manufacturer": rng.choice(("Carestream", "Fujifilm", "GE Healthcare", None)),
        "ImageShape": [[h * downscale, w * downscale] for _, w, h, _ in images], "ImageBodyPart": ["CHEST"] * count,
    }
    questions = max(1, round(rng.gauss(QUESTIONS_PER_STUDY, 1.2)))
    records = {}
    for _q in range(questions):
        task = rng.choices(TASKS, weights=TASK_WEIGHTS)[0]
        question, texts, answer, explanation = _question(rng, task, finding)
        record = {"question": question, "options": [f"{'ABCD'[k]}. {t}" for k, t in enumerate(texts)],
                  "correct_answer": "ABCD"[answer], "correct_answer_explanation": explanation, "task_name": task,
                  "category": "Negation" if task == "Negation Assessment" else category,
                  "subcategory": finding.capitalize()}
        record.update(study)
        records[f"{split}_{rng.getrandbits(48):012x}"] = record
    return SyntheticStudy(records, images)


def _studies(seed: int, first: int, count: int, split: str, downscale: int) -> Iterator[SyntheticStudy]:
    for index in range(first, first + count):
        yield make_study(seed, index, split, downscale)


def _write_images(args: tuple[int, int, int, str, int, str]) -> int:
    """Write the images of `count` studies from `first`; returns `count`."""
    seed, first, count, split, downscale, root = args
    for study in _studies(seed, first, count, split, downscale):
        for relative, width, height, pixel_seed in study.images:
            path = Path(root) / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            tag = PngInfo()
            tag.add_text(IMAGE_TAG_KEY, image_tag(path.name))
            Image.fromarray(_pixels(random.Random(pixel_seed), width, height)).save(path, "PNG", pnginfo=tag)
    return count


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


def generate(out: Path, num_studies: int = 20, seed: int = 0, downscale: int = 4, num_proc: int = 1,
             images: bool = True) -> SyntheticRelease:
    """Write a synthetic release of `num_studies` studies (the public release: 160,000) to `out`.

    About `QUESTIONS_PER_STUDY` (4.09) questions per study, so `PUBLIC_STUDIES` gives
    about `PUBLIC_QUESTIONS`. Images are `downscale` times smaller per side than the
    release's 600-800 px PNGs.
    """
    out = Path(out)
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    (out / NOTE_NAME).write_text(SYNTHETIC_NOTE, encoding="utf-8")
    manifest = ManifestWriter(out, "cxr-vqa synthesize rexvqa")
    sizes = split_sizes(num_studies)
    firsts = dict(zip(sizes, np.cumsum([0, *sizes.values()])[:-1].tolist()))
    questions = {}
    quiet = num_studies < 1024
    with tqdm(desc="synthetic questions", unit="question", disable=quiet or None) as bar:
        for split, count in sizes.items():
            path = out / "metadata" / f"{split}_vqa_data.json"
            questions[split] = write_split(path, _studies(seed, firsts[split], count, split, downscale), bar)
            manifest.add(path)
    manifest.save()
    if images:
        chunks = ((seed, start, min(64, firsts[split] + count - start), split, downscale, str(out))
                  for split, count in sizes.items() for start in range(firsts[split], firsts[split] + count, 64))
        with tqdm(total=sum(sizes.values()), desc="synthetic images", unit="study", disable=quiet or None) as bar:
            if num_proc > 1:
                with ProcessPoolExecutor(num_proc) as pool:
                    for studies in pool.map(_write_images, chunks):
                        bar.update(studies)
            else:
                for chunk in chunks:
                    bar.update(_write_images(chunk))
    return SyntheticRelease(out, sizes, questions)
