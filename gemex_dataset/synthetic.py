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

import csv
import json
import random
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from tqdm.auto import tqdm

from builders.box_frame import pixels_to_frame224
from builders.provenance import ManifestWriter, image_tag
from gemex_dataset.anatomy import region_layout
from gemex_dataset.prompts import TYPE_PROMPTS

PAPER_IMAGES = {"train": 149_535, "valid": 1_190, "test": 300}
PAPER_QUESTIONS = 1_605_575
QUESTIONS_PER_IMAGE = {"open_ended": 3, "closed_ended": 2, "single_choice": 3, "multi_choice": 3}
KEEP_RATE = PAPER_QUESTIONS / (sum(PAPER_IMAGES.values()) * sum(QUESTIONS_PER_IMAGE.values()))
MIMIC_SIZES = ((2544, 3056), (2539, 3050), (2544, 3056), (3056, 2544), (2048, 2500), (3050, 2539))
LAYOUTS = ("per_type", "llava", "grouped")
LLAVA_Q_TYPES = {t: f"{t}_questions" for t in QUESTIONS_PER_IMAGE}
NOTE_NAME = "SYNTHETIC.md"

SYNTHETIC_NOTE = """# Synthetic GEMeX release

Made by `cxr-vqa synthesize gemex` (gemex_dataset/synthetic.py). Every image, report and question
is generated; there is no patient data and no MIMIC-CXR content. Builds made from this folder say so
in their card: SYNTHETIC_MANIFEST.json holds a keyed hash of every annotation file and every image
carries a tag in its metadata (builders/provenance.py). This note itself proves nothing.
"""

FINDINGS: dict[str, tuple[str, ...]] = {
    "pleural effusion": ("right lower lung zone", "left lower lung zone", "bilateral lower lung zone"),
    "cardiomegaly": ("cardiac region",),
    "pneumothorax": ("right upper lung zone", "left upper lung zone", "left lung"),
    "atelectasis": ("left lower lung zone", "right mid-to-lower lung zone", "bilateral lower lung zone"),
    "consolidation": ("right mid lung zone", "left mid-to-lower lung zone", "right lower lung zone"),
    "pulmonary edema": ("bilateral lung", "bilateral mid-to-upper lung zone"),
    "hilar enlargement": ("bilateral hilar structures", "right hilar structures", "left hilar structures"),
    "tracheal deviation": ("trachea",),
    "degenerative changes": ("spine",),
    "elevated hemidiaphragm": ("right hemidiaphragm", "left hemidiaphragm"),
    "free subdiaphragmatic air": ("abdomen", "right hemidiaphragm"),
    "central venous catheter": ("svc",),
    "widened mediastinum": ("mediastinum",),
    "nodular opacity": ("left mid lung zone", "right upper lung zone", "bilateral mid lung zone"),
}
CONTENT_TYPES = ("abnormality", "disease", "location", "severity", "size", "cause", "implication", "finding")
SEVERITY = ("mild", "moderate", "small", "large", "minimal")


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
    findings: dict[str, str] = field(default_factory=dict)  # finding -> region

    @property
    def image_path(self) -> str:
        s = str(self.subject_id)
        return f"p{s[:2]}/p{s}/s{self.study_id}/{self.dicom_id}.jpg"


@dataclass
class SyntheticRelease:
    """Where a release was written and what it holds."""

    root: Path
    images: dict[str, int]
    questions: dict[str, int]

    @property
    def image_root(self) -> Path:
        return self.root / "files"


def split_sizes(num_images: int) -> dict[str, int]:
    """Images per split in the paper's proportions, at least two per split."""
    total = sum(PAPER_IMAGES.values())
    test = max(2, round(num_images * PAPER_IMAGES["test"] / total))
    valid = max(2, round(num_images * PAPER_IMAGES["valid"] / total))
    return {"train": max(2, num_images - test - valid), "valid": valid, "test": test}


