"""`cxr-vqa convert --to llamafactory|swift`, read by the tools' own dataset code in their own environments.

Each tool runs in a side environment of its pins (`tests/trainer_env.py`, made once and reused), loads
every file that `convert` wrote, and reports per row the text it trains on and a digest of each image as
it decodes it; the rows must be ours, row by row: the recipes' own messages (`training_recipes.data`),
each ``<image>`` tag one image, and the images decoded to the pixels the recipes decode them to.
"""

from __future__ import annotations

import json
import math

import pytest
from datasets import Image, List, load_dataset

from builders.assembly.settings import BuildSettings
from builders.pixel_budget import MAX_PIXELS, MIN_PIXELS, PixelBudget
from cxr_vqa.cli import main
from cxr_vqa.other_trainers import conversion_settings, text_messages
from rexvqa_dataset.build import build_rexvqa
from training_recipes.data import dataset_kind, decode_image, to_messages

from . import tiny_models
from .trainer_env import run_in
from .trainer_envs.image_digest import image_digests

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rexvqa_embed(rexvqa_release, tmp_path_factory):
    out = tmp_path_factory.mktemp("rexvqa-built") / "rexvqa"
    build_rexvqa(BuildSettings(source=rexvqa_release.root, out=out, image_mode="embed"))
    return out


def expected_rows(folder, config: str, split: str) -> list[dict]:
    """Each row of the build's split as the recipes write it for Qwen2.5-VL at the default budget."""
    dataset = load_dataset(str(folder), config, split=split)
    kind = dataset_kind(dataset.column_names, dataset.features)
    column = "image" if kind == "gemex" else "images"
    dataset = dataset.cast_column(column, Image(decode=False) if kind == "gemex" else List(Image(decode=False)))
    settings = conversion_settings("qwen2.5-vl", PixelBudget())
    rows = []
    for row in dataset:
        images = [decode_image(i, settings.pixel_budget) for i in ([row[column]] if kind == "gemex" else row[column])]
        rows.append(
            {
                "messages": text_messages(to_messages(row, kind, settings)),
                "images": image_digests(images),
            }
        )
    return rows


def name_parts(name: str) -> tuple[str, str]:
    """(config, split) of a written file's name: `<dataset>_<config>_<split>`."""
    stem = name.removesuffix(".jsonl")
    _, rest = stem.split("_", 1)
    config, split = rest.rsplit("_", 1)
    return config, split


def converted(build: str, tool: str, request, tmp_path) -> tuple:
    """The build fixture named `build` and the folder `cxr-vqa convert --to TOOL` wrote of it."""
    folder = request.getfixturevalue(build)
    folder = folder[0] if isinstance(folder, tuple) else folder
    out = tmp_path / tool
    assert main(["convert", str(folder), "--to", tool, "--out", str(out)]) == 0
    return folder, out


@pytest.mark.parametrize("build", ["gemex_embed", "rexvqa_embed"])
def test_llamafactory_reads_every_row_as_ours(build, request, tmp_path):
    folder, out = converted(build, "llamafactory", request, tmp_path)
    info = json.loads((out / "dataset_info.json").read_text())
    assert {(c, s) for c, s in map(name_parts, info)} == {
        (c, s)
        for c in ("sft", "sft_per_image" if build.startswith("gemex") else "sft_per_study")
        for s in ("train", "validation", "test")
    }
    loaded = json.loads(
        run_in(
            "llamafactory", "read_llamafactory.py", str(out), ",".join(info), str(MAX_PIXELS), str(MIN_PIXELS)
        ).splitlines()[-1]
    )
    for name, rows in loaded.items():
        expected = expected_rows(folder, *name_parts(name))
        assert len(rows) == len(expected) > 0, name
        for got, want in zip(rows, expected):
            system = want["messages"][0]["content"] if want["messages"][0]["role"] == "system" else ""
            turns = want["messages"][1:] if system else want["messages"]
            assert got["system"] == system
            assert got["messages"] == turns
            assert got["images"] == want["images"]
            assert sum(m["content"].count("<image>") for m in got["messages"]) == len(got["images"])


@pytest.mark.parametrize("build", ["gemex_embed", "rexvqa_embed"])
def test_swift_reads_every_row_as_ours(build, request, tmp_path):
    """GEMeX boxes go in as `objects`; written out by ms-swift's Qwen2.5-VL template they are the recipe's text."""
    folder, out = converted(build, "swift", request, tmp_path)
    files = sorted(p.name for p in out.glob("*.jsonl"))
    if build.startswith("gemex"):
        first = json.loads((out / files[0]).read_text().splitlines()[0])
        assert first["objects"]["bbox"] and "<bbox>" in first["messages"][-1]["content"]
    loaded = json.loads(
        run_in("ms-swift", "read_swift.py", ",".join(files), cwd=out, env={"ROOT_IMAGE_DIR": str(out)}).splitlines()[-1]
    )
    assert sorted(loaded) == files
    for name, rows in loaded.items():
        expected = expected_rows(folder, *name_parts(name))
        assert len(rows) == len(expected) > 0, name
        for got, want in zip(rows, expected):
            assert got["messages"] == want["messages"]
            assert got["images"] == want["images"]


def test_llamafactory_trains_a_step_on_a_converted_build(gemex_embed, tmp_path):
    """LLaMA-Factory's own SFT loop, one step on CPU, a tiny Gemma 3 (its template and image plugin; Qwen2.5-VL's
    processor needs torchvision, which does not load beside the CPU torch)."""
    model = tiny_models.save_tiny_vlm("gemma3", tmp_path / "model")
    out = tmp_path / "lf"
    argv = ["convert", str(gemex_embed[0]), "--to", "llamafactory", "--out", str(out), "--split", "train"]
    assert main([*argv, "--box-convention", "pixels"]) == 0
    state = json.loads(
        run_in(
            "llamafactory",
            "train_llamafactory.py",
            str(model),
            "gemma3",
            str(out),
            "gemex_sft_train",
            str(tmp_path / "run"),
        ).splitlines()[-1]
    )
    assert state["global_step"] == 1
    assert math.isfinite(state["log_history"][-1]["train_loss"]) and state["log_history"][-1]["train_loss"] > 0
