"""The vision tower held as it is while the rest of the model trains (`--freeze_vision_tower`).

LLaMA-Factory (`freeze_vision_tower`, 0.9.5) and ms-swift (`freeze_vit`, 4.6) freeze a fine-tuned model's vision
tower by default, and its connector to the language model too (`freeze_multi_modal_projector`,
`freeze_aligner`); TRL's VLM example trains all of it, and so does the recipe unless asked. Frozen, the tower
keeps what its pretraining learnt and takes no backward pass. The connector still trains, as in LLaVA's
fine-tuning stage: the learning-signal probe (`benchmarks/probe_model.py`) starts from random weights and reads its
images only through a connector that learns (docs/benchmarks.md). Under LoRA the tower's layers get no adapters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn
from trl import ModelConfig

from training_recipes.runtime.processors import RecipeError


@dataclass
class RecipeModelConfig(ModelConfig):
    """TRL's model arguments and what the recipe adds to them."""

    freeze_vision_tower: bool = field(
        default=False,
        metadata={
            "help": "Train the model without its vision tower: full fine-tuning leaves the tower's weights as "
            "loaded, LoRA puts no adapters on it (as LLaMA-Factory and ms-swift do by default); the connector "
            "between tower and language model still trains."
        },
    )


def vision_tower(model: nn.Module) -> tuple[str, nn.Module]:
    """The model's vision tower and its qualified name, as transformers finds it (`get_encoder("image")`)."""
    tower = model.get_encoder(modality="image")
    for name, module in model.named_modules():
        if module is tower and name:
            return name, module
    raise RecipeError(
        f"--freeze_vision_tower: {type(model).__name__} has no vision tower under a name transformers knows "
        "(vision_tower, visual, vision_model, vision_encoder, image_tower)"
    )


CONNECTOR_INSIDE_TOWER = "merger"
"""Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's connector (`visual.merger`) sits inside the module transformers calls
the tower; it trains as the other families' connectors do."""


def freeze_vision_tower(model: nn.Module, peft_config=None) -> int:
    """Stop the vision tower's weights from training, and keep LoRA's adapters (`peft_config`, TRL's
    `get_peft_config`, which excludes no module of its own; changed in place) off its layers; returns how many
    parameters were frozen."""
    name, tower = vision_tower(model)
    tower.requires_grad_(False)
    connector = getattr(tower, CONNECTOR_INSIDE_TOWER, None)
    if connector is not None:
        connector.requires_grad_(True)
    if peft_config is not None:
        peft_config.exclude_modules = rf"{re.escape(name)}\.(?!{CONNECTOR_INSIDE_TOWER}(?:\.|$)).*"
    return sum(p.numel() for p in tower.parameters() if not p.requires_grad)
