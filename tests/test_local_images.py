"""A build without images meets a local copy of them: `--image-root` for the recipes and `evaluate`,
and `cxr-vqa attach`, which turns it into a build with images."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Image, load_dataset

from builders.assembly.settings import BuildSettings
from builders.hub.validate import validate
from builders.local_images import MISSING_ALLOWED, MissingImagesError, with_local_images, with_local_sizes
from builders.pixel_budget import PixelBudget
from cxr_vqa.cli import main
from gemex_dataset.build import build_gemex
from rexvqa_dataset.build import build_rexvqa
from training_recipes.data import ConversationSettings, conversational

from . import tiny_models

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ConversationSettings("qwen2.5-vl", pixel_budget=PixelBudget())


@pytest.fixture(scope="module")
def gemex_none(gemex_release, tmp_path_factory):
    """GEMeX annotations alone, built without reading an image (no sizes, no pixel boxes)."""
    out = tmp_path_factory.mktemp("gemex-none") / "gemex"
    build_gemex(BuildSettings(source=gemex_release.root / "per_type", out=out, image_mode="none"))
    return out


@pytest.fixture(scope="module")
def rexvqa_none(rexvqa_release, tmp_path_factory):
    out = tmp_path_factory.mktemp("rexvqa-none") / "rexvqa"
    build_rexvqa(BuildSettings(source=rexvqa_release.root, out=out, image_mode="none"))
    return out


@pytest.fixture(scope="module")
def rexvqa_reference(rexvqa_release, tmp_path_factory):
    out = tmp_path_factory.mktemp("rexvqa-ref") / "rexvqa"
    build_rexvqa(BuildSettings(source=rexvqa_release.root, out=out, image_mode="reference"))
    return out


def examples_by_question(split) -> dict[str, dict]:
    """The recipes' training examples of a split (images decoded at the budget), by question id."""
    return {e["question_ids"][0]: e for e in conversational(split, SETTINGS)}


def assert_same_examples(got: dict[str, dict], want: dict[str, dict]) -> None:
    assert got.keys() == want.keys()
    for question, example in want.items():
        assert got[question]["messages"] == example["messages"], question
        assert [i.tobytes() for i in got[question]["images"]] == [i.tobytes() for i in example["images"]], question


def test_gemex_annotations_with_local_images_train_as_an_embedded_build(gemex_none, gemex_embed, gemex_release):
    """Sizes, pixel boxes (from the 224-frame boxes) and images at the budget: what the embedded build trains on."""
    bare = load_dataset(str(gemex_none), split="train")
    assert bare[0]["image_width"] is None and bare[0]["boxes"] is None
    attached = with_local_images(bare, gemex_release.image_root)
    assert_same_examples(
        examples_by_question(attached), examples_by_question(load_dataset(str(gemex_embed[0]), split="train"))
    )


def test_rexvqa_annotations_with_local_images_train_as_a_reference_build(rexvqa_none, rexvqa_reference, rexvqa_release):
    attached = with_local_images(load_dataset(str(rexvqa_none), split="train"), rexvqa_release.root / "metadata")
    assert_same_examples(
        examples_by_question(attached), examples_by_question(load_dataset(str(rexvqa_reference), split="train"))
    )


def image_copy(gemex_release, tmp_path, removed: int):
    """A copy of the release's images with `removed` of them deleted; the deleted files' paths."""
    root = tmp_path / "files"
    shutil.copytree(gemex_release.image_root, root)
    gone = sorted(p for p in root.rglob("*.jpg"))[:removed]
    for path in gone:
        path.unlink()
    return root, gone


def test_a_few_missing_images_are_named_and_their_rows_left_out(gemex_none, gemex_release, tmp_path, capsys):
    root, gone = image_copy(gemex_release, tmp_path, removed=1)
    bare = load_dataset(str(gemex_none), split="train")
    attached = with_local_images(bare, root)
    named = capsys.readouterr().err
    lost = [r["question_id"] for r in bare if (root / r["image_path"]) == gone[0]]
    assert lost and len(attached) == len(bare) - len(lost)
    assert all(f"question {q}: image_path {gone[0]}: file not found" in named for q in lost)


