"""A random-weight probe fitted to the build it will be trained on, as a pretrained model is to its corpus.

Two things a pretrained model brings and a random one lacks, measured to decide whether a small probe reads
ReXVQA's images at all (docs/benchmarks.md, "A probe fitted to its build"):

- **Words as tokens.** The tiny tokenizer learns its merges from the recipes' prompts only, so a finding's name
  is nine byte pieces and a ReXVQA prompt 300 tokens; learnt from the build's own conversations as well, every
  word is one or two tokens and the prompt a third as long.
- **Image features that differ from image to image.** A random SigLIP tower's output is mostly what every image
  shares (a constant per feature), and what a finding changes is small beside it. Scaling and shifting the
  tower's last LayerNorm, feature by feature, so that its output has mean 0 and standard deviation 1 over the
  build's images (and the connector's output unit size) removes the shared part without changing what the tower
  computes from a pixel. The tower is then meant to stay frozen (`sft.py --freeze_vision_tower true`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import Dataset, load_dataset
from torch import nn

from training_recipes.data import REPLIES, ConversationSettings, dataset_kind, row_images, to_messages
from training_recipes.runtime.vision_tower import vision_tower

FIT_IMAGES = 256
"""Training images whose tower features set the standardisation."""
FIT_ROWS = 20_000
"""Training rows at most whose conversations the tokenizer learns words from."""


def training_rows(build: Path) -> Dataset:
    return load_dataset(str(build), split="train")


def conversation_texts(rows: Dataset, limit: int = FIT_ROWS) -> list[str]:
    """Every text part of the first `limit` rows' conversations as the recipes write them, with each reply they can
    train (`training_recipes.data.REPLIES`)."""
    kind = dataset_kind(rows.column_names)
    image_columns = [c for c in ("image", "images") if c in rows.column_names]
    replies = [reply for reply in REPLIES if reply != "checklist" or kind == "rexvqa"]
    texts = []
    for row in rows.select(range(min(limit, len(rows)))).remove_columns(image_columns):
        for reply in replies:
            for message in to_messages(row, kind, ConversationSettings(reply=reply)):
                texts += [part["text"] for part in message["content"] if part["type"] == "text"]
    return texts


def fitting_images(rows: Dataset, count: int = FIT_IMAGES) -> list:
    """The first image of each of the first `count` rows with a distinct image or study."""
    kind = dataset_kind(rows.column_names)
    key = "dicom_id" if kind == "gemex" else "study_id"
    seen, images = set(), []
    for index, identity in enumerate(rows[key]):
        if identity not in seen:
            seen.add(identity)
            images.append(row_images(rows[index], kind)[0])
            if len(images) == count:
                break
    return images


@torch.no_grad()
def tower_outputs(model: nn.Module, processor, images: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The tower's last LayerNorm's output and the connector's output for `images`, one image at a time."""
    _, tower = vision_tower(model)
    captured = []
    hook = tower.post_layernorm.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        connected = []
        for image in images:
            inputs = processor.image_processor([[image]], return_tensors="pt")
            masks = {k: v for k, v in inputs.items() if k == "pixel_attention_mask"}
            output = model.model.get_image_features(pixel_values=inputs["pixel_values"], **masks)
            connected += list(output.pooler_output)
    finally:
        hook.remove()
    features = torch.cat([c.reshape(-1, c.shape[-1]) for c in captured])
    return features, torch.cat([c.reshape(-1, c.shape[-1]) for c in connected])


@torch.no_grad()
def standardise_tower(model: nn.Module, processor, images: list) -> None:
    """Fold a feature-by-feature standardisation over `images` into the tower's last LayerNorm, then scale it so
    that the connector's output has a root mean square of 1 over them; where the connector normalises what it is
    given (Gemma 3's soft-embedding norm), its output's size is its own and the standardisation is left as it is."""
    norm = vision_tower(model)[1].post_layernorm
    features, _ = tower_outputs(model, processor, images)
    mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
    norm.weight.copy_(norm.weight / std)
    norm.bias.copy_((norm.bias - mean) / std)
    standardised = norm.weight.clone(), norm.bias.clone()
    _, connected = tower_outputs(model, processor, images)
    scale = connected.pow(2).mean().sqrt().clamp_min(1e-6)
    norm.weight.div_(scale)
    norm.bias.div_(scale)
    _, connected = tower_outputs(model, processor, images)
    if abs(connected.pow(2).mean().sqrt().item() - 1) > 1e-2:
        norm.weight.copy_(standardised[0])
        norm.bias.copy_(standardised[1])
