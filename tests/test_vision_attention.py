"""The chunked vision attention gives the Qwen2.5-VL tower's own result in fewer sdpa calls."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from training_recipes.runtime.vision_attention import CHUNKED_SDPA, chunked_sdpa, use_chunked_vision_attention

GRIDS = torch.tensor([[1, 36, 50], [1, 20, 28], [1, 36, 50]])
"""Three images, two sizes: 112-px windows that fit whole and windows cut at the images' edges."""


def narrow_qwen2_5_vl(attn_implementation: str = "sdpa") -> Qwen2_5_VLForConditionalGeneration:
    """Qwen2.5-VL's window geometry (112-px windows, a full-attention block) at a few dozen features."""
    config = Qwen2_5_VLConfig(
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=32,
            window_size=112, fullatt_block_indexes=[1],
        ),
        text_config=dict(
            hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        ),
    )  # fmt: skip
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config)


def tower_pass(model) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The tower's output for GRIDS' patches, the patches' gradient, and the sdpa calls made."""
    patches = torch.randn(int(GRIDS.prod(-1).sum()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(1))
    patches.requires_grad_(True)
    with torch.profiler.profile() as profile:
        output = model.model.visual(patches, grid_thw=GRIDS).pooler_output
        output.pow(2).sum().backward()
    calls = sum(event.count for event in profile.key_averages() if event.key == "aten::scaled_dot_product_attention")
    return output.detach(), patches.grad, calls


def test_the_same_output_and_gradient_in_fewer_calls():
    model = narrow_qwen2_5_vl()
    per_window, per_window_grad, per_window_calls = tower_pass(model)

    assert use_chunked_vision_attention(model)
    assert model.model.visual.config._attn_implementation == CHUNKED_SDPA
    assert model.config.get_text_config()._attn_implementation == "sdpa"
    chunked, chunked_grad, chunked_calls = tower_pass(model)

    torch.testing.assert_close(chunked, per_window)
    torch.testing.assert_close(chunked_grad, per_window_grad)
    assert per_window_calls > 10 * chunked_calls
    assert chunked_calls <= 2 * 4  # two blocks, at most four distinct chunk lengths in each


def test_a_saved_checkpoint_names_no_implementation(tmp_path):
    """A model saved after the switch loads anywhere, with or without this module imported."""
    model = narrow_qwen2_5_vl()
    use_chunked_vision_attention(model)
    model.save_pretrained(tmp_path)
    assert CHUNKED_SDPA not in (tmp_path / "config.json").read_text()
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())["vision_config"]


@pytest.mark.parametrize("implementation", ["eager"])
def test_other_implementations_are_left_alone(implementation):
    model = narrow_qwen2_5_vl(implementation)
    assert not use_chunked_vision_attention(model)
    assert model.model.visual.config._attn_implementation == implementation


def test_a_model_without_a_qwen_tower_is_left_alone():
    from training_recipes.tiny_model import tiny_idefics3

    model = tiny_idefics3().model
    assert not use_chunked_vision_attention(model)


def test_chunk_bounds_are_required():
    query = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        chunked_sdpa(None, query, query, query)
