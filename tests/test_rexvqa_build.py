"""rexvqa_dataset.build: end to end on small releases, every bad input, the image modes, the loaders."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from builders.assembly.report import BuildError
from builders.assembly.settings import BuildSettings
from cxr_vqa.cli import main
from rexvqa_dataset.build import build_rexvqa
from rexvqa_dataset.features import PER_STUDY_CONFIG, TASK_CONFIGS, features
from rexvqa_dataset.rows import raw_record, same_value
from rexvqa_dataset.synthetic.release import generate

DX_STORAGE = "1.2.840.10008.5.1.4.1.1.1.1"


def pixels16(seed: int, height: int = 40, width: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (np.linspace(200, 3800, width)[None, :] + rng.normal(0, 30, (height, width))).clip(0, 4095).astype(np.uint16)


def image_path(study: str, k: int) -> str:
    return f"../deid_png/p{study}/a{study}/studies/{study}/series/1/instances/{k}.png"


def record(study: str, images: int = 1, **change) -> dict:
    return {
        "question": f"Is there an effusion in {study}?",
        "options": ["A. Yes", "B. No", "C. Maybe", "D. Unclear"],
        "correct_answer": "B",
        "correct_answer_explanation": "None seen.",
        "task_name": "Presence Assessment",
        "category": "Lung and Pleural Opacity",
        "subcategory": "Pleural effusion",
        "study_id": study,
        "ImagePath": [image_path(study, k) for k in range(images)],
        "ImageViewPosition": ["PA", "LATERAL", None, "AP"][:images],
        "PatientAge": "061Y",
        "PatientSex": "M",
        "Indication": math.nan,
        "Comparison": math.nan,
        "Findings": "Clear lungs.",
        "Impression": "Normal.",
        **change,
    }


def release(
    root: Path, records: dict[str, dict], split_file: str = "test_vqa_data.json", write_images: bool = True
) -> Path:
    """A release folder with `records` in one split file and a 16-bit PNG for each image path."""
    metadata = root / "metadata"
    metadata.mkdir(parents=True, exist_ok=True)
    (metadata / split_file).write_text(json.dumps(records, allow_nan=True), encoding="utf-8")
    if write_images:
        for n, rec in enumerate(records.values()):
            for k, relative in enumerate(rec["ImagePath"]):
                path = (metadata / relative).resolve()
                if path.is_relative_to(root.resolve()) and not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(pixels16(n * 10 + k)).save(path, "PNG")
    return root


def question_shards(folder: Path, pattern: str = "data/*/*.parquet") -> list[Path]:
    """The build's question shards: every Parquet file but `sft_per_study`'s."""
    return sorted(p for p in folder.glob(pattern) if not p.name.startswith(f"{PER_STUDY_CONFIG}-"))


def build(source: Path, out: Path, **settings) -> tuple[dict, Path]:
    report = build_rexvqa(BuildSettings(source=source, out=out, **{"image_mode": "embed", **settings}))
    return json.loads((out / "build_report.json").read_text()), report


def rows(out: Path, split: str = "test", config: str = "default"):
    return load_dataset(str(out), config, split=split)


@pytest.fixture(scope="module")
def synthetic_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("rexvqa")
    made = generate(root / "release", num_studies=8, seed=1)
    report, _ = build(made.root, root / "out")
    return made, root / "out", report


# ---------------------------------------------------------------------------------------------
# End to end on the synthetic release


def test_every_record_is_written_and_accounted(synthetic_build):
    made, out, report = synthetic_build
    assert report["records_read"] == sum(made.questions.values()) == report["rows_written"]
    assert sorted(p.name for p in (out / "data").iterdir()) == ["test", "train", "validation"]
    names = {p.name.split("-")[0] for p in question_shards(out)}
    assert names <= set(TASK_CONFIGS) and len(names) > 1  # embedded images too: a shard set per task


def test_shared_layout_reads_the_same_rows_through_filters(synthetic_build, tmp_path):
    made, by_config, _ = synthetic_build
    report, _ = build(made.root, tmp_path / "shared", shard_layout="shared")
    assert report["rows_written"] == sum(made.questions.values())
    assert {p.name.split("-")[0] for p in question_shards(tmp_path / "shared")} == {"questions"}
    for task in {p.name.split("-")[0] for p in question_shards(by_config, "data/train/*.parquet")}:
        mine = load_dataset(str(by_config), task, split="train")
        theirs = load_dataset(str(tmp_path / "shared"), task, split="train")
        assert sorted(mine["question_id"]) == sorted(theirs["question_id"])


def test_load_dataset_default_and_a_task_config_give_the_declared_features(synthetic_build, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, out, _ = synthetic_build
    everything = load_dataset(str(out))
    assert everything["train"].features == features("embed")
    presence = load_dataset(str(out), "presence_assessment", split="train")
    assert presence.features == features("embed")
    assert set(presence["task_name_raw"]) == {"Presence Assessment"}
    row = presence[0]
    assert all(isinstance(image, Image.Image) for image in row["images"])
    assert len(row["images"]) == len(row["view_positions"]) == len(row["image_widths"]) == len(row["image_paths"])


def test_built_rows_convert_back_to_the_released_records(synthetic_build):
    made, out, _ = synthetic_build
    released = {}
    for name in ("train", "valid", "test"):
        released.update(json.loads((made.root / "metadata" / f"{name}_vqa_data.json").read_text()))
    for split in ("train", "validation", "test"):
        for row in rows(out, split).remove_columns("images"):
            assert same_value(raw_record(row), released[row["question_id"]])


def test_rows_are_grouped_by_study_and_images_shared_in_the_dictionary(synthetic_build):
    import pyarrow.parquet as pq

    _, out, _ = synthetic_build
    for path in question_shards(out, "data/train/*.parquet"):
        studies = pq.read_table(path, columns=["study_id"]).column("study_id").to_pylist()
        runs = [study for k, study in enumerate(studies) if k == 0 or studies[k - 1] != study]
        assert len(runs) == len(set(runs))  # a study's rows together
        encodings = pq.ParquetFile(path).metadata.row_group(0).column(1).encodings
        assert "RLE_DICTIONARY" in encodings


def test_card_names_tasks_categories_terms_and_citation(synthetic_build):
    _, out, _ = synthetic_build
    card = (out / "README.md").read_text()
    for text in ("Presence Assessment", "## Categories", "2506.04353", "synthetic", "config_name: presence_assessment"):
        assert text in card


# ---------------------------------------------------------------------------------------------
# Several images, some missing


def test_one_missing_image_among_several_keeps_the_row_and_reports_it(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1", images=3), "q2": record("s2")})
    (root / "metadata" / image_path("s1", 1)).unlink()
    report, _ = build(root, tmp_path / "out")
    row = {r["question_id"]: r for r in rows(tmp_path / "out")}["q1"]
    assert row["image_paths"] == [image_path("s1", k) for k in range(3)]
    assert row["missing_images"] == [image_path("s1", 1)]
    assert len(row["images"]) == 2 and row["view_positions"] == ["PA", None]
    assert report["notices"] == {"images missing (row kept with its other images)": 1}
    assert same_value(raw_record(row), record("s1", images=3))


def test_study_whose_images_are_all_missing_is_rejected(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1", images=2), "q2": record("s2")})
    for k in range(2):
        (root / "metadata" / image_path("s1", k)).unlink()
    report, _ = build(root, tmp_path / "out")
    assert (report["records_read"], report["rows_written"], report["rejected"]) == (2, 1, 1)
    assert report["rejects"][0]["record"] == "q1" and "none of the study's images" in report["rejects"][0]["reason"]


def test_path_escaping_the_image_root_is_rejected(tmp_path):
    bad = record("s1", ImagePath=["../../etc/passwd"])
    root = release(tmp_path / "r", {"q1": bad, "q2": record("s2")})
    report, _ = build(root, tmp_path / "out")
    assert (
        report["rejected"] == 1
        and "escapes" in report["rejects"][0]["reason"]
        and report["rejects"][0]["field"] == "ImagePath"
    )


def test_truncated_png_is_rejected_with_its_reason(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1"), "q2": record("s2")})
    path = root / "metadata" / image_path("s1", 0)
    path.write_bytes(path.read_bytes()[:-40])
    report, _ = build(root, tmp_path / "out")
    assert report["rejected"] == 1 and "truncated" in report["rejects"][0]["reason"].lower()


@pytest.mark.parametrize(
    ("change", "field"),
    [({"options": ["A. Yes", "B. No", "C. Maybe"]}, "options"), ({"correct_answer": "E"}, "correct_answer")],
)
def test_bad_options_and_answers_are_rejected(tmp_path, change, field):
    root = release(tmp_path / "r", {"q1": record("s1", **change), "q2": record("s2")})
    report, _ = build(root, tmp_path / "out")
    assert report["rejected"] == 1 and report["rejects"][0]["field"] == field
    assert report["records_read"] == report["rows_written"] + report["rejected"]


def test_record_without_question_is_rejected(tmp_path):
    bad = record("s1")
    del bad["question"]
    root = release(tmp_path / "r", {"q1": bad, "q2": record("s2")})
    report, _ = build(root, tmp_path / "out")
    assert report["rejects"][0]["field"] == "question"


def test_unknown_task_goes_to_other_task_and_is_counted(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1", task_name="Severity Assessment"), "q2": record("s2")})
    report, _ = build(root, tmp_path / "out")
    assert report["unknown_values"] == {"task_name": {"Severity Assessment": 1}}
    other = rows(tmp_path / "out", config="other_task")
    assert other["task_name"] == [-1] and other["task_name_raw"] == ["Severity Assessment"]


def test_strict_fails_and_leaves_no_output(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1", correct_answer="E"), "q2": record("s2")})
    with pytest.raises(BuildError, match="--strict"):
        build(root, tmp_path / "out", strict=True)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_existing_output_needs_overwrite(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1")})
    build(root, tmp_path / "out")
    with pytest.raises(BuildError, match="--overwrite"):
        build(root, tmp_path / "out")
    build(root, tmp_path / "out", overwrite=True)


# ---------------------------------------------------------------------------------------------
# Image modes and formats


def test_reference_and_none_modes(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1", images=2)})
    build(root, tmp_path / "ref", image_mode="reference")
    row = rows(tmp_path / "ref")[0]
    assert [image.size for image in row["images"]] == [(32, 40), (32, 40)]
    build(root / "metadata", tmp_path / "none", image_mode="none")
    row = rows(tmp_path / "none")[0]
    assert "images" not in row and row["view_positions"] == ["PA", "LATERAL"] and row["image_widths"] is None


def test_keep_16bit_stores_the_release_png_as_is(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1")})
    build(root, tmp_path / "out", keep_16bit=True)
    import pyarrow.parquet as pq

    [path] = question_shards(tmp_path / "out", "data/test/*.parquet")
    stored = pq.read_table(path, columns=["images"]).column("images").to_pylist()[0][0]["bytes"]
    assert stored == (root / "metadata" / image_path("s1", 0)).read_bytes()
    assert Image.open(io.BytesIO(stored)).mode == "I;16"


def write_dicom(path: Path, pixels: np.ndarray | None) -> None:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DX_STORAGE
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID, dataset.SOPInstanceUID, dataset.Modality = DX_STORAGE, meta.MediaStorageSOPInstanceUID, "DX"
    dataset.set_pixel_data(pixels if pixels is not None else pixels16(0), "MONOCHROME2", 12)
    if pixels is None:
        del dataset.PixelData
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.save_as(path, enforce_file_format=True)


def test_dicom_images_with_image_ext_dcm_and_one_without_pixel_data(tmp_path):
    root = release(tmp_path / "r", {"q1": record("s1", images=2), "q2": record("s2")}, write_images=False)
    write_dicom((root / "metadata" / image_path("s1", 0)).with_suffix(".dcm"), pixels16(1))
    write_dicom((root / "metadata" / image_path("s1", 1)).with_suffix(".dcm"), pixels16(2, 60, 50))
    write_dicom((root / "metadata" / image_path("s2", 0)).with_suffix(".dcm"), None)
    report, _ = build(root, tmp_path / "out", image_ext="dcm")
    assert report["rejected"] == 1 and "no pixel data" in report["rejects"][0]["reason"]
    row = rows(tmp_path / "out")[0]
    assert [image.size for image in row["images"]] == [(32, 40), (50, 60)]
    assert row["image_paths"][0].endswith(".png")


def test_cli_build_and_synthesize(tmp_path, capsys):
    assert main(["synthesize", "rexvqa", "--out", str(tmp_path / "raw"), "--num-studies", "3"]) == 0
    assert (
        main(
            [
                "build",
                "rexvqa",
                "--source",
                str(tmp_path / "raw" / "metadata"),
                "--out",
                str(tmp_path / "out"),
                "--image-mode",
                "embed",
                "--image-size",
                "64",
                "--num-proc",
                "2",
            ]
        )
        == 0
    )
    assert max(rows(tmp_path / "out")[0]["images"][0].size) == 64
    assert main(["build", "rexvqa", "--source", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 1
    assert "no such file or folder" in capsys.readouterr().err


def test_reference_and_none_rows_made_a_column_at_a_time_match_the_embed_rows_made_a_row_at_a_time(
    tmp_path, header_readers
):
    """Only `embed` attaches images a study at a time (`group_rows`); `reference` attaches them column-wise,
    falling back to `group_rows` for the rows with an image that does not load (`none` reads no image)."""
    import pyarrow.parquet as pq

    from rexvqa_dataset.prompts import to_messages

    release = generate(tmp_path / "release", num_studies=40, seed=5)
    records = json.loads((release.root / "metadata" / "train_vqa_data.json").read_text())
    several = next(r for r in records.values() if len(r["ImagePath"]) > 1)
    (release.image_root / several["ImagePath"][1]).unlink()  # a study keeps its other images
    alone = next(r for r in records.values() if len(r["ImagePath"]) == 1)
    (release.image_root / alone["ImagePath"][0]).unlink()  # a study loses its only image
    builds = {
        mode: build_rexvqa(
            BuildSettings(source=release.root, out=tmp_path / mode, image_mode=mode, images=release.image_root)
        )
        for mode in ("embed", "reference")
    }

    def rows(mode: str) -> list[dict]:
        table = pq.read_table(question_shards(tmp_path / mode))
        return sorted(
            table.drop_columns([c for c in ("images",) if c in table.column_names]).to_pylist(),
            key=lambda r: r["question_id"],
        )

    embed, reference = rows("embed"), rows("reference")
    assert reference == embed and len(embed) > 100
    assert all(
        row["messages"] == to_messages({**row, "images": row["image_widths"]}) for row in reference
    )  # one part per stored image
    assert any(row["missing_images"] for row in reference)
    assert builds["reference"].rejected == builds["embed"].rejected > 0
    assert sorted(map(str, builds["reference"].rejects)) == sorted(map(str, builds["embed"].rejects))
    assert builds["reference"].notices == builds["embed"].notices
    assert dict(builds["reference"].images) == dict(builds["embed"].images)


def test_a_record_the_row_check_refuses_is_rejected_by_its_question_id(tmp_path):
    """Options whose letters do not run A, B, C, D pass the schema; the row check rejects them, naming the id."""
    release = generate(tmp_path / "release", num_studies=4, seed=1)
    path = release.root / "metadata" / "train_vqa_data.json"
    records = json.loads(path.read_text())
    question_id = next(iter(records))
    records[question_id]["options"][0] = "B. " + records[question_id]["options"][0][3:]
    path.write_text(json.dumps(records, indent=2))
    report = build_rexvqa(BuildSettings(source=release.root, out=tmp_path / "out", image_mode="none"))
    assert [(r.file, r.record, r.field) for r in report.rejects] == [(str(path), question_id, "options[0]")]
    assert report.rows_written == report.records_read - 1
