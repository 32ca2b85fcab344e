"""The learning-signal probe: a tiny random-weight VLM large enough to read a synthetic image, made offline.

    python -m benchmarks.probe_model --out probe                          # 0.65 M parameters, 112 px images
    python -m benchmarks.probe_model --size wide --fit-to BUILD --out probe

It is `training_recipes.tiny_model`'s Idefics3 or Gemma 3 at a larger shape (`SIZES`), saved as a Hub checkpoint
is, so `sft.py` and `generate.py` take it as `--model_name_or_path`. `--fit-to BUILD` fits it to the build it will
train on, as a pretrained model is to its corpus (docs/benchmarks.md, "A probe fitted to its build"):

- **Words as tokens.** Its tokenizer learns its merges from the build's own conversations as well as the prompts,
  so every word is one or two tokens (the plain one spells a finding's name in nine byte pieces).
- **Image features that differ from image to image.** A random SigLIP tower's output is mostly what every image
  shares; scaling and shifting its last LayerNorm, feature by feature, to mean 0 and standard deviation 1 over
  the build's images (and the connector's output to unit size) removes that without changing what the tower
  computes from a pixel. The tower is then meant to stay frozen (`sft.py --freeze_vision_tower true`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from datasets import Dataset, load_dataset
from torch import nn

from training_recipes.data import REPLIES, ConversationSettings, dataset_kind, row_images, to_messages
from training_recipes.runtime.processors import RecipeError
from training_recipes.runtime.vision_tower import vision_tower
from training_recipes.tiny_model import BUILDERS, SMOKE, ModelSize, TinyVLM

SIZES = {
    "smoke": SMOKE,
    "probe": ModelSize(
        width=128, layers=2, vision_width=96, vision_layers=2, image_size=112, patch_size=8, merge=2, init_std=0.08
    ),
    "wide": ModelSize(
        width=256, layers=4, vision_width=192, vision_layers=4, image_size=112, patch_size=8, merge=2, init_std=0.06
    ),
}
"""What `--size` takes. `smoke` is `training_recipes.tiny_model`'s own shape (the GPU kit's CPU test). `probe` (about 1 M parameters) sees a 112-pixel image in 8-pixel patches, 49 image tokens,
and trains in minutes on a CPU. Its weights start at a standard deviation of 0.08, about one over the square root
of its width, as 0.02 is for the Hub's models a thousand wide: at 0.02 its attention starts near uniform and the
image's part of the answer stays too small to find for hundreds of steps. `wide` (about 4 M: twice the width,
four layers in the decoder and the tower, the same image tokens) is the probe for a GPU's steps."""
PROBE_FAMILIES = ("idefics3", "gemma3")
"""The families with a SigLIP tower a probe size applies to."""
FIT_IMAGES = 256
"""Training images whose tower features set the standardisation."""
FIT_ROWS = 20_000
"""Training rows at most whose conversations the tokenizer learns words from."""


def probe_vlm(family: str = "idefics3", size: str = "probe", seed: int = 0, fit_to: Path | None = None) -> TinyVLM:
    """A fresh probe (seeded random weights) and its processor; with `fit_to`, fitted to that build's train split."""
    if family not in PROBE_FAMILIES:
        raise RecipeError(f"the probe is made for {' and '.join(PROBE_FAMILIES)} only, not {family}")
    torch.manual_seed(seed)
    if fit_to is None:
        return BUILDERS[family](SIZES[size])
    rows = training_rows(fit_to)
    vlm = BUILDERS[family](SIZES[size], texts=conversation_texts(rows))
    standardise_tower(vlm.model, vlm.processor, fitting_images(rows))
    return vlm


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probe_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=PROBE_FAMILIES, default="idefics3")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--size",
        choices=list(SIZES),
        default="probe",
        help="smoke: the smoke model's shape; probe: for a CPU; wide: a GPU's steps",
    )
    parser.add_argument("--fit-to", type=Path, help="a built folder whose training split the probe is fitted to")
    args = parser.parse_args(argv)
    vlm = probe_vlm(args.family, args.size, args.seed, args.fit_to)
    vlm.model.save_pretrained(args.out)
    vlm.processor.save_pretrained(args.out)
    fitted = f", fitted to {args.fit_to}" if args.fit_to else ""
    print(f"{args.out}: a random-weight {args.family} probe ({args.size} size{fitted}) and its processor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
