"""Training throughput of the SFT recipe's data path and model on one GPU.

A model of real size is built from its config (`benchmarks/models/*.json`, the published
architecture numbers) with random weights, straight on the device (speed does not depend on the
weights; nothing is downloaded), in the recipe's dtype (`sft.py`'s `--dtype`: bfloat16 on a GPU that
has it, float32 on CPU; `--dtype float32` for fp32 master weights), trained in bf16 autocast with
AdamW (fused on CUDA), fully or
with LoRA adapters (`--lora`), on a built split through the recipe's own lazy conversion
(`training_recipes.data.conversational`) and TRL's vision collator with reply-only labels, the
images decoded in DataLoader workers, the loss computed as the recipes' trainer computes it (TRL's
fused LM head, which projects only the positions whose next token is a label and never holds the
151k-vocabulary logits of a batch). Prints samples/s, tokens/s, model FLOPs utilisation against the
GPU's dense bf16 peak, peak GPU memory and the share of step time spent waiting for the next
batch. Targets on one H100: MFU >= 40% for full fine-tuning, data wait < 2%; `--profile DIR` writes
a torch profiler trace of a few more steps where one is missed (`--profile_when always`: in any case).

Speed-ups, each off by default so a row says what it measured: `--group_by_length` (batches of
rows of like length: transformers' `LengthGroupedSampler` over `training_recipes.data.sequence_lengths`;
the share of padded positions is reported either way), `--liger` (Liger's Triton kernels for
Qwen2.5-VL: RMSNorm, SwiGLU and RoPE, the loss left to TRL's head as the trainer leaves it; needs
`liger-kernel` and a GPU) and `--compile` (regional compilation: `torch.compile` on each decoder
layer and vision block, so one compiled graph serves the identical layers and compile time is that
of one layer), `--chunked_vision_attention` and `--flash_first` (the recipes' own:
`training_recipes/runtime/vision_attention.py`, `training_recipes/runtime/attention_kernels.py`).

    python -m benchmarks.train_throughput --model qwen2.5-vl-3b --batch_size 8 --steps 30
    python -m benchmarks.train_throughput --dataset ./gemex --dataset_config sft --lora   # a given build
    python -m benchmarks.train_throughput --tiny --steps 3      # CPU smoke test

Without `--dataset` it builds a synthetic GEMeX split itself (`--rows`, `--image_size`).
MFU counts 6 x parameters x tokens for the language model (every input token, image tokens
included) plus 6 x vision parameters x patches for the vision tower, plus causal attention
(6 x layers x hidden x seq^2 per sequence), plus the LM head at the positions it scores; with LoRA
the frozen weights count 4x (forward and the input gradients; their weight gradients are not
computed). Recomputation from gradient checkpointing is not counted, as is the convention. The
tokenizer is a byte-level BPE trained offline on the prompts (the real one cannot be downloaded
here), so a text token here is shorter than Qwen's and tokens/s reads higher than with the real
tokenizer.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks import step_profile
from builders import pixel_budget
from builders.pixel_budget import PixelBudget
from training_recipes.runtime.attention_kernels import flash_first
from training_recipes.runtime.processors import default_dtype
from training_recipes.runtime.vision_attention import use_chunked_vision_attention

# datasets, transformers, trl and the recipe's data path are imported where they are used, so `--help` is quick

BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H20": 148.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
"""Dense bf16 tensor-core peaks (SXM parts; an H100 PCIe is 756)."""

MODEL_CONFIGS = Path(__file__).resolve().parent / "models"
MODELS = {"qwen2.5-vl-3b": MODEL_CONFIGS / "qwen2.5-vl-3b.json"}
TINY = MODEL_CONFIGS / "tiny-qwen2.5-vl.json"
MFU_TARGET = 0.40
DATA_WAIT_TARGET = 0.02


def model_preset(path: Path) -> dict:
    """A model config file without its `_`-prefixed notes."""
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def build_processor(budget: PixelBudget):
    """Qwen2.5-VL's processor (images only) around a tokenizer trained offline, bounded to `budget`."""
    from transformers import Qwen2VLImageProcessorPil

    from training_recipes import tiny_model  # offline tokenizer and the image-only Qwen2.5-VL processor

    tokenizer = tiny_model.qwen_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": budget.min_pixels, "longest_edge": budget.max_pixels}, patch_size=14, merge_size=2
    )
    return tiny_model.image_only_qwen2_5_vl_processor_class()(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tiny_model.chat_template("qwen2_5_vl")
    )


