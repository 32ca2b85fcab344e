"""Small built GEMeX and ReXVQA folders (Parquet under `data/<split>/`) with synthetic images,
shaped like the builders' output, for the recipe tests; and small synthetic releases built by the
CLI itself, images embedded (`synthetic_embed_builds`), for the probe benchmarks' tests."""

from __future__ import annotations

import io
import random
from pathlib import Path

from datasets import Dataset, Features, Image, List, Value, load_dataset
from PIL import Image as PILImage
from PIL import ImageDraw

from gemex_dataset.features import QUESTION_TYPES, features
from gemex_dataset.prompts import to_messages

REXVQA_FEATURES = Features(
    {
        "question_id": Value("string"),
        "images": List(Image()),
        "image_widths": List(Value("int32")),
        "image_heights": List(Value("int32")),
        "question": Value("string"),
        "options": List(Value("string")),
        "answer": Value("string"),
        "answer_index": Value("int32"),
        "explanation": Value("string"),
        "task_name": Value("string"),
        "category": Value("string"),
    }
)
"""The ReXVQA columns the recipes read (the real builder has more; the recipes ignore them)."""

REGIONS = {"left lung": (0.55, 0.15, 0.9, 0.8), "right lung": (0.1, 0.15, 0.45, 0.8), "spine": (0.45, 0.0, 0.55, 1.0)}


def png_bytes(width: int, height: int, seed: int, mode: str = "L") -> bytes:
    rng = random.Random(seed)
    image = PILImage.new(mode, (width, height), rng.randrange(0, 60))
    draw = ImageDraw.Draw(image)
    draw.ellipse((width * 0.15, height * 0.15, width * 0.85, height * 0.9), fill=rng.randrange(100, 200))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def gemex_rows(n: int, width: int = 64, height: int = 80) -> list[dict]:
    rows = []
    for i in range(n):
        kind = QUESTION_TYPES[i % 4]
        region, (x1, y1, x2, y2) = list(REGIONS.items())[i % len(REGIONS)]
        box = [x1 * width, y1 * height, x2 * width, y2 * height]
        choices = ["Left lung", "Right lung", "Spine", "Cardiac region"] if "choice" in kind else []
        answer, letters = {
            "open_ended": ("Small opacity.", []),
            "closed_ended": ("Yes." if i % 2 else "No.", []),
            "single_choice": ("B", ["B"]),
            "multi_choice": ('["A", "C"]', ["A", "C"]),
        }[kind]
        rows.append(
            {
                "question_id": f"gemex-{i:04d}",
                "image": {"bytes": png_bytes(width, height, seed=i // 4), "path": None},
                "image_path": f"p10/p1000000{i // 4}/s5000000{i // 4}/img{i // 4}.jpg",
                "image_width": width,
                "image_height": height,
                "subject_id": f"1000000{i // 4}",
                "study_id": f"5000000{i // 4}",
                "dicom_id": f"img{i // 4}",
                "split": "train",
                "question_type": kind,
                "content_type": "abnormality",
                "question": f"What is seen in the {region}?",
                "choices": choices,
                "answer": answer,
                "answer_letters": letters,
                "reason": f"The {region} looks clear.",
                "regions": [region],
                "boxes": [box],
                "boxes_224": [[0, 0, 10, 10]],
                "report": "No acute process.",
                "source_layout": "per_type_jsonl",
                "row_id": f"row_{i // 4}",
                "q_id": i,
            }
        )
    return rows


def rexvqa_rows(n: int, size: int = 72) -> list[dict]:
    rows = []
    for i in range(n):
        answer_index = i % 4
        rows.append(
            {
                "question_id": f"rexvqa-{i:04d}",
                "images": [{"bytes": png_bytes(size, size, seed=100 + i, mode="I;16"), "path": None}] * (1 + i % 2),
                "image_widths": [size] * (1 + i % 2),
                "image_heights": [size] * (1 + i % 2),
                "question": "Is there a pleural effusion?",
                "options": ["Yes, left", "Yes, right", "No", "Cannot tell"],
                "answer": "ABCD"[answer_index],
                "answer_index": answer_index,
                "explanation": "The costophrenic angles are sharp.",
                "task_name": "Presence Assessment",
                "category": "Lung and Pleural Opacity",
            }
        )
    return rows


def write_built(rows: list[dict], feature_set: Features, directory: Path, split: str = "train") -> Path:
    """Write `rows` as a built folder: `directory/data/<split>/<split>-00000-of-00001.parquet`."""
    shard = directory / "data" / split / f"{split}-00000-of-00001.parquet"
    shard.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows, features=feature_set).to_parquet(str(shard))
    return directory


def built_gemex(directory: Path, n: int = 8, split: str = "train") -> Path:
    rows = [{**row, "messages": to_messages(row)} for row in gemex_rows(n)]
    return write_built(rows, features("embed"), directory, split)


def built_rexvqa(directory: Path, n: int = 4, split: str = "train") -> Path:
    return write_built(rexvqa_rows(n), REXVQA_FEATURES, directory, split)


def load_built(directory: Path, split: str = "train") -> Dataset:
    return load_dataset(str(directory), split=split)


def synthetic_embed_builds(
    root: Path, gemex_images: int, rexvqa_studies: int, gemex_options: tuple[str, ...] = ()
) -> dict[str, Path]:
    """`cxr-vqa synthesize` then `build --image-mode embed` of each dataset under `root`, small images."""
    from cxr_vqa.cli import main as cxr_vqa

    gemex_raw, rexvqa_raw = root / "g-raw", root / "r-raw"
    synthesize_gemex = ["--out", str(gemex_raw), "--num-images", str(gemex_images), "--downscale", "32"]
    assert cxr_vqa(["synthesize", "gemex", *synthesize_gemex, *gemex_options]) == 0
    synthesize_rexvqa = ["--out", str(rexvqa_raw), "--num-studies", str(rexvqa_studies), "--downscale", "8"]
    assert cxr_vqa(["synthesize", "rexvqa", *synthesize_rexvqa]) == 0
    built = {"gemex": root / "gemex", "rexvqa": root / "rexvqa"}
    sources = {
        "gemex": ["--source", str(gemex_raw), "--images", str(gemex_raw / "files")],
        "rexvqa": ["--source", str(rexvqa_raw)],
    }
    for dataset, source in sources.items():
        assert cxr_vqa(["build", dataset, *source, "--out", str(built[dataset]), "--image-mode", "embed"]) == 0
    return built
