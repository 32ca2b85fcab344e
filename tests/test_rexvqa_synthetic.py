"""rexvqa_dataset.synthetic: a deterministic raw release with everything a reader must cope with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from PIL import Image

from rexvqa_dataset.features import TASKS
from rexvqa_dataset.synthetic import (
    PUBLIC_QUESTIONS,
    PUBLIC_STUDIES,
    QUESTIONS_PER_STUDY,
    generate,
    make_study,
    split_sizes,
)

SURE = {"question", "options", "correct_answer", "correct_answer_explanation", "task_name", "category", "subcategory",
        "study_id", "ImagePath", "ImageViewPosition", "PatientAge", "PatientSex", "Indication", "Comparison", "Findings", "Impression"}
LIKELY = {"PatientID", "AccessionNumber", "StudyInstanceUid", "StudyDate", "ImageModality", "validation_code"}
UNSURE = {"class", "Manufacturer", "ImageShape", "ImageBodyPart"}


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("rexvqa") / "release", num_studies=12, seed=3)


def records(release) -> dict[str, dict]:
    out = {}
    for name in ("train", "valid", "test"):
        out.update(json.loads((release.metadata / f"{name}_vqa_data.json").read_text()))
    return out


def test_same_seed_same_release_and_another_seed_another(release, tmp_path):
    again = generate(tmp_path / "again", num_studies=12, seed=3)
    other = generate(tmp_path / "other", num_studies=12, seed=4, images=False)
    assert digest(release.root) == digest(again.root)
    assert (release.metadata / "train_vqa_data.json").read_bytes() != (other.metadata / "train_vqa_data.json").read_bytes()


def test_a_study_depends_only_on_seed_and_index():
    def text(index: int) -> str:
        return json.dumps(make_study(0, index, "train", 4).records)

    assert text(7) == text(7) != text(8)


def test_records_carry_every_listed_key_and_bare_nan(release):
    data = records(release)
    assert sum(release.questions.values()) == len(data)
    for record in data.values():
        assert set(record) >= SURE | LIKELY | UNSURE
        assert record["task_name"] in TASKS
        assert [o[:3] for o in record["options"]] == ["A. ", "B. ", "C. ", "D. "]
    text = "".join((release.metadata / f"{n}_vqa_data.json").read_text() for n in ("train", "valid", "test"))
    assert ": NaN" in text


def test_studies_have_1_to_4_images_and_odd_view_lists():
    studies = [next(iter(make_study(0, i, "train", 4).records.values())) for i in range(300)]
    counts = {len(s["ImagePath"]) for s in studies}
    assert counts == {1, 2, 3, 4}
    assert any(len(s["ImageViewPosition"]) < len(s["ImagePath"]) for s in studies)
    assert any(None in s["ImageViewPosition"] for s in studies)
    assert 1.5 < sum(len(s["ImagePath"]) for s in studies) / len(studies) < 1.9


def test_images_are_16bit_single_channel_pngs_where_the_paths_point(release):
    for record in list(records(release).values())[:10]:
        for relative in record["ImagePath"]:
            assert relative.startswith("../deid_png/") and "/studies/" in relative and "/series/" in relative and "/instances/" in relative
            with Image.open(release.metadata / relative) as image:
                assert image.format == "PNG" and image.mode == "I;16"
                assert 140 <= max(image.size) <= 200


def test_scale_parameter_reaches_the_public_size():
    assert sum(split_sizes(PUBLIC_STUDIES).values()) == PUBLIC_STUDIES
    assert round(PUBLIC_STUDIES * QUESTIONS_PER_STUDY) == PUBLIC_QUESTIONS
