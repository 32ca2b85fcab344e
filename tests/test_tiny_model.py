"""`python -m training_recipes.tiny_model` makes a checkpoint the recipes load as a user's would, the
recipes train on a CPU with no precision flags, and a processor that cannot be built (Qwen2.5-VL's
without torchvision) stops a recipe at once with one line naming what to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import AutoModelForImageTextToText, AutoProcessor

from training_recipes import generate, sft, tiny_model
from training_recipes.runtime.processors import RecipeError, bf16_available, load_processor, torchvision_problem

from . import tiny_builds, tiny_models
from .module_runs import run_modules

REPO = Path(__file__).resolve().parents[1]
NO_TORCHVISION = torchvision_problem()


RECIPE_ENV = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}


def run_module(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, check=False, env=RECIPE_ENV
    )


@pytest.fixture(scope="module")
def gemex_dir(tmp_path_factory) -> Path:
    return tiny_builds.built_gemex(tmp_path_factory.mktemp("gemex"), n=8)


def test_the_script_writes_a_checkpoint_the_auto_classes_load(tmp_path):
    result = run_module("training_recipes.tiny_model", "--family", "idefics3", "--out", "tiny", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tiny random-weight idefics3" in result.stdout
    processor = AutoProcessor.from_pretrained(tmp_path / "tiny")
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "tiny")
    assert model.config.model_type == "idefics3" and processor.image_processor is not None
    assert sum(p.numel() for p in model.parameters()) < 200_000


def test_sft_trains_on_a_cpu_with_no_precision_flags(gemex_dir, tmp_path):
    """The documented command, with none of --bf16 false / --use_cpu / --dtype: the defaults follow the machine."""
    model_dir = tiny_model.save_tiny_vlm("gemma3", tmp_path / "tiny")
    trainer = sft.main(
        [
            "--model_name_or_path",
            str(model_dir),
            "--gemex_path",
            str(gemex_dir),
            "--output_dir",
            str(tmp_path / "run"),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--save_strategy",
            "no",
        ]
    )
    assert trainer.state.global_step == 2
    assert trainer.args.bf16 is bf16_available()
    if not bf16_available():
        assert (
            next(trainer.model.parameters()).dtype.is_floating_point
            and str(next(trainer.model.parameters()).dtype) == "torch.float32"
        )


def hub_layout_qwen2_5_vl(directory: Path) -> Path:
    """A tiny Qwen2.5-VL saved as the Hub's checkpoints are: the processor class named in
    preprocessor_config.json, beside the tokenizer files and the chat template."""
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    vlm.model.save_pretrained(directory)
    vlm.processor.tokenizer.save_pretrained(directory)
    vlm.processor.image_processor.save_pretrained(directory)
    (directory / "chat_template.jinja").write_text(vlm.processor.chat_template)
    config = directory / "preprocessor_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "processor_class": "Qwen2_5_VLProcessor"}))
    return directory


@pytest.mark.skipif(NO_TORCHVISION is None, reason="torchvision loads here: Qwen2.5-VL's processor can be built")
def test_qwen2_5_vl_without_torchvision_stops_the_recipes_in_one_line(gemex_dir, tmp_path):
    model_dir = hub_layout_qwen2_5_vl(tmp_path / "qwen")
    runs = [
        (
            "training_recipes.sft",
            ["--gemex_path", str(gemex_dir), "--output_dir", str(tmp_path / "run"), "--max_steps", "1"],
        ),
        ("training_recipes.generate", ["--dataset_path", str(gemex_dir), "--output_file", str(tmp_path / "p.jsonl")]),
        ("training_recipes.tiny_model", ["--family", "qwen2_5_vl", "--out", str(tmp_path / "made")]),
    ]
    runs = [
        (m, a if m == "training_recipes.tiny_model" else ["--model_name_or_path", str(model_dir), *a]) for m, a in runs
    ]
    for result in run_modules(runs, cwd=tmp_path, env=RECIPE_ENV):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert "torchvision" in lines[-1] and "pip install torchvision" in lines[-1], lines[-1]
    assert not (tmp_path / "run").exists() and not (tmp_path / "made").exists()


def test_a_processor_that_comes_back_as_a_bare_tokenizer_is_refused(tmp_path, monkeypatch):
    """A checkpoint whose processor class transformers cannot resolve (here the tests' image-only
    Qwen2.5-VL class) loads as its tokenizer alone: refused at once, not an AttributeError in training.
    (The lmms-eval tests register that class with AutoProcessor; here it is unknown again.)"""
    from transformers import Qwen2_5_VLConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    monkeypatch.delitem(PROCESSOR_MAPPING._extra_content, Qwen2_5_VLConfig, raising=False)
    model_dir = tiny_models.save_tiny_vlm("qwen2_5_vl", tmp_path / "qwen")
    with pytest.raises(RecipeError, match=r"loaded only a \w+, no image processor"):
        load_processor(str(model_dir))
    with pytest.raises(RecipeError, match="no image processor"):
        generate.load_model(str(model_dir), "float32", "cpu")
