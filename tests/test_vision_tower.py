"""`--freeze_vision_tower`: the tower's weights stay as loaded in full fine-tuning, LoRA puts no adapter on it,
the rest trains, and a checkpoint records the choice."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("peft")

from peft import get_peft_model  # noqa: E402
from trl import SFTConfig, get_peft_config  # noqa: E402

from training_recipes import sft  # noqa: E402
from training_recipes.runtime.checkpoints import RunIdentity  # noqa: E402
from training_recipes.runtime.processors import RecipeError  # noqa: E402
from training_recipes.runtime.vision_tower import RecipeModelConfig, freeze_vision_tower, vision_tower  # noqa: E402
from training_recipes.tiny_model import TINY_DECODER  # noqa: E402

from . import tiny_builds, tiny_models  # noqa: E402


@pytest.fixture(scope="module")
def gemex_dir(tmp_path_factory) -> Path:
    return tiny_builds.built_gemex(tmp_path_factory.mktemp("gemex"), n=8)


def short_run(output_dir: Path) -> SFTConfig:
    return SFTConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        max_steps=3,
        learning_rate=1e-2,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
    )


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> set[str]:
    return {name for name, p in module.named_parameters() if not torch.equal(before[name], p.detach())}


@pytest.mark.parametrize("family", ["idefics3", "gemma3"])
def test_full_fine_tuning_leaves_the_tower_as_loaded_and_trains_the_rest(family, gemex_dir, tmp_path):
    vlm = tiny_models.tiny_vlm(family)
    name, tower = vision_tower(vlm.model)
    tower_before, model_before = weights(tower), weights(vlm.model)
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), max_train_samples=4)
    model_args = RecipeModelConfig(freeze_vision_tower=True)
    trainer = sft.train(data_args, short_run(tmp_path), model_args, model=vlm.model, processor=vlm.processor)
    assert not changed(tower_before, tower)
    trained = changed(model_before, trainer.model)
    assert trained and not any(n.startswith(f"{name}.") for n in trained)
    assert any("connector" in n or "projector" in n for n in trained), sorted(trained)[:5]
    assert RunIdentity.of(data_args, trainer.args, model_args).run["model"]["freeze_vision_tower"] is True


def test_lora_puts_no_adapter_on_a_frozen_tower(gemex_dir, tmp_path):
    vlm = tiny_models.tiny_vlm("idefics3")
    name, _ = vision_tower(vlm.model)
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), max_train_samples=4)
    model_args = RecipeModelConfig(use_peft=True, lora_r=4, lora_target_modules=["all-linear"])
    unfrozen = sft.train(data_args, short_run(tmp_path / "a"), model_args, model=vlm.model, processor=vlm.processor)
    adapted = {n for n, _ in unfrozen.model.named_parameters() if "lora_" in n}
    assert any(f"{name}." in n for n in adapted)  # all-linear reaches the tower unless it is frozen

    vlm = tiny_models.tiny_vlm("idefics3")
    model_args.freeze_vision_tower = True
    frozen = sft.train(data_args, short_run(tmp_path / "b"), model_args, model=vlm.model, processor=vlm.processor)
    adapted = {n for n, p in frozen.model.named_parameters() if "lora_" in n and p.requires_grad}
    assert adapted and not any(f"{name}." in n for n in adapted)


def test_qwens_connector_inside_its_tower_still_trains():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14)
    config = Qwen2_5_VLConfig(
        text_config=dict(**TINY_DECODER, vocab_size=128, rope_parameters=rope), vision_config=vision
    )
    model = Qwen2_5_VLForConditionalGeneration(config)
    lora = get_peft_config(RecipeModelConfig(use_peft=True, lora_target_modules=["all-linear"]))
    frozen = freeze_vision_tower(model, lora)
    name, tower = vision_tower(model)
    assert name == "model.visual"
    assert all(p.requires_grad for p in tower.merger.parameters())
    assert frozen == sum(p.numel() for n, p in tower.named_parameters() if not n.startswith("merger."))
    adapted = {n for n, _ in get_peft_model(model, lora).named_parameters() if "lora_" in n}
    assert any(".visual.merger." in n for n in adapted)
    assert not any(".visual." in n and ".visual.merger." not in n for n in adapted)


def test_the_command_line_takes_the_option():
    _, _, model_args = sft.make_parser().parse_args_and_config(
        args=["--output_dir", "out", "--model_name_or_path", "m", "--freeze_vision_tower", "true"]
    )
    assert model_args.freeze_vision_tower is True


def test_a_model_without_a_vision_tower_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    text_only = LlamaForCausalLM(
        LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    )
    with pytest.raises(RecipeError, match="--freeze_vision_tower: LlamaForCausalLM has no vision tower"):
        vision_tower(text_only)