def test_an_image_path_outside_the_root_is_refused_as_the_build_refuses_it(gemex_none, gemex_release, tmp_path, capsys):
    """`../` and an absolute path name a real image outside the root: each row is named with its field and left
    out (training, generating) or left unscored (evaluate), as a build counts a `path_escape`."""
    root = tmp_path / "files"
    shutil.copytree(gemex_release.image_root, root)
    bare = load_dataset(str(gemex_none), split="train")
    shutil.copy(root / bare[0]["image_path"], tmp_path / "outside.jpg")
    escapes = {0: "../outside.jpg", 1: str(tmp_path / "outside.jpg")}
    hostile = bare.map(lambda row, k: {"image_path": escapes.get(k, row["image_path"])}, with_indices=True)
    attached = with_local_images(hostile, root)
    assert len(attached) == len(bare) - 2
    assert str(tmp_path / "outside.jpg") not in {
        e["path"] for e in attached.cast_column("image", Image(decode=False))["image"]
    }
    rows = with_local_sizes(hostile.select_columns(["question_id", "image_path", "boxes_224"]).to_list(), root)
    named = capsys.readouterr().err
    for k, path in escapes.items():
        assert f"question {bare[k]['question_id']}: image_path {path}: image path resolves outside {root}" in named
        assert rows[k].get("image_width") is None


def test_empty_and_undecodable_images_count_as_missing_before_training(gemex_none, gemex_release, tmp_path, capsys):
    root, _ = image_copy(gemex_release, tmp_path, removed=0)
    bare = load_dataset(str(gemex_none), split="train")
    empty, garbled = (root / path for path in sorted(set(bare["image_path"]))[:2])
    empty.write_bytes(b"")
    garbled.write_bytes(b"\xff\xd8\xff" + os.urandom(500) + b"\xff\xd9")
    attached = with_local_images(bare, root)
    named = capsys.readouterr().err
    assert f"image_path {empty}: empty file (0 bytes)" in named and f"image_path {garbled}: " in named
    assert {empty, garbled}.isdisjoint(root / r["image_path"] for r in attached.select_columns(["image_path"]))
    examples_by_question(attached)  # every image left decodes


