"""Built GEMeX / ReXVQA splits as TRL's conversational vision format (`images` + `messages`).

A split of either layout (`LAYOUTS`: one question a row, or one conversation per image) converts
the same way; conversation rows are written again turn by turn in the model's box convention.
The conversion is lazy: a split is wrapped with `Dataset.with_transform`, so an image is decoded
only when the row is part of a batch, and a mixture of datasets is a stream
(`interleave_datasets` over `IterableDataset`s) that decodes as it goes. The text comes from
`gemex_dataset.prompts` / `rexvqa_dataset.prompts`, the same functions generation uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
from datasets import Dataset, Features, Image, IterableDataset, List, Value, interleave_datasets
from PIL import Image as PILImage

from builders.assembly.sft import conversation
from gemex_dataset import prompts as gemex_prompts
from gemex_dataset.features import PER_IMAGE_CONFIG
from rexvqa_dataset import prompts as rexvqa_prompts
from rexvqa_dataset.features import PER_STUDY_CONFIG

TRL_FEATURES = Features(
    {
        "images": List(Image(decode=False)),
        "messages": List({"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})}),
    }
)
"""The conversational vision columns of a stream, typed so streams of both datasets interleave;
images stay encoded until `decode_images`."""

IMAGE = Image()

PROMPTS: dict[str, ModuleType] = {"gemex": gemex_prompts, "rexvqa": rexvqa_prompts}

BOX_CONVENTION_BY_MODEL_TYPE: dict[str, str] = {
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen2_vl": "norm1000",
    "qwen3_vl": "norm1000",
    "qwen3_vl_moe": "norm1000",
}
"""Model families that write boxes in their own convention; every other family gets image pixels."""


@dataclass
class ConversationSettings:
    """How rows become conversations for one model: the box convention, whether the system prompt
    is folded into the user turn, and (Qwen2.5-VL) the processor's resize bounds."""

    box_convention: str = "pixels"
    fold_system: bool = False
    resize_kwargs: dict[str, int] = field(default_factory=dict)


LAYOUTS = ("per_question", "per_image")
"""How a split's rows are laid out: one question a row (`sft`, `default`, a per-type config), or one
conversation a row (GEMeX `sft_per_image`, ReXVQA `sft_per_study`: an image's questions as turns)."""
CONVERSATION_CONFIGS: dict[str, str] = {"gemex": PER_IMAGE_CONFIG, "rexvqa": PER_STUDY_CONFIG}
"""The config each dataset's `per_image` layout reads."""


def dataset_kind(column_names: list[str], features: Features | None = None) -> str:
    """``gemex`` or ``rexvqa``, from the columns of a built split (and, for conversation rows, their `turns`)."""
    if "turns" in column_names:
        if features is None or "turns" not in features:
            raise ValueError("conversation rows (a `turns` column) need the split's features to tell the dataset")
        column_names = list(features["turns"].feature)
    if "question_type" in column_names and "reason" in column_names:
        return "gemex"
    if "options" in column_names:
        return "rexvqa"
    raise ValueError(f"not a built GEMeX or ReXVQA split: columns {column_names}")


def layout_config(kind: str, layout: str, config: str | None) -> str | None:
    """The config to load for `layout`: `config` as given per question; the dataset's conversation config per image."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if layout == "per_question":
        return config
    if config not in (None, CONVERSATION_CONFIGS[kind]):
        raise ValueError(f"{kind} config {config!r} holds one question a row; the per_image layout reads {CONVERSATION_CONFIGS[kind]!r}")
    return CONVERSATION_CONFIGS[kind]


def to_rgb(image: PILImage.Image) -> PILImage.Image:
    """8-bit RGB for the processors; 16-bit greyscale (ReXVQA PNGs) is scaled, not clipped."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        pixels = np.asarray(image, dtype=np.float32)
        top = float(pixels.max()) or 1.0
        image = PILImage.fromarray((pixels * (255.0 / top)).astype(np.uint8), mode="L")
    return image if image.mode == "RGB" else image.convert("RGB")


def row_images(row: dict, kind: str) -> list[PILImage.Image]:
    images = [row["image"]] if kind == "gemex" else list(row["images"])
    return [to_rgb(image) for image in images]


def to_messages(row: dict, kind: str, settings: ConversationSettings, with_answer: bool = True) -> list[dict]:
    """The row's chat turns for this model. A conversation row (`turns`) is written again a question at a
    time from its typed turns, with the image's columns, and joined as the build joins them."""
    if "turns" in row:
        shared = {k: v for k, v in row.items() if k not in ("turns", "question_ids", "messages")}
        return conversation([to_messages({**shared, **turn}, kind, settings, with_answer) for turn in row["turns"]])
    return PROMPTS[kind].to_messages(
        row,
        box_convention=settings.box_convention,
        with_answer=with_answer,
        fold_system=settings.fold_system,
        **settings.resize_kwargs,
    )


