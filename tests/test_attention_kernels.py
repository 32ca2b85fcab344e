"""The recipes' attention tries FlashAttention before cuDNN: in training (the backward pass's
recomputation of checkpointed layers included), in the trainer's evaluation and in generation, torch's
own order back afterwards."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from trl import ModelConfig  # noqa: E402

from training_recipes import data, generate, sft  # noqa: E402
from training_recipes.runtime.attention_kernels import FLASH_FIRST, flash_first  # noqa: E402

from . import tiny_builds, tiny_models  # noqa: E402
from .test_recipes import sft_config  # noqa: E402

FLASH_FIRST_ORDER = [int(backend) for backend in FLASH_FIRST]


def sdpa_order() -> list[int]:
    return list(torch._C._get_sdp_priority_order())[: len(FLASH_FIRST)]


@pytest.fixture
def orders_seen(monkeypatch) -> list[list[int]]:
    """The kernel order in force at each `scaled_dot_product_attention` call (transformers' sdpa and the
    chunked vision attention both look the function up on `torch.nn.functional` when they call it)."""
    seen: list[list[int]] = []
    attend = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(sdpa_order())
        return attend(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


def test_flash_first_sets_the_order_and_gives_the_old_one_back():
    before = sdpa_order()
    with flash_first():
        assert sdpa_order() == FLASH_FIRST_ORDER
    assert sdpa_order() == before


@pytest.fixture(scope="module")
def gemex_dir(tmp_path_factory):
    return tiny_builds.built_gemex(tmp_path_factory.mktemp("gemex"), n=4)


def test_training_attends_flash_first_forward_and_backward(gemex_dir, tmp_path, orders_seen):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    before = sdpa_order()
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), max_train_samples=4)
    args = sft_config(tmp_path, max_steps=2, gradient_checkpointing=True)
    sft.train(data_args, args, ModelConfig(), model=vlm.model, processor=vlm.processor)

    assert orders_seen and all(order == FLASH_FIRST_ORDER for order in orders_seen)
    calls_with_checkpointing = len(orders_seen)
    orders_seen.clear()
    sft.train(
        data_args,
        sft_config(tmp_path / "plain", max_steps=2),
        ModelConfig(),
        tiny_models.tiny_vlm("qwen2_5_vl").model,
        vlm.processor,
    )
    assert calls_with_checkpointing > len(orders_seen) > 0  # the recomputed layers attended again, in the backward pass
    assert sdpa_order() == before


def test_generation_attends_flash_first(gemex_dir, tmp_path, orders_seen):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    before = sdpa_order()
    split = tiny_builds.load_built(gemex_dir).select(range(2))
    generate.generate_predictions(vlm.model, vlm.processor, split, tmp_path / "predictions.jsonl", 2, 3)
    assert orders_seen and all(order == FLASH_FIRST_ORDER for order in orders_seen)
    assert sdpa_order() == before


def test_the_trainers_evaluation_attends_flash_first(gemex_dir, tmp_path, orders_seen):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), max_train_samples=4)
    trainer = sft.train(data_args, sft_config(tmp_path, max_steps=1), ModelConfig(), vlm.model, vlm.processor)
    orders_seen.clear()
    before = sdpa_order()
    settings = data.settings_for(vlm.model.config.model_type, vlm.processor)
    held_back = data.conversational(tiny_builds.load_built(gemex_dir).select(range(2)), settings)
    assert "eval_loss" in trainer.evaluate(eval_dataset=held_back)
    assert orders_seen and all(order == FLASH_FIRST_ORDER for order in orders_seen)
    assert sdpa_order() == before
