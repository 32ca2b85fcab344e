"""What a fine-tuning run trains and evaluates on: the built folders' splits (local or from the Hub,
their images from `--image_root` where the build left them out) as conversations, mixed by weight
when there are two, a stream cut into whole steps, and each split's token counts for batches of
rows of like length."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from datasets import Dataset, IterableDataset, load_dataset
from trl import SFTConfig

from builders.local_images import HELP as LOCAL_IMAGES_HELP
from builders.local_images import with_local_images
from builders.pixel_budget import PixelBudgetOptions
from training_recipes.data import (
    REPLIES,
    ConversationSettings,
    conversational,
    first_rows,
    layout_config,
    mix,
    sequence_lengths,
    stream_sharding,
    whole_steps,
)


@dataclass
class DataArguments(PixelBudgetOptions):
    """Which built folders to train on, and how their rows become conversations."""

    gemex_path: str | None = field(default=None, metadata={"help": "Built GEMeX folder (or Hub repo id)."})
    rexvqa_path: str | None = field(default=None, metadata={"help": "Built ReXVQA folder (or Hub repo id)."})
    gemex_config: str | None = field(default=None, metadata={"help": "GEMeX config, e.g. one question type."})
    rexvqa_config: str | None = field(default=None, metadata={"help": "ReXVQA config, e.g. one task."})
    gemex_weight: float = field(default=1.0, metadata={"help": "Sampling weight of GEMeX when mixing."})
    rexvqa_weight: float = field(default=1.0, metadata={"help": "Sampling weight of ReXVQA when mixing."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_split: str | None = field(default=None, metadata={"help": "Split to evaluate the loss on (e.g. validation)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N rows per dataset."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the rows (nothing cached on disk; a cached load holds an image copy per question). Needs --max_steps."
        },
    )
    box_convention: str | None = field(
        default=None,
        metadata={"help": "pixels, qwen2.5-vl, norm1000 or frame224; by default from the model family."},
    )
    layout: str = field(
        default="per_question",
        metadata={
            "help": "per_question: one question a row (the paper's setup; --gemex_config/--rexvqa_config pick the config). "
            "per_image: one conversation per image (GEMeX sft_per_image, ReXVQA sft_per_study), loss on every "
            "reply; each image is sent once, not once per question, and a non-streaming load caches it once."
        },
    )
    reply: str = field(
        default="full",
        metadata={
            "help": "What a trained reply holds: full (answer, reason or explanation, boxes), answer (the answer "
            "alone: the loss on what only the image gives; a small model from scratch learns the images this "
            "way), answer_boxes (GEMeX: the reason left out) or checklist (ReXVQA: a yes/no verdict on every "
            "option, then the letter; answer with generate.py --choose_by likelihood).",
            "choices": list(REPLIES),
        },
    )
    fold_system_prompt: bool | None = field(
        default=None,
        metadata={
            "help": "Put the instruction in the user turn; by default when the chat template rejects a system turn."
        },
    )
    image_root: str | None = field(default=None, metadata={"help": LOCAL_IMAGES_HELP})


def load_split(
    path: str,
    config: str | None,
    split: str,
    max_samples: int | None = None,
    streaming: bool = False,
    image_root: str | None = None,
) -> Dataset | IterableDataset:
    dataset = load_dataset(path, config, split=split, streaming=streaming)
    if image_root:
        dataset = with_local_images(dataset, image_root, streaming)
    if streaming:
        return first_rows(dataset, max_samples) if max_samples is not None else dataset
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    return dataset


def training_data(data_args: DataArguments, settings, split: str, seed: int, max_samples: int | None = None):
    """One dataset: its lazy conversational split. Two, or `streaming`: a (weighted) stream."""
    weighted = []
    if data_args.gemex_path:
        config = layout_config("gemex", data_args.layout, data_args.gemex_config)
        gemex = load_split(data_args.gemex_path, config, split, max_samples, data_args.streaming, data_args.image_root)
        weighted.append((gemex, data_args.gemex_weight))
    if data_args.rexvqa_path:
        config = layout_config("rexvqa", data_args.layout, data_args.rexvqa_config)
        rexvqa = load_split(
            data_args.rexvqa_path, config, split, max_samples, data_args.streaming, data_args.image_root
        )
        weighted.append((rexvqa, data_args.rexvqa_weight))
    if not weighted:
        raise ValueError("give --gemex_path, --rexvqa_path or both")
    if len(weighted) == 1 and not data_args.streaming:
        return conversational(weighted[0][0], settings)
    return mix(weighted, settings, seed=seed)


def split_lengths(dataset, settings, processor, num_proc: int | None) -> list[int] | None:
    """Token counts of a map-style split's rows; None for a stream (read in its own order)."""
    if not isinstance(dataset, Dataset):
        return None
    return sequence_lengths(dataset.with_format(None), settings, processor, num_proc=num_proc)


@dataclass
class TrainingSplits:
    train: Dataset | IterableDataset
    eval: Dataset | None
    lengths: dict[str, list[int]]
    """Token counts by split ("train", "eval"), for batches of like length; a stream has none."""
    streamed: bool

    @classmethod
    def of(cls, data_args: DataArguments, training_args: SFTConfig, settings: ConversationSettings, processor):
        train = training_data(
            data_args, settings, data_args.train_split, training_args.seed, data_args.max_train_samples
        )
        evaluated = None
        if data_args.eval_split:
            evaluated = training_data(data_args, settings, data_args.eval_split, training_args.seed)
        lengths = {}
        if training_args.train_sampling_strategy == "group_by_length":
            for split, dataset in (("train", train), ("eval", evaluated)):
                counted = split_lengths(dataset, settings, processor, training_args.dataset_num_proc)
                if counted is not None:
                    lengths[split] = counted
        streamed = isinstance(train, IterableDataset)
        if streamed:
            rows_per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
            train = whole_steps(train, rows_per_step)
            if training_args.process_index == 0:
                print(stream_sharding(train, training_args.world_size), file=sys.stderr)
        return cls(train, evaluated, lengths, streamed)