def to_trl_example(row: dict, kind: str, settings: ConversationSettings, with_answer: bool = True) -> dict:
    """One row as ``{"images": [PIL, ...], "messages": [...]}``."""
    return {"images": row_images(row, kind), "messages": to_messages(row, kind, settings, with_answer)}


def rows_of(batch: dict[str, list]) -> list[dict]:
    columns = list(batch)
    return [dict(zip(columns, values)) for values in zip(*(batch[c] for c in columns))]


def conversational(dataset: Dataset, settings: ConversationSettings, with_answer: bool = True) -> Dataset:
    """The split as `images` + `messages`, converted (and its images decoded) per accessed batch.

    Train with ``remove_unused_columns=False``: the stored columns are what the transform reads.
    """
    kind = dataset_kind(dataset.column_names, dataset.features)

    def transform(batch: dict[str, list]) -> dict[str, list]:
        examples = [to_trl_example(row, kind, settings, with_answer) for row in rows_of(batch)]
        return {"images": [e["images"] for e in examples], "messages": [e["messages"] for e in examples]}

    return dataset.with_transform(transform)


def conversational_stream(dataset: Dataset | IterableDataset, settings: ConversationSettings, num_shards: int = 8) -> IterableDataset:
    """The split as a stream of `images` + `messages` with the images still encoded.

    Images pass through as their stored bytes (decoding off), so nothing is decoded and
    re-encoded on the way; `decode_images` decodes each once, as the mixed stream is read.
    """
    kind = dataset_kind(dataset.column_names, dataset.features)
    column = "image" if kind == "gemex" else "images"
    undecoded = Image(decode=False) if kind == "gemex" else List(Image(decode=False))
    dataset = dataset.cast_column(column, undecoded)
    if not isinstance(dataset, IterableDataset):  # a streamed split already is one
        dataset = dataset.to_iterable_dataset(num_shards=min(num_shards, max(len(dataset), 1)))

    def convert(row: dict) -> dict:
        images = [row["image"]] if kind == "gemex" else list(row["images"])
        return {"images": images, "messages": to_messages(row, kind, settings)}

    return dataset.map(convert, remove_columns=dataset.column_names, features=TRL_FEATURES)


def mix(
    weighted: list[tuple[Dataset, float]],
    settings: ConversationSettings,
    seed: int = 0,
    num_shards: int = 8,
    shuffle_buffer: int = 1000,
) -> IterableDataset:
    """Several built splits as one stream, drawing from each with probability proportional to its weight.

    Stops when every dataset has been seen once in full (``all_exhausted``): the smaller ones
    repeat meanwhile, so the weights, not the sizes, set the mixture. Train with `max_steps`.
    """
    total = sum(weight for _, weight in weighted)
    streams = [conversational_stream(dataset, settings, num_shards) for dataset, _ in weighted]
    mixed = interleave_datasets(
        streams,
        probabilities=[weight / total for _, weight in weighted],
        seed=seed,
        stopping_strategy="all_exhausted",
    )
    return mixed.shuffle(seed=seed, buffer_size=shuffle_buffer).map(decode_images)


def decode_images(example: dict) -> dict:
    """Encoded images (``{"bytes", "path"}``) of a stream example as RGB PIL images."""
    return {"images": [to_rgb(IMAGE.decode_example(image)) for image in example["images"]]}


def box_convention_for(model_type: str) -> str:
    return BOX_CONVENTION_BY_MODEL_TYPE.get(model_type, "pixels")


def resize_kwargs_for(processor, box_convention: str) -> dict[str, int]:
    """Qwen2.5-VL's resize bounds (`qwen25vl_resized_size` arguments) read off its image processor."""
    if box_convention != "qwen2.5-vl":
        return {}
    image_processor = processor.image_processor
    size = getattr(image_processor, "size", None) or {}
    min_pixels = getattr(image_processor, "min_pixels", None) or size.get("shortest_edge")
    max_pixels = getattr(image_processor, "max_pixels", None) or size.get("longest_edge")
    kwargs = {"factor": image_processor.patch_size * image_processor.merge_size}
    if min_pixels:
        kwargs["min_pixels"] = int(min_pixels)
    if max_pixels:
        kwargs["max_pixels"] = int(max_pixels)
    return kwargs


def chat_template_accepts_system(processor) -> bool:
    """Whether the processor's chat template renders a system turn (some raise on one)."""
    probe = [
        {"role": "system", "content": [{"type": "text", "text": "SYSTEM-PROBE"}]},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    try:
        rendered = processor.apply_chat_template(probe, tokenize=False)
    except Exception:  # noqa: BLE001 - jinja2 TemplateError from raise_exception, or a template indexing error
        return False
    return "SYSTEM-PROBE" in rendered


def settings_for(
    model_type: str, processor, box_convention: str | None = None, fold_system: bool | None = None
) -> ConversationSettings:
    """The conversation settings a model family needs; explicit arguments win over the defaults."""
    convention = box_convention or box_convention_for(model_type)
    if fold_system is None:
        fold_system = not chat_template_accepts_system(processor)
    return ConversationSettings(convention, fold_system, resize_kwargs_for(processor, convention))