def build_model_and_processor(
    preset: dict, budget: PixelBudget, attn_implementation: str, device: str | torch.device = "cpu"
):
    """A Qwen2.5-VL of `preset`'s size with random weights, initialised on `device`, and its processor."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = build_processor(budget)
    ids = processor.tokenizer.convert_tokens_to_ids
    text_config = dict(
        preset["text_config"],
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    config = Qwen2_5_VLConfig(
        **{**preset, "text_config": text_config},
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    config._attn_implementation = attn_implementation
    with torch.device(device):  # random init on the GPU: seconds, not the minutes a 3B model takes on CPU
        model = Qwen2_5_VLForConditionalGeneration(config)
    return model, processor


def add_lora(model, r: int, alpha: int):
    """LoRA adapters on every linear layer (the recipe's `lora_target_modules: all-linear`)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", task_type="CAUSAL_LM"))


SFT_TRAINER_HEAD_OUTPUTS = ("log_probs", "entropy", "is_top1")
"""What TRL's SFTTrainer asks of its fused LM head: the loss, and its entropy and token-accuracy metrics."""


def use_the_trainers_loss(model) -> None:
    """Patch `model` as TRL's SFTTrainer does, so that `model(**batch, fused_lm_head=True).loss` is the recipes'
    training loss: the LM head projects, in tiles, only the positions whose next token is a label (on CUDA; a
    CPU scores every position). Before LoRA wraps the model, as the trainer does it."""
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, outputs=SFT_TRAINER_HEAD_OUTPUTS)


def scored_positions(batch) -> int:
    """Positions whose next token is a label: where the fused LM head projects."""
    return int((batch["labels"][:, 1:] != -100).sum())


def apply_liger(model) -> None:
    """Liger's kernels on this Qwen2.5-VL instance (its RMSNorm, SwiGLU and RoPE).

    liger-kernel 0.8.5 (the newest) imports `Qwen2_5_VLCausalLMOutputWithPast`, which transformers
    5.17 has and 5.23 does not: with 5.23 its Qwen2.5-VL patch cannot load (found on CPU, with
    Triton installed), and the run stops saying so."""
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2_5_vl
    except ImportError as err:
        raise SystemExit(
            f"--liger needs liger-kernel, which runs Triton kernels on a GPU (pip install liger-kernel): {err}"
        ) from None
    try:
        # TRL's trainer turns Liger's fused cross-entropy off: its own fused LM head computes the loss
        apply_liger_kernel_to_qwen2_5_vl(model=model, fused_linear_cross_entropy=False)
    except ImportError as err:
        import transformers

        raise SystemExit(
            f"--liger: liger-kernel's Qwen2.5-VL patch does not load with transformers {transformers.__version__}: "
            f"{err}"
        ) from None


def compile_blocks(model, backend: str = "inductor") -> int:
    """Regional compilation: `torch.compile` in place each block the model repeats (the classes it
    declares in `_no_split_modules`: Qwen2.5-VL's decoder layers and vision blocks), shapes dynamic
    since sequence lengths vary batch to batch. Compiled lazily, at the first step; returns how many."""
    block_classes = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [module for module in model.modules() if type(module).__name__ in block_classes]
    for block in blocks:
        block.compile(backend=backend, dynamic=True)
    return len(blocks)


