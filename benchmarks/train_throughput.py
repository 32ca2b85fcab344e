"""Training throughput of the SFT recipe's data path and model on one GPU.

A model of real size is built from its config with random weights (speed does not depend on the
weights; nothing is downloaded), trained in bf16 autocast with AdamW on a built synthetic GEMeX
split through the recipe's own lazy conversion (`training_recipes.data.conversational`) and TRL's
vision collator with reply-only labels. Prints samples/s, tokens/s, model FLOPs utilisation
against the GPU's dense bf16 peak, peak GPU memory and the share of step time spent waiting for
the next batch. Targets on one H100: MFU >= 35% for full fine-tuning, data wait < 5%.

    python benchmarks/train_throughput.py --model qwen2.5-vl-3b --batch_size 8 --steps 30
    python benchmarks/train_throughput.py --tiny --steps 3      # CPU smoke test

MFU counts 6 x parameters x tokens for the language model (every input token, image tokens
included) plus 6 x vision parameters x patches for the vision tower, plus causal attention
(6 x layers x hidden x seq^2 per sequence); recomputation from gradient checkpointing is not
counted, as is the convention. The tokenizer is a byte-level BPE trained offline on the prompts
(the real one cannot be downloaded here), so a text token here is shorter than Qwen's and
tokens/s reads higher than with the real tokenizer.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import tiny_models  # noqa: E402  (offline tokenizer and the image-only Qwen2.5-VL processor)
from datasets import load_dataset  # noqa: E402
from trl.chat_template_utils import get_training_chat_template  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling  # noqa: E402

from builders.pixel_budget import MIN_PIXELS, PixelBudget  # noqa: E402
from training_recipes.data import conversational, settings_for  # noqa: E402

BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H20": 148.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
"""Dense bf16 tensor-core peaks (SXM parts; an H100 PCIe is 756)."""

QWEN25_VL_3B = {
    "text_config": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, max_position_embeddings=128000,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
    ),
    "vision_config": dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
    ),
    "tie_word_embeddings": True,
}
TINY = {
    "text_config": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    ),
    "vision_config": dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0],
    ),
}
MODELS = {"qwen2.5-vl-3b": QWEN25_VL_3B}


def build_model_and_processor(preset: dict, max_pixels: int, attn_implementation: str):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
    tokenizer = tiny_models.train_tokenizer(specials, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=max_pixels, patch_size=14, merge_size=2)
    processor = tiny_models.image_only_qwen2_5_vl_processor_class()(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tiny_models.chat_template("qwen2_5_vl")
    )
    ids = tokenizer.convert_tokens_to_ids
    text_config = dict(
        preset["text_config"], bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    config = Qwen2_5_VLConfig(
        **{**preset, "text_config": text_config},
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )
    config._attn_implementation = attn_implementation
    model = Qwen2_5_VLForConditionalGeneration(config)
    return model, processor


def build_synthetic_gemex(workdir: Path, rows: int, image_size: int) -> Path:
    """A real `cxr-vqa` build (embed mode, long side `image_size`) of a synthetic release with at least `rows` training questions."""
    from builders.assembly.pipeline import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic import generate

    built = workdir / f"gemex-{rows}-{image_size}"
    if not built.exists():
        release = generate(workdir / f"release-{rows}", num_images=rows // 8 + 8, layouts=("per_type",))
        build_gemex(BuildSettings(source=release.root / "per_type", out=built, images=release.image_root,
                                  image_mode="embed", image_size=image_size))
    return built


def count_parameters(model) -> tuple[int, int, int]:
    """(language model without embeddings, vision tower, embeddings) parameter counts."""
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}" or n.startswith("visual"))
    embeddings = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n)
    if not getattr(model.config, "tie_word_embeddings", False):
        embeddings += model.lm_head.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return total - vision - embeddings, vision, embeddings


def step_flops(batch, n_language: int, n_vision: int, text_config) -> float:
    tokens = int(batch["attention_mask"].sum())
    patches = int(batch["pixel_values"].shape[0]) if "pixel_values" in batch else 0
    seq_sq = float((batch["attention_mask"].sum(dim=1).float() ** 2).sum())
    attention = 6 * text_config.num_hidden_layers * text_config.hidden_size * seq_sq  # causal: half of 12·L·h·s²
    lm_head = 6 * text_config.hidden_size * text_config.vocab_size * tokens
    return 6 * n_language * tokens + 6 * n_vision * patches + attention + lm_head


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in BF16_PEAK_TFLOPS.items():
        if key in name:
            return 756.0 if key == "H100" and "PCIe" in name else value
    return None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-vl-3b", choices=sorted(MODELS))
    parser.add_argument("--tiny", action="store_true", help="A tiny config on CPU: a smoke test of the script.")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="Measured steps, after the warm-up.")
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=512, help="Rows of the synthetic built split.")
    parser.add_argument("--image_size", type=int, default=512, help="Side of the stored synthetic images.")
    parser.add_argument("--max_pixels", type=int, default=448 * 448, help="Processor bound: 448^2 -> 256 image tokens.")
    parser.add_argument("--num_workers", type=int, default=8, help="DataLoader workers decoding and collating.")
    parser.add_argument("--gradient_checkpointing", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--attn_implementation", default="sdpa")
    parser.add_argument("--peak_tflops", type=float, default=None, help="Override the GPU's dense bf16 peak.")
    parser.add_argument("--workdir", default="/tmp/cxr-vqa-bench")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        args.image_size, args.max_pixels, args.num_workers = min(args.image_size, 112), 56 * 56, 0
    torch.manual_seed(0)
    model, processor = build_model_and_processor(TINY if args.tiny else MODELS[args.model], args.max_pixels,
                                                 args.attn_implementation)
    model.to(device).train()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_language, n_vision, n_embed = count_parameters(model)

    built = build_synthetic_gemex(Path(args.workdir), args.rows, args.image_size)
    settings = settings_for("qwen2_5_vl", processor, pixel_budget=PixelBudget(min(MIN_PIXELS, args.max_pixels), args.max_pixels))
    dataset = conversational(load_dataset(str(built), split="train").select(range(args.rows)), settings)
    collator = DataCollatorForVisionLanguageModeling(
        processor, assistant_only_loss=True, chat_template=get_training_chat_template(processor)
    )
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, collate_fn=collator, num_workers=args.num_workers,
        pin_memory=device.type == "cuda", persistent_workers=args.num_workers > 0, drop_last=True,
        prefetch_factor=4 if args.num_workers > 0 else None,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def batches():
        while True:
            yield from loader

    stream = batches()
    wait = compute = flops = 0.0
    samples = tokens = 0
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            wait = compute = flops = 0.0
            samples = tokens = 0
        started = time.perf_counter()
        batch = next(stream)
        waited = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        finished = time.perf_counter()
        wait += waited - started
        compute += finished - waited
        flops += step_flops(batch, n_language, n_vision, model.config.get_text_config())
        samples += int(batch["input_ids"].shape[0])
        tokens += int(batch["attention_mask"].sum())

    elapsed = wait + compute
    peak = peak_tflops(device, args.peak_tflops)
    if device.type == "cuda":
        peak_memory_gb = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        peak_memory_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # host RSS on CPU
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": "tiny" if args.tiny else args.model,
        "parameters_b": round((n_language + n_vision + n_embed) / 1e9, 3),
        "batch_size": args.batch_size,
        "gradient_checkpointing": args.gradient_checkpointing,
        "samples_per_s": samples / elapsed,
        "tokens_per_s": tokens / elapsed,
        "tokens_per_sample": tokens / max(samples, 1),
        "achieved_tflops": flops / elapsed / 1e12,
        "mfu": (flops / elapsed / 1e12) / peak if peak else None,
        "peak_memory_gb": peak_memory_gb,
        "data_wait_share": wait / elapsed,
    }
    mfu = f"{result['mfu']:.1%}" if result["mfu"] is not None else "n/a (no known peak; --peak_tflops)"
    print(
        f"{result['model']} on {result['device']}: {result['samples_per_s']:.2f} samples/s, "
        f"{result['tokens_per_s']:.0f} tokens/s, MFU {mfu}, peak memory {peak_memory_gb:.1f} GiB, "
        f"data wait {result['data_wait_share']:.1%} of step time"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
