"""Make a tiny random-weight vision-language model and its processor, offline, for smoke runs.

    python -m training_recipes.tiny_model --family idefics3 --out tiny-idefics3

Nothing is downloaded: the model is built from a config with random weights (hidden size 32, one
layer, 56 px images, a few MB) and its processor wraps a small byte-level BPE tokenizer trained
here on the recipes' own prompt text, with the special tokens that family's processor and chat
template need. The chat templates are the families' released ones as TRL ships them
(`trl/chat_templates/*.jinja`), so TRL recognises them and swaps in its training variants with
`{% generation %}` markers exactly as for the Hub models. The folder it writes loads with
`AutoModelForImageTextToText` / `AutoProcessor.from_pretrained`, as a Hub checkpoint does, so
`sft.py` and `generate.py` take it as `--model_name_or_path`. It learns the answer format in a few
steps; it says nothing about any real model.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from gemex_dataset.prompts import TYPE_PROMPTS
from rexvqa_dataset.prompts import INSTRUCTION
from training_recipes.runtime.processors import TORCHVISION_INSTALL, RecipeError, torchvision_problem

FAMILIES = ("idefics3", "gemma3", "qwen2_5_vl")
"""What `--family` takes; idefics3 and gemma3 need nothing beyond the `train` extra, qwen2_5_vl torchvision."""
IMAGE_SIZE = 56


@dataclass(frozen=True)
class ModelSize:
    """A tiny model's shape: its decoder, its SigLIP tower, the square image it sees and the image tokens
    that reach the decoder (the tower's patches merged `merge` x `merge` by the family's connector)."""

    width: int
    layers: int
    vision_width: int
    vision_layers: int
    image_size: int
    patch_size: int
    merge: int
    init_std: float = 0.02
    """The standard deviation of the random weights (`initializer_range`, the Hub configs' 0.02 by default)."""

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size // self.merge) ** 2

    def decoder(self) -> dict:
        heads = max(2, self.width // 32)
        return dict(
            hidden_size=self.width,
            intermediate_size=2 * self.width,
            num_hidden_layers=self.layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=2048,
            initializer_range=self.init_std,
        )

    def siglip(self) -> dict:
        return dict(
            hidden_size=self.vision_width,
            intermediate_size=2 * self.vision_width,
            num_hidden_layers=self.vision_layers,
            num_attention_heads=max(2, self.vision_width // 32),
            image_size=self.image_size,
            patch_size=self.patch_size,
            initializer_range=self.init_std,
        )


SMOKE = ModelSize(width=32, layers=1, vision_width=32, vision_layers=1, image_size=IMAGE_SIZE, patch_size=14, merge=2)
"""The smoke model's shape (a few MB); it learns the reply format in a few steps."""
TINY_DECODER = SMOKE.decoder()
"""Every family's language model at the smoke size, one layer of width 32."""
TINY_SIGLIP = SMOKE.siglip()
"""Idefics3's and Gemma 3's SigLIP vision tower at the smoke size, one layer of width 32."""
CHAT_TEMPLATES = Path(trl.__file__).parent / "chat_templates"


@dataclass
class TinyVLM:
    family: str
    model: object
    processor: object


def chat_template(name: str) -> str:
    return (CHAT_TEMPLATES / f"{name}.jinja").read_text()


def corpus() -> list[str]:
    """Text the tokenizer learns merges from: the prompts and the shapes of targets."""
    lines = list(TYPE_PROMPTS.values()) + [INSTRUCTION]
    lines += [
        "<answer> ['A', 'C'] <reason> The right lung shows an opacity. <location> [[12, 30, 40, 51]]",
        "Which regions may require further investigation? <choices>: [A: Left lung, B: Spine]",
        "Is there any evidence of a left pneumothorax? Yes. No. cardiac region effusion consolidation",
        "0123456789 [], abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .:?'\"\n",
    ]
    return lines * 4


def train_tokenizer(
    special_tokens: list[str], vocab_size: int = 400, texts: Sequence[str] = (), **kwargs
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (any text encodes, no unknown token) with `special_tokens` as whole tokens, its merges
    learnt from the recipes' prompts; with `texts` as well, learnt from them until every word is whole."""
    if texts:
        vocab_size = WHOLE_WORDS_VOCAB
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus() + list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs)


WHOLE_WORDS_VOCAB = 16_384
"""A cap a build's words never reach: its BPE merges run until each word is one token."""


def padded_vocab(tokenizer) -> int:
    return ((len(tokenizer) + 63) // 64) * 64


QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""The special tokens of the Qwen2.5-VL and Qwen3-VL chat templates and processors."""


def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer trained here with Qwen-VL's special tokens, ending a turn with `<|im_end|>`."""
    return train_tokenizer(list(QWEN_SPECIAL_TOKENS), eos_token="<|im_end|>", pad_token="<|endoftext|>")


def tiny_qwen2_5_vl(processor_class=None) -> TinyVLM:
    """Qwen2.5-VL with its released processor class, whose video processor needs torchvision
    (`processor_class` swaps in another: `image_only_qwen2_5_vl_processor_class`'s)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    tokenizer = qwen_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE * IMAGE_SIZE, "longest_edge": IMAGE_SIZE * IMAGE_SIZE},
        patch_size=14,
        merge_size=2,
    )
    if processor_class is None:
        processor = released_qwen2_5_vl_processor(image_processor, tokenizer)
    else:
        processor = processor_class(
            image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template("qwen2_5_vl")
        )
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **TINY_DECODER,
            vocab_size=padded_vocab(tokenizer),
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            bos_token_id=ids("<|endoftext|>"),
            eos_token_id=ids("<|im_end|>"),
            pad_token_id=ids("<|endoftext|>"),
        ),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[0],
        ),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return TinyVLM("qwen2_5_vl", Qwen2_5_VLForConditionalGeneration(config), processor)


def image_only_qwen2_5_vl_processor_class():
    """Qwen2.5-VL's processor without its video processor, whose base class needs torchvision (which no
    PyPI build imports beside the CPU torch); images only, which is all the recipes use."""
    from transformers import ProcessorMixin, Qwen2_5_VLProcessor

    class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = "<|image_pad|>"
            self.video_token = "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImageOnlyQwen2_5_VLProcessor


def released_qwen2_5_vl_processor(image_processor, tokenizer):
    """`Qwen2_5_VLProcessor` as the Hub checkpoints save it, video processor included (it needs torchvision)."""
    from transformers import Qwen2_5_VLProcessor

    problem = torchvision_problem()
    if problem:
        raise RecipeError(
            f"the Qwen2.5-VL processor cannot be built: {problem}; {TORCHVISION_INSTALL} "
            "(or make an idefics3 or gemma3 model, which need no torchvision)"
        )
    from transformers import Qwen2VLVideoProcessor

    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=chat_template("qwen2_5_vl"),
    )


def idefics3_image_processor(image_size: int):
    """The tiny Idefics3's image processor: one square of `image_size` pixels a side, no tiles."""
    from transformers import Idefics3ImageProcessorPil

    return Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
    )


def tiny_idefics3(size: ModelSize = SMOKE, texts: Sequence[str] = ()) -> TinyVLM:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )

    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<image>",
        "<fake_token_around_image>",
        "<global-img>",
        "<pad>",
    ]
    specials += [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tokenizer = train_tokenizer(
        specials, texts=texts, bos_token="<|begin_of_text|>", eos_token="<end_of_utterance>", pad_token="<pad>"
    )
    processor = Idefics3Processor(
        image_processor=idefics3_image_processor(size.image_size),
        tokenizer=tokenizer,
        image_seq_len=size.image_tokens,
        chat_template=chat_template("idefics3"),
    )
    ids = tokenizer.convert_tokens_to_ids
    config = Idefics3Config(
        vision_config=size.siglip(),
        text_config=dict(
            **size.decoder(),
            model_type="llama",
            vocab_size=padded_vocab(tokenizer),
            bos_token_id=ids("<|begin_of_text|>"),
            eos_token_id=ids("<end_of_utterance>"),
            pad_token_id=ids("<pad>"),
        ),
        scale_factor=size.merge,
        image_token_id=ids("<image>"),
        initializer_range=size.init_std,
    )
    return TinyVLM("idefics3", Idefics3ForConditionalGeneration(config), processor)


def tiny_gemma3(size: ModelSize = SMOKE, texts: Sequence[str] = ()) -> TinyVLM:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil, Gemma3Processor

    specials = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<start_of_image>",
        "<end_of_image>",
        "<image_soft_token>",
    ]
    tokenizer = train_tokenizer(
        specials,
        texts=texts,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    image_processor = Gemma3ImageProcessorPil(size={"height": size.image_size, "width": size.image_size})
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=size.image_tokens,
        chat_template=chat_template("gemma3"),
    )
    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        text_config=dict(
            **size.decoder(),
            vocab_size=padded_vocab(tokenizer),
            head_dim=16,
            sliding_window=64,
            bos_token_id=ids("<bos>"),
            eos_token_id=ids("<eos>"),
            pad_token_id=ids("<pad>"),
        ),
        vision_config=size.siglip(),
        mm_tokens_per_image=size.image_tokens,
        initializer_range=size.init_std,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    return TinyVLM("gemma3", Gemma3ForConditionalGeneration(config), processor)


BUILDERS = {"idefics3": tiny_idefics3, "gemma3": tiny_gemma3, "qwen2_5_vl": tiny_qwen2_5_vl}


def tiny_vlm(family: str, seed: int = 0, builders: dict = BUILDERS) -> TinyVLM:
    """A fresh tiny model (seeded random weights) and its processor, made by `builders[family]`."""
    import torch

    torch.manual_seed(seed)
    return builders[family]()


def save_tiny_vlm(family: str, directory: Path, seed: int = 0, builders: dict = BUILDERS) -> Path:
    """Write a tiny model and processor to `directory`, the way a Hub checkpoint looks on disk."""
    vlm = tiny_vlm(family, seed, builders)
    vlm.model.save_pretrained(directory)
    vlm.processor.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training_recipes.tiny_model",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--family", choices=FAMILIES, default="idefics3", help="the model family to copy the shape of")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    try:
        save_tiny_vlm(args.family, args.out, args.seed)
    except RecipeError as error:
        print(f"tiny_model: error: {error}", file=sys.stderr)
        return 1
    print(f"{args.out}: a tiny random-weight {args.family} model and its processor (offline; for smoke runs only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
