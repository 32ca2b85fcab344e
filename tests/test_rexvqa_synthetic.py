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


def probe_view(pixels: np.ndarray) -> np.ndarray:
    """The picture as 8 bits at the probe's 112 x 112, scaled as `training_recipes.data.to_rgb` scales it."""
    eight = (pixels.astype(np.float32) * (255.0 / pixels.max())).astype(np.uint8)
    return np.asarray(Image.fromarray(eight).resize((112, 112)), dtype=np.int32)


def plain_change(kind, place: str, size: int = 3) -> np.ndarray:
    """Grey levels (0-255, at 112 px) a plain finding changes against the same picture without it."""
    before = chest_pixels(random.Random(0), 160, 200, [])
    after = chest_pixels(random.Random(0), 160, 200, [StudyFinding(kind, place, size)], plain=True)
    return np.abs(probe_view(after) - probe_view(before))


PLACES = {"zone": "left lower lung zone", "side": "left", "": ""}


@pytest.mark.parametrize("kind", FINDINGS, ids=lambda kind: kind.name)
def test_a_plain_finding_is_a_large_high_contrast_mark_where_the_study_says(kind):
    """At the probe's 112 px a plain mark changes at least 100 pixels by more than 50 grey levels (a zone's,
    400), on the patient's left for a left-sided one, in the lower zone for a lower-zone one; a larger size,
    a larger mark."""
    change = plain_change(kind, PLACES[kind.where])
    strong = change > 50
    assert strong.sum() >= (400 if kind.where == "zone" else 100)
    if kind.where:
        assert strong[:, 56:].sum() > 0.95 * strong.sum()
    if kind.where == "zone":
        assert np.nonzero(strong)[0].mean() > 56
    if kind.sized:
        assert (plain_change(kind, PLACES[kind.where], 0) > 50).sum() < strong.sum()


def test_plain_findings_drawn_in_one_place_each_have_their_own_look():
    """Two kinds never leave the same mark where both can be: zone kinds in one zone, side kinds on one side,
    central kinds anywhere; marks of different kinds differ in at least 20 of the pixels at 112 px."""
    for where in ("zone", "side", ""):
        marks = {kind.name: plain_change(kind, PLACES[where], 3) > 50 for kind in FINDINGS if kind.where == where}
        for a, mark in marks.items():
            for b, other in marks.items():
                assert a == b or (mark != other).sum() >= 20, (a, b)


def test_plain_location_follows_the_zone():
    kind = next(kind for kind in FINDINGS if kind.where == "zone")
    centres = {}
    for zone in ("right upper lung zone", "right lower lung zone", "left upper lung zone", "left lower lung zone"):
        rows, columns = np.nonzero(plain_change(kind, zone) > 50)
        centres[zone] = rows.mean(), columns.mean()
    assert centres["right upper lung zone"][1] < 56 < centres["left upper lung zone"][1]
    assert centres["right upper lung zone"][0] < centres["right lower lung zone"][0] - 15
    assert centres["left upper lung zone"][0] < centres["left lower lung zone"][0] - 15


def option_kinds(record: dict) -> list:
    """What each option of a presence, negation or differential question names, as a finding kind."""
    if record["task_name"] == "Differential Diagnosis":
        return [next(kind for kind in FINDINGS if kind.diagnosis == option[3:]) for option in record["options"]]
    return [finding_of(option) for option in record["options"]]


def test_answered_findings_are_those_the_correct_options_rest_on():
    """Presence and differential: the answer's finding is drawn plainly and no other option's is; negation: the
    three present options' findings are, the answer's (absent) is not; location and size: the finding asked
    about, so its plain mark stands in the answer's zone at the answer's size."""
    for index in range(300):
        study = make_study(2, index, "train", 8)
        present = {f.kind for f in study.findings}
        assert study.answered <= present
        for record in study.records.values():
            task, answer = record["task_name"], "ABCD".index(record["correct_answer"])
            if task in ("Presence Assessment", "Differential Diagnosis"):
                kinds = option_kinds(record)
                assert kinds[answer] in study.answered
                assert not any(kind in study.answered for k, kind in enumerate(kinds) if k != answer)
            elif task == "Negation Assessment":
                kinds = option_kinds(record)
                assert [kind in study.answered for kind in kinds] == [k != answer for k in range(4)]
            else:
                asked = next(f.kind for f in study.findings if f.kind.name in record["question"])
                assert asked in study.answered


def test_plain_findings_redraw_the_images_of_the_same_questions_and_the_default_keeps_its_bytes(release, tmp_path):
    default = generate(tmp_path / "default", num_studies=12, seed=3)
    assert digest(default.root) == digest(release.root)
    answered = generate(tmp_path / "answered", num_studies=12, seed=3, plain_findings="answered")
    every = generate(tmp_path / "all", num_studies=12, seed=3, plain_findings="all")
    metadata = sorted((default.root / "metadata").glob("*.json"))
    images = sorted((default.root / "deid_png").rglob("*.png"))
    for plain in (answered, every):
        assert [m.read_bytes() for m in metadata] == [
            (plain.root / m.relative_to(default.root)).read_bytes() for m in metadata
        ]
        assert all(i.read_bytes() != (plain.root / i.relative_to(default.root)).read_bytes() for i in images)
    study = make_study(3, 0, "train", 4)
    first = study.images[0]
    drawn = np.asarray(Image.open(answered.root / first[0]))
    assert np.array_equal(
        drawn, chest_pixels(random.Random(first[3]), first[1], first[2], study.findings, study.answered)
    )
