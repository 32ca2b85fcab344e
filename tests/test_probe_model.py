"""`python -m benchmarks.probe_model`: the learning-signal probe at its sizes, and fitted to a build (`--fit-to`): a
tokenizer that knows the build's words whole and a vision tower whose output is standardised on the build's images,
saved and loaded as any checkpoint."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from benchmarks.probe_model import (
    PROBE_FAMILIES,
    SIZES,
    conversation_texts,
    fitting_images,
    probe_vlm,
    tower_outputs,
    training_rows,
)
from tests import tiny_builds
from tests.tiny_builds import synthetic_embed_builds
from training_recipes.runtime.processors import RecipeError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    return synthetic_embed_builds(tmp_path_factory.mktemp("fit"), 8, 8, ())


def token_count(tokenizer, texts: list[str]) -> int:
    return sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)


@pytest.mark.parametrize(("name", "parameters"), [("probe", (200_000, 3_000_000)), ("wide", (3_000_000, 8_000_000))])
@pytest.mark.parametrize("family", PROBE_FAMILIES)
def test_the_probe_sizes_see_a_larger_image_in_more_tokens(family, name, parameters):
    """`--size probe` and `wide`: the image the processor hands the tower and the tokens that reach the decoder
    agree with the size, and one image's tokens are as many as the size says."""
    size = SIZES[name]
    vlm = probe_vlm(family, size=name)
    vision = vlm.model.config.vision_config
    assert (vision.image_size, vision.patch_size, vision.hidden_size) == (112, 8, size.vision_width)
    assert size.image_tokens == 49
    pil = Image.open(io.BytesIO(tiny_builds.png_bytes(150, 180, seed=1))).convert("RGB")
    text = vlm.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is there an effusion?"}]}],
        add_generation_prompt=True,
    )
    inputs = vlm.processor(text=[text], images=[[pil]], return_tensors="pt")
    image_token = vlm.model.config.image_token_id if family == "idefics3" else vlm.model.config.image_token_index
    assert int((inputs["input_ids"] == image_token).sum()) == 49
    assert parameters[0] < sum(p.numel() for p in vlm.model.parameters()) < parameters[1]
    layers = (vlm.model.config.text_config.num_hidden_layers, vision.num_hidden_layers)
    assert layers == (size.layers, size.vision_layers)


@pytest.mark.parametrize(("family", "dataset"), [("idefics3", "rexvqa"), ("gemma3", "rexvqa"), ("idefics3", "gemex")])
def test_a_fitted_probe_spells_the_builds_words_whole_and_sees_standardised_features(builds, family, dataset):
    rows = training_rows(builds[dataset])
    texts = conversation_texts(rows)
    plain = probe_vlm(family)
    fitted = probe_vlm(family, fit_to=builds[dataset])
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
        [sys.executable, "-m", "benchmarks.probe_model", "--fit-to", str(builds["rexvqa"])] + ["--out", str(out)],
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


def test_a_family_without_a_siglip_tower_is_refused_in_one_line():
    with pytest.raises(RecipeError, match="the probe is made for idefics3 and gemma3 only, not qwen2_5_vl"):
        probe_vlm("qwen2_5_vl")
