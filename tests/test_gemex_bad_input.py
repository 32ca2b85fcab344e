"""Each kind of bad input is rejected with its file, record, field and reason, and the build goes on."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from builders.assembly.report import BuildError
from builders.assembly.settings import BuildSettings
from gemex_dataset.build import build_gemex

GOOD = {
    "question": "Which findings are present?",
    "choices": ["A: Effusion", "B: Normal", "C: Edema", "D: Mass"],
    "type": "finding",
    "answer": ["A", "C"],
    "reason": "Both are seen.",
    "visual_regions": ["bilateral lung"],
    "visual_locations": [[43, 35, 180, 156]],
    "image_path": None,
    "ori_report": "Synthetic.",
    "q_id": 0,
    "row_id": "row_0",
}


@pytest.fixture
def release(gemex_release, tmp_path):
    """A copy of one split of the synthetic release whose files the tests may spoil."""
    root = tmp_path / "release"
    shutil.copytree(gemex_release.root / "per_type" / "test", root / "test")
    images = tmp_path / "files"
    shutil.copytree(gemex_release.image_root, images)
    first = json.loads((root / "test" / "open_ended_question.jsonl").read_text().split("\n")[0])
    return root, images, first["image_path"]


def write_multi(root, records, raw_lines=()):
    lines = [json.dumps(r) for r in records] + list(raw_lines)
    (root / "test" / "multi_choice_question.jsonl").write_text("\n".join(lines), encoding="utf-8")


def run(root, images, tmp_path, **kw):
    kw.setdefault("image_mode", "embed")
    report = build_gemex(BuildSettings(source=root, out=tmp_path / "out", images=images, overwrite=True, **kw))
    assert report.records_read == report.rows_written + report.rejected
    saved = json.loads((tmp_path / "out" / "build_report.json").read_text())
    assert saved["records_read"] == saved["rows_written"] + saved["rejected"]
    return report


def only_reject(report, file_name):
    rejects = [r for r in report.rejects if r.file.endswith(file_name)]
    assert len(rejects) == 1, [r.line() for r in report.rejects]
    return rejects[0]


def good(image_path, **changes):
    return {**GOOD, "image_path": image_path, **changes}


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"answer": ["A", "E"]}, "answer", "not among the choices"),
        ({"visual_locations": [[100, 35, 90, 156]]}, "visual_locations[0]", "x2 <= x1"),
        ({"visual_locations": [[43, 35, 180, 400]]}, "visual_locations[0]", "far outside"),
        ({"visual_locations": [[43, 35, float("nan"), 156]]}, "visual_locations[0]", "not a finite number"),
        ({"visual_locations": [[43, 35, 180, float("inf")]]}, "visual_locations[0]", "not a finite number"),
        ({"visual_regions": ["bilateral lung", "spine"]}, "visual_regions", "parallel"),
        ({"choices": ["A: Effusion", "C: Normal"]}, "choices[1]", "expected 'B: <text>'"),
    ],
)
def test_bad_record_is_rejected_with_its_field(release, tmp_path, change, field, reason):
    root, images, image_path = release
    write_multi(root, [good(image_path), good(image_path, question="Another?", **change)])
    report = run(root, images, tmp_path)
    reject = only_reject(report, "multi_choice_question.jsonl")
    assert (reject.record, reject.field) == ("line 2", field) and reason in reject.reason
    assert report.rows["test/multi_choice"] == 1


def test_missing_key(release, tmp_path):
    root, images, image_path = release
    record = good(image_path)
    del record["reason"]
    write_multi(root, [good(image_path, question="Kept?"), record])
    reject = only_reject(run(root, images, tmp_path), "multi_choice_question.jsonl")
    assert (reject.record, reject.field) == ("line 2", "reason") and "required" in reject.reason


def test_malformed_json_line(release, tmp_path):
    root, images, image_path = release
    write_multi(root, [good(image_path)], raw_lines=['{"question": "cut off'])
    reject = only_reject(run(root, images, tmp_path), "multi_choice_question.jsonl")
    assert reject.record == "line 2" and "malformed JSON" in reject.reason


def test_closed_answer_must_be_yes_or_no(release, tmp_path):
    root, images, _image_path = release
    path = root / "test" / "closed_ended_question.jsonl"
    lines = path.read_text().split("\n")
    record = json.loads(lines[0])
    record["answer"] = "Probably."
    path.write_text("\n".join([json.dumps(record)] + lines[1:]))
    reject = only_reject(run(root, images, tmp_path), "closed_ended_question.jsonl")
    assert (reject.record, reject.field) == ("line 1", "answer") and "'Yes.' or 'No.'" in reject.reason


def test_unknown_region_is_kept_and_counted(release, tmp_path):
    root, images, image_path = release
    write_multi(root, [good(image_path, visual_regions=["left clavicle"])])
    report = run(root, images, tmp_path)
    assert report.rejected == 0 and report.unknown_values["region"]["left clavicle"] == 1
    row = load_dataset(str(tmp_path / "out"), "multi_choice", split="test")[0]
    assert row["regions"] == ["left clavicle"]


def test_slightly_outside_box_is_clipped_and_counted(release, tmp_path):
    root, images, image_path = release
    write_multi(root, [good(image_path, visual_locations=[[-5, 35, 229, 156]])])
    report = run(root, images, tmp_path)
    assert report.rejected == 0 and report.notices["boxes clipped to the image"] >= 1
    row = load_dataset(str(tmp_path / "out"), "multi_choice", split="test")[0]
    x1, _, x2, _ = row["boxes"][0]
    assert x1 == 0 and x2 == row["image_width"] and row["boxes_224"] == [[-5, 35, 229, 156]]


def test_same_question_twice(release, tmp_path):
    root, images, image_path = release
    write_multi(root, [good(image_path), good(image_path)])
    reject = only_reject(run(root, images, tmp_path), "multi_choice_question.jsonl")
    assert reject.record == "line 2" and "same question twice" in reject.reason


@pytest.mark.parametrize("damage, reason", [("missing", "not found"), ("empty", "empty"), ("garbage", "")])
def test_unusable_image_rejects_its_questions(release, tmp_path, damage, reason):
    root, images, image_path = release
    target = images / image_path
    if damage == "missing":
        target.unlink()
    elif damage == "empty":
        target.write_bytes(b"")
    else:
        target.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 10)
    report = run(root, images, tmp_path)
    rejected = [r for r in report.rejects if r.field == "image_path"]
    assert rejected and all(reason in r.reason and image_path in r.reason for r in rejected)
    assert report.rows_written > 0


def test_non_utf8_file(release, tmp_path):
    root, images, image_path = release
    (root / "test" / "multi_choice_question.jsonl").write_bytes(
        json.dumps(good(image_path, question="Caf\u00e9?"), ensure_ascii=False).encode("latin-1")
    )
    reject = only_reject(run(root, images, tmp_path), "multi_choice_question.jsonl")
    assert reject.record == "line 1" and "UTF-8" in reject.reason


def test_empty_file(release, tmp_path):
    root, images, _ = release
    (root / "test" / "multi_choice_question.jsonl").write_bytes(b"")
    reject = only_reject(run(root, images, tmp_path), "multi_choice_question.jsonl")
    assert reject.record is None and "empty file" in reject.reason


def test_strict_fails_on_the_first_reject_and_leaves_nothing(release, tmp_path):
    root, images, image_path = release
    write_multi(root, [good(image_path), good(image_path, answer=["Z"])])
    with pytest.raises(BuildError, match=r"--strict: rejected .*multi_choice_question.jsonl, line 2, field answer"):
        build_gemex(BuildSettings(source=root, out=tmp_path / "strict", images=images, strict=True))
    assert not (tmp_path / "strict").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ---------------------------------------------------------------------------------------------
# Grouped JSON Lines + CSV: a line's image is its CSV row, by position; a newline lost or added
# must not move questions onto other images


def grouped_pairs(folder) -> list[tuple[str, str]]:
    """(image path, question) of every question of a grouped release, lines matched to CSV rows as released."""
    paths = [line.removeprefix("files/") for line in next(folder.glob("*.csv")).read_text().split("\n")[1:] if line]
    lines = [json.loads(line) for line in next(folder.glob("*.jsonl")).read_text().split("\n") if line]
    return [
        (path, qa["question"])
        for path, line in zip(paths, lines, strict=True)
        for items in line.values()
        for qa in items
    ]


@pytest.mark.parametrize(
    "damage", ["newline deleted", "newline inserted in a line", "blank line inserted", "CSV row deleted"]
)
def test_grouped_lines_and_csv_rows_never_part_silently(gemex_release, tmp_path, damage):
    folder = tmp_path / "release" / "train"
    shutil.copytree(gemex_release.root / "grouped" / "train", folder)
    released = grouped_pairs(folder)
    questions, table = next(folder.glob("*.jsonl")), next(folder.glob("*.csv"))
    lines = questions.read_text().split("\n")
    assert len(lines) > 4
    if damage == "newline deleted":
        lines[2:4] = [lines[2] + lines[3]]
    elif damage == "newline inserted in a line":
        lines[2:3] = [lines[2][:30], lines[2][30:]]
    elif damage == "blank line inserted":
        lines.insert(2, "")
    else:
        rows = table.read_text().split("\n")
        table.write_text("\n".join(rows[:3] + rows[4:]))
    questions.write_text("\n".join(lines))
    if damage == "CSV row deleted":  # no trace of where: no line can be placed, so the build stops naming the first
        with pytest.raises(BuildError, match=r"line 1, field mimic_image_file_path: .* cannot be told"):
            build_gemex(
                BuildSettings(source=tmp_path / "release", out=tmp_path / "out", image_mode="none", overwrite=True)
            )
        return
    report = build_gemex(
        BuildSettings(source=tmp_path / "release", out=tmp_path / "out", image_mode="none", overwrite=True)
    )
    assert report.records_read == report.rows_written + report.rejected
    ds = load_dataset("parquet", data_files=str(tmp_path / "out" / "data" / "**" / "*.parquet"), split="train")
    assert {(row["image_path"], row["question"]) for row in ds} <= set(released)
    if damage in (
        "blank line inserted",
        "newline deleted",
    ):  # one line that is two lines run together accounts for the count
        assert report.rejected == 0 and Counter((row["image_path"], row["question"]) for row in ds) == Counter(released)
        return
    parted = [r for r in report.rejects if r.field == "mimic_image_file_path"]
    assert parted and {r.record for r in parted} >= {f"line {n}" for n in range(4, len(lines) + 1) if lines[n - 1]}
    assert all("cannot be told" in r.reason and r.file == str(questions) for r in parted)
    assert ds.num_rows > 0


def grouped_copy(gemex_release, tmp_path) -> tuple[list[tuple[str, str]], Path, list[str]]:
    folder = tmp_path / "release" / "train"
    shutil.copytree(gemex_release.root / "grouped" / "train", folder)
    questions = next(folder.glob("*.jsonl"))
    return grouped_pairs(folder), questions, questions.read_text().split("\n")


def grouped_build(tmp_path):
    report = build_gemex(
        BuildSettings(source=tmp_path / "release", out=tmp_path / "out", image_mode="none", overwrite=True)
    )
    assert report.records_read == report.rows_written + report.rejected
    ds = load_dataset("parquet", data_files=str(tmp_path / "out" / "data" / "**" / "*.parquet"), split="train")
    return report, Counter((row["image_path"], row["question"]) for row in ds)


def test_two_grouped_lines_run_together_cost_only_what_stays_uncertain(gemex_release, tmp_path):
    """One lost newline rejected every later line; the line it leaves is two whole values, so every line after it is
    the row after its own, and the two values the two rows they stand for, each checked as a line of its own."""
    released, questions, lines = grouped_copy(gemex_release, tmp_path)
    per_line = [sum(len(items) for items in json.loads(line).values()) for line in lines if line]
    second = json.loads(lines[3])
    group = next(iter(second))
    del second[group][0]["answer"]
    lines[2:4] = [lines[2] + "  " + json.dumps(second)]
    questions.write_text("\n".join(lines))
    report, rows = grouped_build(tmp_path)
    [reject] = report.rejects
    assert reject.record == "line 3 (second of two lines run together)" and reject.field.endswith("answer")
    assert rows == Counter(released[: sum(per_line[:3])] + released[sum(per_line[:4]) :])


def test_a_line_run_together_beside_another_unreadable_line_parts_from_the_first(gemex_release, tmp_path):
    """Two unreadable lines and one line short: the lost newline cannot be told from the rest, so nothing is recovered."""
    released, questions, lines = grouped_copy(gemex_release, tmp_path)
    lines[2:4] = [lines[2] + lines[3]]
    lines[5] = lines[5].replace('"question": ', '"question": oops ', 1)
    questions.write_text("\n".join(lines))
    report, rows = grouped_build(tmp_path)
    assert {r.record for r in report.rejects} == {f"line {n}" for n in range(3, len(lines) + 1) if lines[n - 1]}
    assert set(rows) <= set(released) and rows


def test_one_dicom_file_name_under_two_subjects_gives_two_question_ids(release, tmp_path):
    """The same file name under two subjects is two images; their questions got one id each pair."""
    root, _, path = release
    other = path.replace(path.split("/")[1], "p10000001", 1)
    assert other != path and other.rsplit("/", 1)[1] == path.rsplit("/", 1)[1]
    write_multi(root, [good(path), good(other)])
    report = build_gemex(BuildSettings(source=root, out=tmp_path / "out", image_mode="none", overwrite=True))
    assert report.rejected == 0
    ds = load_dataset("parquet", data_files=str(tmp_path / "out" / "data" / "**" / "*.parquet"), split="train")
    ids = ds["question_id"]
    assert len(ids) == len(set(ids))
    multi = {row["image_path"]: row["question_id"] for row in ds if row["question_type"] == 3}
    assert multi == {path: f"test/{path}/multi_choice/0", other: f"test/{other}/multi_choice/0"}
    dicom_named = [i for i, p in zip(ids, ds["image_path"]) if p not in multi]
    assert dicom_named and all(
        i.split("/")[1] == p.rsplit("/", 1)[1][:-4]
        for i, p in zip(dicom_named, [p for p in ds["image_path"] if p not in multi])
    )


def test_image_paths_whose_short_names_chain_give_distinct_question_and_conversation_ids(release, tmp_path):
    """`a/x.jpg` and `a/x.png` share the short name `a/x`, so each is named by its path; `a/x.jpg.png`'s short
    name is then the first one's id name, so it is named by its path too. Paths elsewhere keep their dicom_id."""
    root, images, path = release
    chain = ["a/x.jpg", "a/x.png", "a/x.jpg.png", "a/x.jpg.png.jpg"]
    for name in chain:
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(images / path, images / name)
    write_multi(root, [good(name) for name in chain] + [good(path)])
    report = run(root, images, tmp_path)
    assert report.rejected == 0
    out = tmp_path / "out" / "data"
    questions = pq.read_table(
        sorted(p for p in out.glob("test/*.parquet") if "sft_per_image" not in p.name),
        columns=["question_id", "image_path", "question_type"],
    )
    multi = {row["image_path"]: row["question_id"] for row in questions.to_pylist() if row["question_type"] == 3}
    assert multi == {
        **{name: f"test/{name}/multi_choice/0" for name in chain},
        path: f"test/{path.rsplit('/', 1)[1][:-4]}/multi_choice/0",
    }
    ids = questions["question_id"].to_pylist()
    assert len(ids) == len(set(ids))
    conversations = pq.read_table(
        sorted(out.glob("test/sft_per_image-*.parquet")), columns=["conversation_id", "image_path"]
    ).to_pylist()
    assert (
        len({row["conversation_id"] for row in conversations})
        == len({row["image_path"] for row in conversations})
        == len(conversations)
    )
    assert {row["conversation_id"] for row in conversations if row["image_path"] in chain} == {
        f"test/{name}/0" for name in chain
    }