def compile_counts() -> dict[str, int]:
    """Graphs compiled and graph breaks so far: many graphs mean recompiles, breaks mean eager gaps."""
    from torch._dynamo.utils import counters

    return {
        "compiled_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def build_synthetic_gemex(workdir: Path, rows: int, image_size: int) -> Path:
    """A real `cxr-vqa` build (embed mode, long side `image_size`) of a synthetic release with at least `rows` training questions."""
    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic.release import generate

    built = workdir / f"gemex-{rows}-{image_size}"
    if not built.exists():
        release = generate(workdir / f"release-{rows}", num_images=rows // 8 + 8, layouts=("per_type",))
        build_gemex(
            BuildSettings(
                source=release.root / "per_type",
                out=built,
                images=release.image_root,
                image_mode="embed",
                image_size=image_size,
            )
        )
    return built


def count_parameters(model) -> tuple[int, int, int]:
    """(language model without embeddings, vision tower, embeddings) parameter counts, adapters excluded."""
    named = [(n, p) for n, p in model.named_parameters() if "lora_" not in n]
    vision = sum(p.numel() for n, p in named if ".visual." in f".{n}")
    embeddings = sum(p.numel() for n, p in named if "embed_tokens" in n)
    config = model.config
    if not getattr(config, "tie_word_embeddings", False):
        embeddings += sum(p.numel() for n, p in named if "lm_head" in n)
    total = sum(p.numel() for _, p in named)
    return total - vision - embeddings, vision, embeddings


def step_flops(batch, n_language: int, n_vision: int, text_config, weight_factor: int = 6) -> float:
    """Model FLOPs of one training step; `weight_factor` 6 when every weight is trained, 4 for frozen ones. The
    LM head counts where the fused head projects (`scored_positions`)."""
    tokens = int(batch["attention_mask"].sum())
    patches = int(batch["pixel_values"].shape[0]) if "pixel_values" in batch else 0
    seq_sq = float((batch["attention_mask"].sum(dim=1).float() ** 2).sum())
    attention = 6 * text_config.num_hidden_layers * text_config.hidden_size * seq_sq  # causal: half of 12·L·h·s²
    lm_head = weight_factor * text_config.hidden_size * text_config.vocab_size * scored_positions(batch)
    return weight_factor * (n_language * tokens + n_vision * patches) + attention + lm_head


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
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available; cpu with --tiny).")
    parser.add_argument(
        "--dataset", default=None, help="A built GEMeX or ReXVQA folder to train on (default: build one)."
    )
    parser.add_argument("--dataset_config", default=None, help="Its config, e.g. sft or sft_per_image.")
    parser.add_argument("--split", default="train")
    parser.add_argument(
        "--lora", action="store_true", help="Train LoRA adapters on all linear layers, not every weight."
    )
    parser.add_argument("--lora_r", type=int, default=32)
    parser.add_argument("--lora_alpha", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="Measured steps, after the warm-up.")
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument(
        "--rows", type=int, default=512, help="Rows of the split trained on (a synthetic build's size)."
    )
    parser.add_argument(
        "--image_size", type=int, default=512, help="Side of the stored synthetic images (no --dataset)."
    )
    pixel_budget.add_arguments(parser)
    parser.add_argument("--num_workers", type=int, default=8, help="DataLoader workers decoding and collating.")
    parser.add_argument("--gradient_checkpointing", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--attn_implementation", default="sdpa")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default=None,
        help="The weights' dtype (default: the recipe's, bfloat16 on a GPU that has it; float32 on CPU).",
    )
    parser.add_argument(
        "--group_by_length",
        action="store_true",
        help="Batch rows of like length (LengthGroupedSampler over token counts from text and stored image sizes).",
    )
    parser.add_argument(
        "--chunked_vision_attention",
        action="store_true",
        help="The vision tower's windows attended a few sdpa calls a layer, as the recipes do "
        "(training_recipes/runtime/vision_attention.py); without it, one call per window.",
    )
    parser.add_argument(
        "--flash_first",
        action="store_true",
        help="Attention tries FlashAttention before cuDNN, as the recipes do (training_recipes/runtime/attention_kernels.py); "
        "without it, torch's own order (cuDNN first on Hopper and Blackwell).",
    )
    parser.add_argument("--liger", action="store_true", help="Liger's Triton kernels (liger-kernel; GPU only).")
    parser.add_argument("--compile", action="store_true", help="torch.compile each decoder layer and vision block.")
    parser.add_argument(
        "--compile_backend", default="inductor", help="torch.compile's backend (aot_eager for a CPU smoke test)."
    )
    parser.add_argument("--peak_tflops", type=float, default=None, help="Override the GPU's dense bf16 peak.")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help=f"Where MFU < {MFU_TARGET:.0%}% (full fine-tuning) or data wait >= {DATA_WAIT_TARGET:.0%}%: "
        "profile a few more steps into DIR (trace.json.gz, ops.txt).",
    )
    parser.add_argument("--profile_when", choices=("miss", "always"), default="miss")
    parser.add_argument("--profile_steps", type=int, default=2)
    parser.add_argument("--output_json", default=None, help="Also write the result here.")
    parser.add_argument("--workdir", default="/tmp/cxr-vqa-bench")
    return parser.parse_args(argv)


