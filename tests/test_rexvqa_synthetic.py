"""rexvqa_dataset.synthetic.release: a deterministic raw release with everything a reader must cope with."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rexvqa_dataset.features import TASKS
from rexvqa_dataset.synthetic.drawing import DRAWINGS, StudyFinding, chest_pixels
from rexvqa_dataset.synthetic.profile import (
    FINDINGS,
    ID_PATTERN,
    PUBLIC_QUESTIONS,
    PUBLIC_STUDIES,
    QUESTIONS_PER_STUDY,
    SIZES,
)
from rexvqa_dataset.synthetic.questions import task_weights
from rexvqa_dataset.synthetic.release import generate, make_study, split_sizes

SURE = {
    "question",
    "options",
    "correct_answer",
    "correct_answer_explanation",
    "task_name",
    "category",
    "subcategory",
    "study_id",
    "ImagePath",
    "ImageViewPosition",
    "PatientAge",
    "PatientSex",
    "Indication",
    "Comparison",
    "Findings",
    "Impression",
}
LIKELY = {"PatientID", "AccessionNumber", "StudyInstanceUid", "StudyDate", "ImageModality", "validation_code"}
UNSURE = {"class", "Manufacturer", "ImageShape", "ImageBodyPart"}


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def release(rexvqa_release):
    return rexvqa_release


def records(release) -> dict[str, dict]:
    out = {}
    for name in ("train", "valid", "test"):
        out.update(json.loads((release.root / "metadata" / f"{name}_vqa_data.json").read_text()))
    return out


def test_same_seed_same_release_and_another_seed_another(release, tmp_path):
    again = generate(tmp_path / "again", num_studies=12, seed=3)
    other = generate(tmp_path / "other", num_studies=12, seed=4, images=False)
    assert digest(release.root) == digest(again.root)
    assert (release.root / "metadata" / "train_vqa_data.json").read_bytes() != (
        other.root / "metadata" / "train_vqa_data.json"
    ).read_bytes()


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
    text = "".join((release.root / "metadata" / f"{n}_vqa_data.json").read_text() for n in ("train", "valid", "test"))
    assert ": NaN" in text


def test_studies_have_1_to_4_images_and_odd_view_lists():
    """Short view lists and null views are rare (real studies are mostly PA/AP/LATERAL), so 600 studies."""
    studies = [next(iter(make_study(0, i, "train", 4).records.values())) for i in range(600)]
    counts = {len(s["ImagePath"]) for s in studies}
    assert counts == {1, 2, 3, 4}
    assert any(len(s["ImageViewPosition"]) < len(s["ImagePath"]) for s in studies)
    assert any(None in s["ImageViewPosition"] for s in studies)
    assert 1.5 < sum(len(s["ImagePath"]) for s in studies) / len(studies) < 1.9
    views = [v for s in studies for v in s["ImageViewPosition"]]
    assert sum(v in ("PA", "AP", "LATERAL") for v in views) / len(views) > 0.9


def test_ids_and_uids_have_the_real_shapes():
    for index in range(50):
        record = next(iter(make_study(0, index, "train", 4).records.values()))
        assert re.match(ID_PATTERN, record["PatientID"]) and re.match(ID_PATTERN, record["AccessionNumber"])
        uids = [record["StudyInstanceUid"]] + [part for path in record["ImagePath"] for part in path.split("/")[5:10:2]]
        for uid in uids:
            assert re.fullmatch(r"1\.2\.826\.0\.1\.3680043\.8\.498\.[1-9]\d{37}", uid.removesuffix(".png")), uid


def finding_of(option: str):
    return next(kind for kind in FINDINGS if kind.name == option[3:].lower())


def test_every_answer_is_right_about_the_study_findings():
    """Negation: the answer is a finding the study does not have and the other three it has; presence the
    reverse; a differential's answer is a present finding's diagnosis; location and size are the drawn ones."""
    tasks = set()
    for index in range(400):
        study = make_study(1, index, "train", 8)
        present = {f.kind for f in study.findings}
        for record in study.records.values():
            task, answer = record["task_name"], "ABCD".index(record["correct_answer"])
            tasks.add(task)
            options = record["options"]
            if task in ("Negation Assessment", "Presence Assessment"):
                marks = [finding_of(o) in present for o in options]
                expected = [k != answer for k in range(4)]
                assert marks == (expected if task == "Negation Assessment" else [not m for m in expected]), record
            elif task == "Differential Diagnosis":
                diagnoses = {f.kind.diagnosis for f in study.findings}
                assert [o[3:] in diagnoses for o in options] == [k == answer for k in range(4)]
            elif task == "Location and Distribution Assessment":
                places = {(f.kind.name, f.place) for f in study.findings}
                named = next(name for name, _ in places if name in record["question"])
                assert (named, options[answer][3:].lower()) in places
            else:
                sizes = {(f.kind.name, SIZES[f.size]) for f in study.findings}
                assert any(name in record["question"] and size == options[answer][3:] for name, size in sizes)
    assert tasks == set(TASKS)


def test_report_names_each_finding_once_so_it_can_be_checked():
    names = [kind.name for kind in FINDINGS]
    assert len(set(names)) == len(names)
    assert not [(a, b) for a in names for b in names if a != b and a in b]
    assert all(kind.drawing in DRAWINGS for kind in FINDINGS)


@pytest.mark.parametrize("kind", FINDINGS, ids=lambda kind: kind.name)
def test_each_finding_is_drawn_where_the_study_says(kind):
    place = {"zone": "left lower lung zone", "side": "left", "": ""}[kind.where]
    plain = chest_pixels(random.Random(0), 160, 200, []).astype(np.int32)
    drawn = chest_pixels(random.Random(0), 160, 200, [StudyFinding(kind, place, 3)]).astype(np.int32)
    change = np.abs(drawn - plain)
    assert change.sum() > 0
    if kind.where:
        assert change[:, 80:].sum() > 2 * change[:, :80].sum()  # the patient's left is the image's right
    if kind.where == "zone":
        rows = np.nonzero(change.sum(axis=1))[0]
        assert rows.mean() > 100  # the lower zone, below the middle
    if kind.sized:
        small = chest_pixels(random.Random(0), 160, 200, [StudyFinding(kind, place, 0)]).astype(np.int32)
        assert np.abs(small - plain).sum() < change.sum()


def test_images_are_16bit_single_channel_pngs_where_the_paths_point(release):
    for record in list(records(release).values())[:10]:
        for relative in record["ImagePath"]:
            assert (
                relative.startswith("../deid_png/")
                and "/studies/" in relative
                and "/series/" in relative
                and "/instances/" in relative
            )
            with Image.open(release.image_root / relative) as image:
                assert image.format == "PNG" and image.mode == "I;16"
                assert 140 <= max(image.size) <= 200


def test_scale_parameter_reaches_the_public_size():
    assert sum(split_sizes(PUBLIC_STUDIES).values()) == PUBLIC_STUDIES
    assert round(PUBLIC_STUDIES * QUESTIONS_PER_STUDY) == PUBLIC_QUESTIONS


def test_a_release_can_ask_for_other_task_shares():
    """The paper's mix by default; a small release (a test's) may ask for every task equally."""
    paper = Counter(r["task_name"] for i in range(500) for r in make_study(0, i, "train", 8).records.values())
    weights = task_weights(dict.fromkeys(TASKS, 0.2))
    equal = Counter(r["task_name"] for i in range(500) for r in make_study(0, i, "train", 8, weights).records.values())
    assert paper["Geometric Information Assessment"] / paper.total() < 0.02
    assert all(0.15 < equal[task] / equal.total() < 0.25 for task in TASKS)


def test_questions_are_worded_per_study():
    """Questions read as written for each report (views, patient, complaint), not a handful of templates;
    the opening says nothing of the answer, and the images are named once."""
    questions = [r["question"] for index in range(200) for r in make_study(4, index, "train", 8).records.values()]
    assert len(set(questions)) / len(questions) > 0.5
    assert not any(re.search(r"\ba 8\d-year|\ba 1[18]-year", q) for q in questions)
    assert not any(q.count("radiograph") > 1 for q in questions)