def test_images_replaced_under_the_root_are_attached_at_their_new_size(gemex_none, gemex_release, tmp_path):
    """The attached split is cached on the image files, not on the root's name: unchanged files reuse the cache,
    images replaced at another resolution give their own sizes and boxes, not the cached ones of the old files."""
    from PIL import Image as PILImage

    root, _ = image_copy(gemex_release, tmp_path, removed=0)
    old = with_local_images(load_dataset(str(gemex_none), split="train"), root)
    assert with_local_images(load_dataset(str(gemex_none), split="train"), root).cache_files == old.cache_files
    for path in root.rglob("*.jpg"):
        with PILImage.open(path) as image:
            image.resize((image.width // 2, image.height // 2)).save(path)
    new = with_local_images(load_dataset(str(gemex_none), split="train"), root)
    assert new["image_width"] == [width // 2 for width in old["image_width"]]
    assert new["boxes"] != old["boxes"]


def test_many_missing_images_stop_the_run_before_training(gemex_none, gemex_release, tmp_path):
    from training_recipes import sft

    root, _ = image_copy(gemex_release, tmp_path, removed=100)
    model_dir = tiny_models.save_tiny_vlm("idefics3", tmp_path / "model")
    argv = ["--model_name_or_path", str(model_dir), "--gemex_path", str(gemex_none), "--image_root", str(root)]
    with pytest.raises(
        MissingImagesError,
        match=rf"images missing or unusable \(more than {MISSING_ALLOWED}; \d+ rows name them\), e\.g\. question ",
    ):
        sft.main([*argv, "--output_dir", str(tmp_path / "run"), "--use_cpu", "true", "--max_steps", "1"])
    assert not (tmp_path / "run").exists()


def test_sft_and_generate_read_local_images(gemex_none, gemex_release, tmp_path):
    from training_recipes import generate, sft

    model_dir = tiny_models.save_tiny_vlm("idefics3", tmp_path / "model")
    common = ["--model_name_or_path", str(model_dir), "--image_root", str(gemex_release.image_root)]
    trainer = sft.main(
        [
            *common,
            "--gemex_path",
            str(gemex_none),
            "--output_dir",
            str(tmp_path / "run"),
            "--use_cpu",
            "true",
            "--dtype",
            "float32",
            "--bf16",
            "false",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            "2",
            "--max_train_samples",
            "2",
            "--save_strategy",
            "no",
        ]
    )
    assert trainer.state.global_step == 1
    predictions = tmp_path / "predictions.jsonl"
    written = generate.main(
        [
            *common,
            "--dataset_path",
            str(gemex_none),
            "--split",
            "test",
            "--max_samples",
            "2",
            "--output_file",
            str(predictions),
            "--max_new_tokens",
            "3",
            "--dtype",
            "float32",
        ]
    )
    assert written == 2 and len(predictions.read_text().splitlines()) == 2


def test_evaluate_scores_boxes_of_a_build_without_sizes(gemex_none, gemex_embed, gemex_release, tmp_path):
    """The reference replies score the same V on the annotations with --image-root as on the embedded build."""
    from gemex_dataset.prompts import target_text

    embedded = load_dataset(str(gemex_embed[0]), split="test").remove_columns(["image", "messages"])
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(
        "".join(json.dumps({"question_id": r["question_id"], "prediction": target_text(r)}) + "\n" for r in embedded)
    )

    def scores(folder, *extra):
        out = tmp_path / f"scores-{len(extra)}-{folder.name}.json"
        argv = ["evaluate", str(folder), "--predictions", str(predictions), "--text-metrics", "", "--out", str(out)]
        assert main([*argv, *extra]) == 0
        return json.loads(out.read_text())["scores"]["all"]

    assert "V" not in scores(gemex_none) or scores(gemex_none).get("V") is None
    local = scores(gemex_none, "--image-root", str(gemex_release.image_root))
    assert local["V"] == scores(gemex_embed[0])["V"] > 90


def test_attach_builds_again_with_images(gemex_none, gemex_embed, gemex_release, tmp_path):
    out = tmp_path / "attached"
    argv = ["attach", str(gemex_none), "--image-root", str(gemex_release.image_root), "--out", str(out)]
    assert main([*argv, "--image-mode", "embed"]) == 0
    assert validate(out) == []
    report = json.loads((out / "build_report.json").read_text())
    assert report["attached"] == {
        "annotations": str(gemex_none.absolute()),
        "images": str(gemex_release.image_root.absolute()),
    }
    for config in ("default", "sft", "sft_per_image"):
        for split in ("train", "validation", "test"):
            got = load_dataset(str(out), config, split=split).to_list()
            want = load_dataset(str(gemex_embed[0]), config, split=split).to_list()
            key = "question_id" if config != "sft_per_image" else "conversation_id"
            assert sorted(got, key=lambda r: r[key]) == sorted(want, key=lambda r: r[key]), (config, split)


def test_attach_rexvqa_gives_the_questions_and_images_of_a_reference_build(
    rexvqa_none, rexvqa_reference, rexvqa_release, tmp_path
):
    """Conversation turns are shuffled from release order, which a build without images does not keep: the
    per-study rows hold the same questions, in another seeded order."""
    out = tmp_path / "attached"
    assert (
        main(["attach", str(rexvqa_none), "--image-root", str(rexvqa_release.root / "metadata"), "--out", str(out)])
        == 0
    )
    assert validate(out) == []
    for config in ("default", "sft"):
        got = load_dataset(str(out), config, split="train").to_list()
        want = load_dataset(str(rexvqa_reference), config, split="train").to_list()
        assert sorted(got, key=lambda r: r["question_id"]) == sorted(want, key=lambda r: r["question_id"])
    studies = {
        folder: {
            r["study_id"]: sorted(r["question_ids"]) for r in load_dataset(str(folder), "sft_per_study", split="train")
        }
        for folder in (out, rexvqa_reference)
    }
    assert studies[out] == studies[rexvqa_reference]


def test_convert_refuses_a_build_without_images_and_names_attach(gemex_none, tmp_path, capsys):
    assert main(["convert", str(gemex_none), "--to", "swift", "--out", str(tmp_path / "out")]) == 1
    assert "cxr-vqa attach FOLDER --image-root DIR" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["llava", "grouped"])
def test_attach_writes_each_layout_back_as_released(layout, gemex_release, tmp_path):
    """Rows read from the LLaVA or grouped layout are written back in it: the same question ids and rows."""
    source = gemex_release.root / layout
    build_gemex(BuildSettings(source=source, out=tmp_path / "none", image_mode="none"))
    build_gemex(
        BuildSettings(source=source, out=tmp_path / "embed", images=gemex_release.image_root, image_mode="embed")
    )
    argv = [
        "attach",
        str(tmp_path / "none"),
        "--image-root",
        str(gemex_release.image_root),
        "--out",
        str(tmp_path / "out"),
    ]
    assert main([*argv, "--image-mode", "embed"]) == 0
    for split in ("train", "test"):
        got = load_dataset(str(tmp_path / "out"), "sft", split=split).to_list()
        want = load_dataset(str(tmp_path / "embed"), "sft", split=split).to_list()
        assert sorted(got, key=lambda r: r["question_id"]) == sorted(want, key=lambda r: r["question_id"])


def test_generate_names_a_wrong_image_root_in_one_line(gemex_none, tmp_path):
    model_dir = tiny_models.save_tiny_vlm("idefics3", tmp_path / "model")
    argv = ["--model_name_or_path", str(model_dir), "--dataset_path", str(gemex_none), "--split", "test"]
    argv += ["--output_file", str(tmp_path / "p.jsonl"), "--image_root", str(tmp_path / "nowhere")]
    done = subprocess.run(
        [sys.executable, "training_recipes/generate.py", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=300,
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"generate.py: error: --image-root {tmp_path / 'nowhere'}: no such folder"
    )
