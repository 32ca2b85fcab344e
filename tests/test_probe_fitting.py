"""`tiny_model --fit-to BUILD`: a probe whose tokenizer knows the build's words whole and whose vision tower's
output is standardised on the build's images, saved and loaded as any checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import AutoModelForImageTextToText, AutoProcessor

from tests.tiny_builds import synthetic_embed_builds
from training_recipes import tiny_model
from training_recipes.probe_fitting import conversation_texts, fitting_images, tower_outputs, training_rows
from training_recipes.runtime.processors import RecipeError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    return synthetic_embed_builds(tmp_path_factory.mktemp("fit"), 8, 8, ())


def token_count(tokenizer, texts: list[str]) -> int:
    return sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)


@pytest.mark.parametrize(("family", "dataset"), [("idefics3", "rexvqa"), ("gemma3", "rexvqa"), ("idefics3", "gemex")])
def test_a_fitted_probe_spells_the_builds_words_whole_and_sees_standardised_features(builds, family, dataset):
    rows = training_rows(builds[dataset])
    texts = conversation_texts(rows)
    plain = tiny_model.tiny_vlm(family, size="probe")
    fitted = tiny_model.tiny_vlm(family, size="probe", fit_to=builds[dataset])
    assert token_count(fitted.processor.tokenizer, texts) < 0.6 * token_count(plain.processor.tokenizer, texts)
    assert token_count(fitted.processor.tokenizer, texts) < 1.6 * sum(len(text.split()) for text in texts)

    images = fitting_images(rows)
    features, connected = tower_outputs(fitted.model, fitted.processor, images)
    assert features.mean(0).abs().max() < 1e-3 * features.std(0).mean()
    assert features.std(0).min() > 0.99 * features.std(0).max()
    if family == "idefics3":  # Gemma 3's connector normalises what it is given, and sets its own output's size
        assert connected.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=1e-3)
        _, plain_connected = tower_outputs(plain.model, plain.processor, images)
        assert plain_connected.mean(0).abs().mean() > 5 * connected.mean(0).abs().mean()


def test_the_script_saves_the_fitted_probe_as_a_checkpoint(builds, tmp_path):
    out = tmp_path / "probe"
    result = subprocess.run(
        [sys.executable, "-m", "training_recipes.tiny_model", "--size", "probe", "--fit-to", str(builds["rexvqa"])]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"fitted to {builds['rexvqa']}" in result.stdout
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    _, connected = tower_outputs(model, processor, fitting_images(training_rows(builds["rexvqa"])))
    assert connected.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=1e-3)


def test_fitting_is_refused_for_a_family_without_a_siglip_tower(builds):
    with pytest.raises(RecipeError, match="--fit-to is made for idefics3 and gemma3 only, not qwen2_5_vl"):
        tiny_model.tiny_vlm("qwen2_5_vl", fit_to=builds["rexvqa"])
