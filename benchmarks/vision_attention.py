"""The vision tower's attention calls per training step, one per window against a few per layer.

    python -m benchmarks.vision_attention                 # 8 radiographs, Qwen2.5-VL-3B's tower geometry
    python -m benchmarks.vision_attention --images 2 --repeats 1   # a quick look

On one H100, Qwen2.5-VL-3B at batch 8 within the recipes' pixel budget made ~19,000 sdpa calls a
step, the GPU busy 1.4 s of a 4.1 s step (benchmarks/README.md, "On a GPU"): launches, not
arithmetic. This counts those calls and times a forward and backward pass of the tower under
transformers' per-window sdpa and under the recipes' `chunked_sdpa`
(training_recipes/runtime/vision_attention.py), on radiographs of real size (2,500 x 3,000 px, resized to
the budget as the recipes do), through a tower of Qwen2.5-VL-3B's depth, heads, windows and
full-attention blocks, narrowed (`--width`) so that a CPU runs it: the calls are the 3B tower's,
the seconds are a CPU's launch overhead plus a narrow tower's arithmetic, both measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from builders.pixel_budget import MAX_PIXELS, MIN_PIXELS, PixelBudget
from training_recipes.runtime.vision_attention import use_chunked_vision_attention

TOWER = json.loads((Path(__file__).parent / "models" / "qwen2.5-vl-3b.json").read_text())["vision_config"]
RADIOGRAPH = (2500, 3000)


def narrow_tower(width: int):
    """Qwen2.5-VL-3B's vision tower at `width` features: its depth, heads, windows and full-attention blocks."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vision = dict(TOWER, hidden_size=width, intermediate_size=width, out_hidden_size=width)
    text = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = Qwen2_5_VLConfig(vision_config=vision, text_config=text)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config)


def radiograph_grids(images: int, budget: PixelBudget) -> torch.Tensor:
    """Each radiograph's patch grid (time, height, width) after the recipes' resize."""
    width, height = budget.resized_size(*RADIOGRAPH)
    patch = TOWER["patch_size"]
    return torch.tensor([[1, height // patch, width // patch]] * images)


def timed_pass(model, grids: torch.Tensor, repeats: int) -> dict:
    patches = torch.randn(int(grids.prod(-1).sum()), 3 * TOWER["temporal_patch_size"] * TOWER["patch_size"] ** 2)
    with torch.profiler.profile() as profile:
        model.model.visual(patches, grid_thw=grids).pooler_output.sum().backward()
    calls = sum(event.count for event in profile.key_averages() if event.key == "aten::scaled_dot_product_attention")
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        model.model.visual(patches, grid_thw=grids).pooler_output.sum().backward()
        seconds.append(time.perf_counter() - started)
    return {"sdpa_calls": calls, "seconds": min(seconds)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8, help="Radiographs in the batch (B.1's batch size).")
    parser.add_argument("--width", type=int, default=64, help="The narrowed tower's features (the 3B's: 1280).")
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes of each; the fastest is kept.")
    args = parser.parse_args(argv)
    grids = radiograph_grids(args.images, PixelBudget(MIN_PIXELS, MAX_PIXELS))
    model = narrow_tower(args.width)
    rows = [{"attention": "per window (transformers' sdpa)", **timed_pass(model, grids, args.repeats)}]
    use_chunked_vision_attention(model)
    rows.append({"attention": "chunked_sdpa (the recipes')", **timed_pass(model, grids, args.repeats)})
    base = rows[0]
    print(f"{args.images} radiographs of {RADIOGRAPH[0]} x {RADIOGRAPH[1]} px, patch grid {grids[0].tolist()}, ")
    print(f"tower of depth {TOWER['depth']} and width {args.width}, forward + backward\n")
    print("| attention | sdpa calls | s | calls vs per window | time vs per window |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['attention']} | {row['sdpa_calls']:,} | {row['seconds']:.2f} "
            f"| {row['sdpa_calls'] / base['sdpa_calls']:.3f}x | {row['seconds'] / base['seconds']:.2f}x |"
        )
    return rows


if __name__ == "__main__":
    main()