def training_split(args):
    from datasets import load_dataset

    built = (
        Path(args.dataset) if args.dataset else build_synthetic_gemex(Path(args.workdir), args.rows, args.image_size)
    )
    split = load_dataset(str(built), args.dataset_config, split=args.split)
    return split.select(range(min(args.rows, len(split))))


def missed_targets(result: dict) -> list[str]:
    missed = []
    if not result["lora"] and result["mfu"] is not None and result["mfu"] < MFU_TARGET:
        missed.append(f"MFU {result['mfu']:.1%} < {MFU_TARGET:.0%}")
    if result["data_wait_share"] >= DATA_WAIT_TARGET:
        missed.append(f"data wait {result['data_wait_share']:.1%} >= {DATA_WAIT_TARGET:.0%}")
    return missed


def write_profile(step, steps: int, device: torch.device, directory: Path) -> dict:
    """A torch profiler trace of `steps` training steps and its top operators by device time; returns
    where the steps' time went (`benchmarks/step_profile.py`)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    directory.mkdir(parents=True, exist_ok=True)
    trace = directory / "trace.json"
    prof.export_chrome_trace(str(trace))
    summary = step_profile.summarise(step_profile.read_trace(trace))
    with trace.open("rb") as raw, gzip.open(directory / "trace.json.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()
    sort_by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    (directory / "ops.txt").write_text(prof.key_averages().table(sort_by=sort_by, row_limit=40))
    return summary


def main(argv: list[str] | None = None) -> dict:
    from torch.utils.data import DataLoader
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from trl.chat_template_utils import get_training_chat_template
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from training_recipes.data import conversational, sequence_lengths, settings_for

    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if args.tiny:
        args.image_size, args.max_pixels, args.min_pixels, args.num_workers = (
            min(args.image_size, 112),
            56 * 56,
            56 * 56,
            0,
        )
    torch.manual_seed(0)
    budget = pixel_budget.from_arguments(args)
    model, processor = build_model_and_processor(
        model_preset(TINY if args.tiny else MODELS[args.model]), budget, args.attn_implementation, device
    )
    dtype = args.dtype or (default_dtype() if device.type == "cuda" else "float32")
    model.to(getattr(torch, dtype))
    if args.chunked_vision_attention:
        use_chunked_vision_attention(model)
    n_language, n_vision, n_embed = count_parameters(model)
    use_the_trainers_loss(model)
    if args.liger:
        apply_liger(model)
    compiled_blocks = compile_blocks(model, args.compile_backend) if args.compile else 0
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if args.lora:
            model.enable_input_require_grads()
    if args.lora:
        model = add_lora(model, args.lora_r, args.lora_alpha)
    model.train()

    settings = settings_for("qwen2_5_vl", processor, pixel_budget=budget)
    split = training_split(args)
    dataset = conversational(split, settings)
    sampler = None
    if args.group_by_length:
        lengths = sequence_lengths(split, settings, processor)
        sampler = LengthGroupedSampler(args.batch_size, lengths=lengths, generator=torch.Generator().manual_seed(0))
    collator = DataCollatorForVisionLanguageModeling(
        processor, assistant_only_loss=True, chat_template=get_training_chat_template(processor)
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=collator,
        num_workers=args.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.num_workers > 0,
        drop_last=len(dataset) >= args.batch_size,
        prefetch_factor=4 if args.num_workers > 0 else None,
    )
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-5, fused=device.type == "cuda")
    weight_factor = 4 if args.lora else 6
    text_config = model.config.get_text_config()

    def batches():
        while True:
            yield from loader

    stream = batches()
    attention_order = flash_first if args.flash_first else nullcontext
    totals = {"wait": 0.0, "compute": 0.0, "flops": 0.0, "samples": 0, "tokens": 0, "positions": 0}

    def step() -> None:
        started = time.perf_counter()
        batch = next(stream)
        waited = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with attention_order():  # the backward pass recomputes checkpointed layers' attention too
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(**batch, fused_lm_head=True).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        finished = time.perf_counter()
        totals["wait"] += waited - started
        totals["compute"] += finished - waited
        totals["flops"] += step_flops(batch, n_language, n_vision, text_config, weight_factor)
        totals["samples"] += int(batch["input_ids"].shape[0])
        totals["tokens"] += int(batch["attention_mask"].sum())
        totals["positions"] += batch["attention_mask"].numel()

    for _ in range(args.warmup_steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    totals.update(wait=0.0, compute=0.0, flops=0.0, samples=0, tokens=0, positions=0)
    for _ in range(args.steps):
        step()

    elapsed = totals["wait"] + totals["compute"]
    peak = peak_tflops(device, args.peak_tflops)
    if device.type == "cuda":
        peak_memory_gb = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        peak_memory_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # host RSS on CPU
    samples = totals["samples"]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": "tiny" if args.tiny else args.model,
        "dataset": args.dataset,
        "dataset_config": args.dataset_config,
        "lora": args.lora,
        "parameters_b": round((n_language + n_vision + n_embed) / 1e9, 3),
        "trainable_parameters_b": round(sum(p.numel() for p in trained) / 1e9, 4),
        "batch_size": args.batch_size,
        "max_pixels": args.max_pixels,
        "gradient_checkpointing": args.gradient_checkpointing,
        "attn_implementation": args.attn_implementation,
        "dtype": dtype,
        "speedups": [
            name
            for name, on in (
                ("group_by_length", args.group_by_length),
                ("chunked_vision_attention", args.chunked_vision_attention),
                ("flash_first", args.flash_first),
                ("liger", args.liger),
                ("compile", args.compile),
            )
            if on
        ],
        "compiled_blocks": compiled_blocks,
        **(compile_counts() if args.compile else {}),
        "steps": args.steps,
        "samples_per_s": samples / elapsed,
        "tokens_per_s": totals["tokens"] / elapsed,
        "tokens_per_sample": totals["tokens"] / max(samples, 1),
        "flops_per_sample": totals["flops"] / max(samples, 1),
        "achieved_tflops": totals["flops"] / elapsed / 1e12,
        "mfu": (totals["flops"] / elapsed / 1e12) / peak if peak else None,
        "peak_memory_gb": peak_memory_gb,
        "data_wait_share": totals["wait"] / elapsed,
        "padding_share": 1 - totals["tokens"] / max(totals["positions"], 1),
    }
    result["missed_targets"] = missed_targets(result)
    if args.profile and (result["missed_targets"] or args.profile_when == "always"):
        result["profile_summary"] = write_profile(step, args.profile_steps, device, Path(args.profile))
        result["profile"] = args.profile
    mfu = f"{result['mfu']:.1%}" if result["mfu"] is not None else "n/a (no known peak; --peak_tflops)"
    print(
        f"{result['model']}{' LoRA' if args.lora else ''} on {result['device']}: {result['samples_per_s']:.2f} samples/s, "
        f"{result['tokens_per_s']:.0f} tokens/s, MFU {mfu}, peak memory {peak_memory_gb:.1f} GiB, "
        f"data wait {result['data_wait_share']:.1%} of step time, padding {result['padding_share']:.1%} of positions"
    )
    if "profile_summary" in result:
        print(f"profile: {step_profile.describe(result['profile_summary'])}")
    print(json.dumps(result))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