def _chest(rng: random.Random, width: int, height: int) -> dict[str, tuple[float, float, float, float]]:
    layout = region_layout(
        lung_top=rng.uniform(0.08, 0.15), lung_bottom=rng.uniform(0.72, 0.8),
        midline=rng.uniform(0.47, 0.53), lung_width=rng.uniform(0.32, 0.38),
    )
    squeeze = min(1.0, height / width)  # a landscape detector shows the chest narrower
    return {name: (0.5 + (x1 - 0.5) * squeeze, y1, 0.5 + (x2 - 0.5) * squeeze, y2) for name, (x1, y1, x2, y2) in layout.items()}


def draw_chest(layout: dict[str, tuple[float, float, float, float]], width: int, height: int, seed: int) -> Image.Image:
    """A grayscale radiograph-like picture whose structures fill their regions' boxes."""
    def px(name: str) -> tuple[float, float, float, float]:
        x1, y1, x2, y2 = layout[name]
        return x1 * width, y1 * height, x2 * width, y2 * height

    img = Image.new("L", (width, height), 25)
    draw = ImageDraw.Draw(img)
    bl = px("bilateral lung")
    draw.ellipse((bl[0] - 0.08 * width, bl[1] - 0.1 * height, bl[2] + 0.08 * width, height * 1.3), fill=105)
    draw.rectangle(px("abdomen"), fill=150)
    for side in ("right", "left"):
        draw.ellipse(px(f"{side} lung"), fill=45)
        x1, y1, x2, y2 = px(f"{side} hemidiaphragm")
        draw.chord((x1, y1, x2, y2 + (y2 - y1) * 1.5), 180, 360, fill=160)
        draw.rectangle((x1, (y1 + y2) / 2 + (y2 - y1) * 0.25, x2, y2 + (y2 - y1)), fill=155)
    ribs = bl[1]
    step = (bl[3] - bl[1]) / 9
    for k in range(9):
        y = ribs + k * step
        for x1, x2 in ((bl[0], (bl[0] + bl[2]) / 2), ((bl[0] + bl[2]) / 2, bl[2])):
            draw.arc((x1, y, x2, y + step * 2.2), 200, 340, fill=85, width=max(1, width // 120))
    draw.rectangle(px("spine"), fill=135)
    draw.rectangle(px("mediastinum"), fill=150)
    draw.ellipse(px("svc"), fill=165)
    draw.rectangle(px("trachea"), fill=50)
    draw.ellipse(px("cardiac region"), fill=190)
    for side in ("right", "left"):
        x1, y1, x2, y2 = px(f"{side} hilar structures")
        draw.ellipse((x1, y1, x2, y2), fill=120)
    img = img.filter(ImageFilter.GaussianBlur(radius=max(1.0, width / 250)))
    noise = np.random.default_rng(seed).normal(0, 6, (height, width))
    return Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8))


