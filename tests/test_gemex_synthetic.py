import json
import re
from collections import Counter

import numpy as np
from PIL import Image

from builders.box_frame import frame224_to_pixels
from gemex_dataset.anatomy import REGIONS
from gemex_dataset.synthetic.distributions import FINDING_BY_NAME
from gemex_dataset.synthetic.drawing import draw_chest
from gemex_dataset.synthetic.questions import graded, region_cells, within
from gemex_dataset.synthetic.release import answered_findings, generate, make_image, split_sizes


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_release_other_seed_other_release(tmp_path):
    a, b, c = (generate(tmp_path / name, num_images=6, seed=seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert _files(a.root) == _files(b.root)
    assert _files(a.root) != _files(c.root)


def test_release_has_the_three_layouts_in_split_folders(gemex_release):
    root = gemex_release.root
    for split in ("train", "valid", "test"):
        assert {p.name for p in (root / "per_type" / split).iterdir()} == {
            "open_ended_question.jsonl",
            "closed_ended_question.jsonl",
            "single_choice_question.jsonl",
            "multi_choice_question.jsonl",
        }
        assert json.loads((root / "llava" / split / f"{split}_conversations.json").read_text())
        assert (root / "grouped" / split / f"{split}_images.csv").read_text().startswith("mimic_image_file_path")
    text = (root / "per_type" / "test" / "open_ended_question.jsonl").read_bytes()
    assert not text.endswith(b"\n"), "the released per-type files end without a trailing newline"


def test_images_sit_at_mimic_paths_and_include_both_orientations(gemex_release):
    paths = list(gemex_release.image_root.rglob("*.jpg"))
    assert len(paths) == 16
    pattern = re.compile(r"^p\d{2}/p\d{8}/s\d{8}/[0-9a-f]{8}(-[0-9a-f]{8}){4}\.jpg$")
    assert all(pattern.match(str(p.relative_to(gemex_release.image_root))) for p in paths)
    shapes = {Image.open(p).size for p in paths}
    assert any(w > h for w, h in shapes) and any(h > w for w, h in shapes)
    assert all(Image.open(p).mode == "L" for p in paths)


def _box(image, region):
    box, _ = frame224_to_pixels(image.region_boxes[region], image.width, image.height)
    return [round(v) for v in box]


def test_region_boxes_fall_on_the_drawn_anatomy(gemex_release):
    """Lungs are drawn dark, the heart and abdomen bright (before any finding is painted over them): the
    mapped boxes must show that."""
    for index in range(6):
        image = make_image(7, index, 8)
        assert np.array_equal(
            np.asarray(Image.open(gemex_release.image_root / image.image_path).convert("L")).shape,
            (image.height, image.width),
        )
        pixels = np.asarray(draw_chest(image.layout, image.width, image.height, index), dtype=np.float32)

        def mean(region, image=image, pixels=pixels):
            box, _ = frame224_to_pixels(image.region_boxes[region], image.width, image.height)
            x1, y1, x2, y2 = (round(v) for v in box)
            cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 4, (y2 - y1) / 4
            return pixels[round(cy - hh) : round(cy + hh), round(cx - hw) : round(cx + hw)].mean()

        assert mean("right mid lung zone") < mean("cardiac region") - 40
        assert mean("left mid lung zone") < mean("abdomen") - 40
        assert mean("trachea") < mean("mediastinum")
        assert set(image.region_boxes) == set(REGIONS)


def test_scale_follows_the_paper_at_full_size():
    sizes = split_sizes(151_025)
    assert sum(sizes.values()) == 151_025
    assert sizes == {"train": 149_535, "valid": 1_190, "test": 300}


def test_each_finding_is_painted_inside_its_region_box():
    """Drawing an image with and without one of its findings differs inside that finding's region box: no
    finding an answer names is painted over by another in the same zone."""
    checked = 0
    for index in range(40):
        image = make_image(3, index, 16)
        full = np.asarray(draw_chest(image.layout, image.width, image.height, index, image.shown), dtype=np.float32)
        for shown in image.shown:
            # the same finding in an overlapping region (effusion of the bilateral lung, of the right lung) draws it too
            rest = [
                s
                for s in image.shown
                if s != shown
                and not (s.finding == shown.finding and region_cells(s.region) & region_cells(shown.region))
            ]
            without = np.asarray(draw_chest(image.layout, image.width, image.height, index, rest), dtype=np.float32)
            change = np.abs(full - without)
            x1, y1, x2, y2 = _box(image, shown.region)
            pad = max(image.width, image.height) // 20
            inside = change[max(0, y1 - pad) : y2 + pad, max(0, x1 - pad) : x2 + pad].sum()
            assert (change > 12).sum() >= 4, f"{shown} is hidden under the image's other findings"
            if len(rest) == len(image.shown) - 1:
                assert inside / change.sum() > 0.9, (shown, inside / change.sum())
            checked += 1
    assert checked > 20


def test_closed_answers_follow_what_is_drawn(tmp_path):
    """A closed-ended "Yes." names a finding drawn in the asked region; "No." one that is not there."""
    for index in range(40):
        image = make_image(5, index, 16)
        drawn = {(s.finding, s.region): s for s in image.shown}
        for q in image.questions["closed_ended"]:
            region = q["visual_regions"][0]
            asked = [f for f, r in drawn if r == region and f in q["question"]]
            if q["type"] != "severity":
                assert bool(asked) == (q["answer"] == "Yes."), q
        for q in image.questions["single_choice"]:
            if q["type"] == "severity":
                (shown,) = [s for (f, r), s in drawn.items() if f in q["question"] and r == q["visual_regions"][0]]
                assert graded(shown.finding)
                assert q["choices"][ord(q["answer"]) - 65].endswith(shown.severity.capitalize())


def test_release_has_the_real_records_shapes(tmp_path):
    """The shapes the real records have: healthy images, 4 boxes, 4 correct options, 5 of a type on a test
    image, negation and size options."""
    release = generate(tmp_path / "r", num_images=160, seed=2, downscale=32, layouts=("per_type",))
    root = release.root / "per_type"
    records = {
        t: [
            json.loads(line)
            for split in ("train", "valid", "test")
            for line in (root / split / f"{t}_question.jsonl").read_text().splitlines()
        ]
        for t in ("open_ended", "closed_ended", "single_choice", "multi_choice")
    }
    every = [r for rs in records.values() for r in rs]
    assert max(len(r["visual_locations"]) for r in every) == 4
    assert max(len(r["answer"]) for r in records["multi_choice"]) == 4
    assert min(len(r["answer"]) for r in records["multi_choice"]) == 2
    options = [c for t in ("single_choice", "multi_choice") for r in records[t] for c in r["choices"]]
    assert any(": No " in c for c in options) and any(c.endswith(" cm") for c in options)
    assert any("No acute cardiopulmonary process." in r["ori_report"] for r in every)
    test = [json.loads(line) for line in (root / "test" / "single_choice_question.jsonl").read_text().splitlines()]
    assert max(Counter(r["image_path"] for r in test).values()) <= 5
    assert all(r["type"] != "finding" for r in every)


def test_the_build_keeps_the_real_records_shapes(tmp_path):
    """Built from the per-type files, every record is a row and the new shapes survive: 4 boxes, 4 correct
    letters, size and negation options, 5 questions of a type on a test image."""
    import pyarrow.parquet as pq

    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.features import QUESTION_TYPES

    release = generate(tmp_path / "r", num_images=160, seed=2, downscale=32)
    build_gemex(
        BuildSettings(
            source=release.root / "per_type", out=tmp_path / "gemex", image_mode="none", images=release.image_root
        )
    )
    rows = [
        row for path in sorted((tmp_path / "gemex").glob("data/*/*.parquet")) for row in pq.read_table(path).to_pylist()
    ]
    assert len(rows) == sum(release.questions.values())
    assert max(len(r["boxes_224"]) for r in rows) == 4
    multi = QUESTION_TYPES.index("multi_choice")  # a class label in the built rows
    assert max(len(r["answer_letters"]) for r in rows if r["question_type"] == multi) == 4
    assert any(c.endswith(" cm") for r in rows for c in r["choices"]) and any(
        c.startswith("No ") for r in rows for c in r["choices"]
    )
    test = Counter((r["image_path"], r["question_type"]) for r in rows if r["split"] == "test")
    assert max(test.values()) == 5


def _image_statements(image):
    """(finding, region, present) of every closed-ended and multi-choice statement about one image."""
    said = []
    for q in image.questions.get("closed_ended", []):
        if q["type"] != "severity":
            region = q["visual_regions"][0]
            finding = next(f for f in sorted(FINDING_BY_NAME, key=len, reverse=True) if f in q["question"])
            said.append((finding, region, q["answer"] == "Yes."))
    for q in image.questions.get("multi_choice", []):
        if q["type"] != "location":
            for choice in q["choices"]:
                letter, text = choice.split(": ", 1)
                negated = text.startswith("No ")
                finding, region = text.removeprefix("No ").lower().split(" in the ")
                said.append((finding, region, (letter in q["answer"]) != negated))
    return said, within


def test_no_statement_contradicts_another_about_the_same_image():
    """ "The bilateral lung does not show X" never stands beside "the right upper lung zone shows X"."""
    checked = 0
    for index in range(150):
        image = make_image(4, index, 16)
        said, within = _image_statements(image)
        shown = {(s.finding, s.region) for s in image.shown}
        for finding, region, present in said:
            checked += 1
            if not present:
                assert not any(f == finding and within(r, region) for f, r in shown), (index, finding, region)
    assert checked > 500


def test_questions_and_reasons_read_right():
    """No patient age appended to a question, the image named once, articles and verbs agreeing with plural
    names, and reasons mostly distinct, as free text is."""
    questions, reasons = [], []
    for index in range(150):
        for items in make_image(6, index, 16).questions.values():
            questions += [q["question"] for q in items]
            reasons += [q["reason"] for q in items]
    text = "\n".join(questions + reasons)
    assert "patient aged" not in text
    for wrong in (
        "a surgical clips",
        "a pacemaker leads",
        "a degenerative changes",
        "a endotracheal",
        "is any surgical clips",
        "is surgical clips",
        "is there surgical clips",
        "is there any surgical clips",
        "does the right hilar structures",
        "the left hilar structures shows",
        "is the surgical clips",
    ):
        assert wrong not in text.lower(), wrong
    names = ("frontal view", "radiograph", "cxr", "exam", "study", "film", "image", "chest x-ray", "pa projection")
    for q in questions:
        head, _, tail = q.lower().partition(",")
        if tail:  # an opening that names the image, then no closing that names it again
            assert not (any(n in head for n in names) and q.lower().count(next(n for n in names if n in head)) > 1), q
    assert len(set(reasons)) / len(reasons) > 0.6
    assert len(set(questions)) / len(questions) > 0.93


def test_plain_findings_cover_their_region_at_probe_size():
    """`plain`: at the 112-pixel size a probe sees, each finding changes a large share of its region's box by
    a high contrast against the same picture without findings, and the default drawing is not the plain one."""
    shares = []
    for index in range(12):
        image = make_image(3, index, 8)

        def small(shown, plain=True, image=image, index=index):
            drawn = draw_chest(image.layout, image.width, image.height, index, shown, plain)
            return np.asarray(drawn.resize((112, 112)), dtype=np.float32)

        full, bare = small(image.shown), small([])
        for shown in image.shown:
            (x1, y1, x2, y2), _ = frame224_to_pixels(image.region_boxes[shown.region], image.width, image.height)
            sx, sy = 112 / image.width, 112 / image.height
            box = np.abs(full - bare)[round(y1 * sy) : round(y2 * sy), round(x1 * sx) : round(x2 * sx)]
            share = (box > 50).mean()
            assert share > 0.1, shown
            shares.append(share)
        if image.shown:
            assert not np.array_equal(full, small(image.shown, plain=False))
    assert len(shares) > 20 and np.median(shares) > 0.5


def test_answered_findings_are_those_a_closed_ended_yes_names_and_only_they_are_plain():
    checked = 0
    for index in range(20):
        image = make_image(3, index, 8)
        named = answered_findings(image)
        for q in image.questions["closed_ended"]:
            if q["answer"] == "Yes.":
                assert any(s.region == q["visual_regions"][0] and s.finding in q["question"] for s in named), q
                checked += 1
        assert named <= set(image.shown)
        if named and len(named) < len(image.shown):
            only = draw_chest(image.layout, image.width, image.height, index, image.shown, named)
            every = draw_chest(image.layout, image.width, image.height, index, image.shown, True)
            assert not np.array_equal(np.asarray(only), np.asarray(every))
    assert checked > 5