def make_image(seed: int, index: int, downscale: int) -> SyntheticImage:
    rng = random.Random(f"{seed}/image/{index}")
    width, height = (side // downscale for side in rng.choice(MIMIC_SIZES))
    layout = _chest(rng, width, height)
    boxes = {
        name: pixels_to_frame224((x1 * width, y1 * height, x2 * width, y2 * height), width, height)
        for name, (x1, y1, x2, y2) in layout.items()
    }
    dicom_id = "-".join(f"{rng.getrandbits(32):08x}" for _ in range(5))
    image = SyntheticImage(10_000_000 + rng.randrange(10_000_000), 50_000_000 + rng.randrange(10_000_000), dicom_id,
                           width, height, boxes, layout)
    for finding in rng.sample(sorted(FINDINGS), k=rng.randint(1, 3)):
        image.findings[finding] = rng.choice(FINDINGS[finding])
    return image


def write_image(image: SyntheticImage, image_root: Path, index: int) -> None:
    path = image_root / image.image_path
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_chest(image.layout, image.width, image.height, seed=index).save(path, quality=90, comment=image_tag(path.name))


def report(image: SyntheticImage, rng: random.Random) -> str:
    present = [f"There is {rng.choice(SEVERITY)} {finding} in the {region}." for finding, region in image.findings.items()]
    absent = [f"No {finding}." for finding in rng.sample(sorted(set(FINDINGS) - set(image.findings)), k=2)]
    return " ".join(["PA and lateral views of the chest."] + present + absent + ["Synthetic report, not a patient."])


def _regions(image: SyntheticImage, rng: random.Random, main: str) -> tuple[list[str], list[list[int]]]:
    regions = [main] + rng.sample(sorted(set(image.region_boxes) - {main}), k=rng.choice((0, 0, 1, 2)))
    return regions, [image.region_boxes[r] for r in regions]


def questions(image: SyntheticImage, seed: int, index: int) -> dict[str, list[dict]]:
    """The image's questions per format, as the per-type files hold them (without ids and paths)."""
    rng = random.Random(f"{seed}/questions/{index}")
    findings = list(image.findings.items())
    absent = sorted(set(FINDINGS) - set(image.findings))
    out: dict[str, list[dict]] = {t: [] for t in QUESTIONS_PER_IMAGE}
    for k in range(QUESTIONS_PER_IMAGE["open_ended"]):
        finding, region = findings[k % len(findings)]
        regions, boxes = _regions(image, rng, region)
        out["open_ended"].append({
            "question": rng.choice([f"What abnormality is seen in the {region}?", f"What is the likely cause of the opacity in the {region}?", f"How severe is the finding in the {region}?"]),
            "type": rng.choice(("abnormality", "cause", "severity")),
            "answer": f"{rng.choice(SEVERITY).capitalize()} {finding} in the {region}.",
            "reason": f"The {region} shows changes consistent with {finding}.",
            "visual_regions": regions, "visual_locations": boxes,
        })
    for k in range(QUESTIONS_PER_IMAGE["closed_ended"]):
        yes = k % 2 == 0
        finding, region = findings[k % len(findings)] if yes else (rng.choice(absent), rng.choice(sorted(image.region_boxes)))
        if not yes:
            region = FINDINGS[finding][0]
        regions, boxes = _regions(image, rng, region)
        out["closed_ended"].append({
            "question": f"Is there evidence of {finding} in the {region}?",
            "type": rng.choice(("abnormality", "disease")),
            "answer": "Yes." if yes else "No.",
            "reason": f"The {region} {'shows' if yes else 'does not show'} signs of {finding}.",
            "visual_regions": regions, "visual_locations": boxes,
        })
    for k in range(QUESTIONS_PER_IMAGE["single_choice"]):
        finding, region = findings[k % len(findings)]
        n = rng.choice((4, 4, 4, 3, 2))
        options = [finding] + rng.sample(absent, k=n - 1)
        rng.shuffle(options)
        regions, boxes = _regions(image, rng, region)
        out["single_choice"].append({
            "question": f"What is observed in the {region}?",
            "choices": [f"{chr(65 + i)}: {o.capitalize()}" for i, o in enumerate(options)],
            "type": rng.choice(("abnormality", "location", "finding")),
            "answer": chr(65 + options.index(finding)),
            "reason": f"The {region} shows {finding}; the other options are not seen.",
            "visual_regions": regions, "visual_locations": boxes,
        })
    for k in range(QUESTIONS_PER_IMAGE["multi_choice"]):
        chosen = rng.sample(findings, k=rng.randint(1, len(findings)))
        options = [f for f, _ in chosen] + rng.sample(absent, k=4 - len(chosen)) if len(chosen) < 4 else [f for f, _ in chosen][:4]
        rng.shuffle(options)
        letters = sorted(chr(65 + options.index(f)) for f, _ in chosen if f in options)
        regions = list(dict.fromkeys(r for _, r in chosen))[:3]
        out["multi_choice"].append({
            "question": ("Which findings are present in this image?", "Which of these abnormalities are seen?",
                         "Select every finding this radiograph shows.")[k % 3],
            "choices": [f"{chr(65 + i)}: {o.capitalize()}" for i, o in enumerate(options)],
            "type": rng.choice(("finding", "disease", "abnormality")),
            "answer": letters,
            "reason": "The image shows " + ", ".join(f for f, _ in chosen) + ".",
            "visual_regions": regions, "visual_locations": [image.region_boxes[r] for r in regions],
        })
    for qtype, items in out.items():  # the paper's cleaning removed about 3% of questions
        unique = list({json.dumps([q["question"], q.get("choices"), q["answer"]]): q for q in items}.values())
        out[qtype] = [q for q in unique if rng.random() < KEEP_RATE] or unique[:1]
    return out


def _llava_record(q: dict, qtype: str, row: int, image_path: str) -> dict:
    human = f"<image>\n{q['question']}"
    if "choices" in q:
        human += " <choices>: [" + ", ".join(q["choices"]) + "]"
    answer = repr(q["answer"]) if qtype == "multi_choice" else q["answer"]
    gpt = f"<answer> {answer} <reason> {q['reason']} <location> {json.dumps(q['visual_locations'])}"
    return {"conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
            "row_id": row, "q_type": LLAVA_Q_TYPES[qtype], "type_prompt": TYPE_PROMPTS[qtype], "image": image_path}


def _split_records(seed: int, first: int, count: int, downscale: int) -> Iterator[tuple[SyntheticImage, dict[str, list[dict]], str]]:
    for index in range(first, first + count):
        image = make_image(seed, index, downscale)
        yield image, questions(image, seed, index), report(image, random.Random(f"{seed}/report/{index}"))


def _write_images(args: tuple[int, int, int, int, str]) -> int:
    seed, first, count, downscale, root = args
    for index in range(first, first + count):
        write_image(make_image(seed, index, downscale), Path(root), index)
    return count


class JsonArrayWriter:
    """Writes a JSON array one element at a time, byte for byte as `json.dumps(items, indent=1)` would."""

    def __init__(self, path: Path):
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close(), one element at a time
        self.count = 0

    def add(self, item: dict) -> None:
        self.file.write(("[\n " if self.count == 0 else ",\n ") + json.dumps(item, indent=1).replace("\n", "\n "))
        self.count += 1

    def close(self) -> None:
        self.file.write("\n]" if self.count else "[]")
        self.file.close()


class SplitWriter:
    """One split's annotation files in each layout, open while the split's images are generated."""

    def __init__(self, out: Path, split: str, layouts: tuple[str, ...]):
        self.paths: list[Path] = []
        self.per_type: dict[str, object] = {}
        self.llava = self.grouped = self.csv_file = None
        if "per_type" in layouts:
            folder = out / "per_type" / split
            folder.mkdir(parents=True, exist_ok=True)
            self.per_type = {t: self._open(folder / f"{t}_question.jsonl") for t in QUESTIONS_PER_IMAGE}
        if "llava" in layouts:
            folder = out / "llava" / split
            folder.mkdir(parents=True, exist_ok=True)
            self.paths.append(folder / f"{split}_conversations.json")
            self.llava = JsonArrayWriter(self.paths[-1])
        if "grouped" in layouts:
            folder = out / "grouped" / split
            folder.mkdir(parents=True, exist_ok=True)
            self.grouped = self._open(folder / f"{split}_questions.jsonl")
            self.csv_file = self._open(folder / f"{split}_images.csv", newline="")
            self.csv = csv.writer(self.csv_file)
            self.csv.writerow(["mimic_image_file_path"])
        self.counts = dict.fromkeys(QUESTIONS_PER_IMAGE, 0)

    def _open(self, path: Path, **options):
        self.paths.append(path)
        return open(path, "w", encoding="utf-8", **options)

    def add_image(self, row: int, image: SyntheticImage, qs: dict[str, list[dict]], text: str) -> int:
        """Write one image's questions in every layout; returns how many."""
        for qtype, items in qs.items():
            for q in items:
                if self.per_type:  # the release's files end without a trailing newline
                    rec = {"question": q["question"]}
                    if "choices" in q:
                        rec["choices"] = q["choices"]
                    rec.update({k: q[k] for k in ("type", "answer", "reason", "visual_regions", "visual_locations")})
                    rec.update({"image_path": image.image_path, "ori_report": text, "q_id": self.counts[qtype], "row_id": f"row_{row}"})
                    self.per_type[qtype].write(("\n" if self.counts[qtype] else "") + json.dumps(rec))
                if self.llava:
                    self.llava.add(_llava_record(q, qtype, row, image.image_path))
                self.counts[qtype] += 1
        if self.grouped:
            self.grouped.write(json.dumps({f"{t}_questions": [{k: q[k] for k in ("question", "choices", "answer", "reason", "visual_locations") if k in q}
                                                                for q in items] for t, items in qs.items()}) + "\n")
            self.csv.writerow([f"files/{image.image_path}"])
        return sum(len(items) for items in qs.values())

    def close(self, manifest: ManifestWriter) -> None:
        for file in [*self.per_type.values(), self.llava, self.grouped, self.csv_file]:
            if file is not None:
                file.close()
        for path in self.paths:
            manifest.add(path)


def write_annotations(out: Path, split: str, seed: int, first: int, count: int, downscale: int, layouts: tuple[str, ...],
                      manifest: ManifestWriter, progress: tqdm | None = None) -> int:
    """Write one split's annotation files in each layout as its images' questions are made, each file
    then listed in `manifest`; returns the split's number of questions. Memory holds one image's."""
    writer = SplitWriter(out, split, layouts)
    total = 0
    try:
        for row, (image, qs, text) in enumerate(_split_records(seed, first, count, downscale)):
            written = writer.add_image(row, image, qs, text)
            total += written
            if progress is not None:
                progress.update(written)
    finally:
        writer.close(manifest)
    return total


def generate(out: Path, num_images: int = 24, seed: int = 0, downscale: int = 8,
             layouts: tuple[str, ...] = LAYOUTS, num_proc: int = 1, images: bool = True) -> SyntheticRelease:
    """Write a synthetic release of `num_images` images (the paper has 151,025) to `out`.

    Images are `downscale` times smaller than MIMIC-CXR's on each side (8 by default:
    about 318 x 382 for a 2544 x 3056 original).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / NOTE_NAME).write_text(SYNTHETIC_NOTE, encoding="utf-8")
    sizes = split_sizes(num_images)
    firsts = dict(zip(sizes, np.cumsum([0] + list(sizes.values()))[:-1].tolist()))
    manifest = ManifestWriter(out, "cxr-vqa synthesize gemex")
    quiet = sum(sizes.values()) < 1024
    with tqdm(desc="synthetic questions", unit="question", disable=quiet or None) as bar:
        counts = {split: write_annotations(out, split, seed, firsts[split], n, downscale, layouts, manifest, bar) for split, n in sizes.items()}
    manifest.save()
    if images:
        total = sum(sizes.values())
        chunks = ((seed, start, min(256, total - start), downscale, str(out / "files")) for start in range(0, total, 256))
        with tqdm(total=total, desc="synthetic images", unit="image", disable=quiet or None) as bar:
            if num_proc > 1:
                with ProcessPoolExecutor(num_proc) as pool:
                    for written in pool.map(_write_images, chunks):
                        bar.update(written)
            else:
                for chunk in chunks:
                    bar.update(_write_images(chunk))
    return SyntheticRelease(out, sizes, counts)
