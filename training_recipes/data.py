"""Built GEMeX / ReXVQA splits as TRL's conversational vision format (`images` + `messages`).

A split of either layout (`LAYOUTS`: one question a row, or one conversation per image) converts
the same way; conversation rows are written again turn by turn in the model's box convention.
The conversion is lazy: a split is wrapped with `Dataset.with_transform`, so an image is decoded
only when the row is part of a batch, and a mixture of datasets is a stream
(`interleave_datasets` over `IterableDataset`s) that decodes as it goes. For processors that resize
to a pixel count (the Qwen families) each image is decoded straight to the pixel budget's size
(`decode_image`), so the processor's own resize has nothing left to do and a box written in the
resized image's pixels is in the pixels the model sees. The text comes from
`gemex_dataset.prompts` / `rexvqa_dataset.prompts`, the same functions generation uses.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from types import ModuleType

import numpy as np
from datasets import Dataset, Features, Image, IterableDataset, List, Value, interleave_datasets
from PIL import Image as PILImage
from PIL import ImageOps

from builders.assembly.sft import ConversationFormat, conversation
from builders.pixel_budget import PixelBudget
from gemex_dataset import prompts as gemex_prompts
from gemex_dataset.features import PER_IMAGE_CONFIG
from rexvqa_dataset import prompts as rexvqa_prompts
from rexvqa_dataset.features import PER_STUDY_CONFIG

TRL_FEATURES = Features(
    {
        "images": List(Image(decode=False)),
        "messages": List(
            {"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})}
        ),
        "question_ids": List(Value("string")),
    }
)
"""The conversational vision columns of a stream, typed so streams of both datasets interleave;
images stay encoded until `decode_images`. `question_ids` names the questions a row trains (TRL's
collator ignores it), so a run can say which rows each process trained on."""

STREAM_SHARDS = 64
"""Shards of a stream made from a map-style split: enough to split over 1, 2, 4, 8, 16, 32 or 64
processes (`datasets.distributed.split_dataset_by_node` hands each process whole shards)."""
SHUFFLE_BLOCK = 1000
"""Rows a stream is shuffled within (`shuffled_in_blocks`)."""

PROMPTS: dict[str, ModuleType] = {"gemex": gemex_prompts, "rexvqa": rexvqa_prompts}

BOX_CONVENTION_BY_MODEL_TYPE: dict[str, str] = {
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen2_vl": "norm1000",
    "qwen3_vl": "norm1000",
    "qwen3_vl_moe": "norm1000",
}
"""Model families that write boxes in their own convention; every other family gets image pixels."""


REPLIES = ("full", "answer", "answer_boxes", "checklist")
"""What a trained reply holds. `full`: the answer, the reason (ReXVQA: explanation) and GEMeX's boxes.
`answer`: the reason emptied and no boxes (``<answer> Yes. <reason>  <location> []``, ReXVQA
``<answer> C <reason>``), so the loss falls on the answer, the one part only the image gives: the reason's
wording, drawn from templates, otherwise swamps the answer's gradient in a small model's first hundreds of
steps. `answer_boxes`: the reason emptied, GEMeX's boxes kept. `checklist` (ReXVQA): a yes/no verdict on every option, then
the letter (`rexvqa_dataset.prompts.checklist_text`), for `generate.py --choose_by likelihood`. The prompt, and so
generation, is the same."""


@dataclass
class ConversationSettings:
    """How rows become conversations for one model: the box convention, whether the system prompt
    is folded into the user turn, and, for a processor that resizes to a pixel count (Qwen
    families), its pixel budget with its factor: images are decoded to it and Qwen2.5-VL's boxes
    are written in its pixels. None for a processor of fixed input size: images keep their size.
    `reply`: what a trained reply holds (`REPLIES`)."""

    box_convention: str = "pixels"
    fold_system: bool = False
    pixel_budget: PixelBudget | None = None
    reply: str = "full"


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
        raise ValueError(
            f"{kind} config {config!r} holds one question a row; the per_image layout reads {CONVERSATION_CONFIGS[kind]!r}"
        )
    return CONVERSATION_CONFIGS[kind]


def to_rgb(image: PILImage.Image) -> PILImage.Image:
    """8-bit RGB for the processors; 16-bit greyscale (ReXVQA PNGs) is scaled, not clipped."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        pixels = np.asarray(image, dtype=np.float32)
        top = float(pixels.max()) or 1.0
        image = PILImage.fromarray((pixels * (255.0 / top)).astype(np.uint8), mode="L")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_image(image: PILImage.Image | dict, budget: PixelBudget | None = None) -> PILImage.Image:
    """An RGB image from stored bytes (``{"bytes", "path"}``) or a decoded image; with a `budget`,
    at the size the processor resizes it to (`PixelBudget.resized_size` of the stored size).

    A JPEG is decoded at a reduced scale (Pillow's `draft`: libjpeg's 1/2, 1/4 or 1/8 DCT
    scaling, never below the target size) before the exact resize, so a 2,539 x 3,050 MIMIC-CXR
    image bound for 644 x 756 is decoded at 1/2 scale, not in full. The EXIF orientation is
    applied, as `datasets` does.
    """
    if isinstance(image, dict):
        image = PILImage.open(io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"])
    target = budget.resized_size(*image.size) if budget else None
    if target and image.format == "JPEG":
        image.draft(image.mode, target)
    orientation = image.getexif().get(PILImage.ExifTags.Base.Orientation)
    if orientation is not None:
        image = ImageOps.exif_transpose(image)
        if target and orientation in (5, 6, 7, 8):  # a quarter turn swaps the sides; the resize is symmetric
            target = target[::-1]
    image = to_rgb(image)
    if target and image.size != target:
        image = image.resize(target, PILImage.Resampling.BICUBIC)
    return image


def row_images(row: dict, kind: str, settings: ConversationSettings | None = None) -> list[PILImage.Image]:
    """The row's images (decoded or stored bytes) as RGB, at the settings' pixel budget when it has one."""
    images = [row["image"]] if kind == "gemex" else list(row["images"])
    return [decode_image(image, settings.pixel_budget if settings else None) for image in images]


def to_messages(row: dict, kind: str, settings: ConversationSettings, with_answer: bool = True) -> list[dict]:
    """The row's chat turns for this model. A conversation row (`turns`) is written again a question at a
    time from its typed turns, with the image's columns, and joined as the build joins them."""
    if "turns" in row:
        shared = {k: v for k, v in row.items() if k not in ("turns", "question_ids", "messages")}
        turns = [to_messages({**shared, **turn}, kind, settings, with_answer) for turn in row["turns"]]
        return conversation(turns, shown_images(row, kind))
    return conversation_format(kind, settings.reply).messages(
        replied(row, settings.reply) if with_answer else row,
        box_convention=settings.box_convention,
        with_answer=with_answer,
        fold_system=settings.fold_system,
        budget=settings.pixel_budget,
    )


def conversation_format(kind: str, reply: str) -> ConversationFormat:
    """How `kind`'s rows read as chats with `reply`'s replies."""
    if reply != "checklist":
        return PROMPTS[kind].CONVERSATION
    if kind != "rexvqa":
        raise ValueError(f"reply 'checklist' is for ReXVQA's four-option questions, not {kind}")
    return rexvqa_prompts.CHECKLIST


def replied(row: dict, reply: str) -> dict:
    """The row with what `reply` leaves out of the trained reply emptied (`REPLIES`)."""
    if reply not in REPLIES:
        raise ValueError(f"reply {reply!r}: expected one of {', '.join(REPLIES)}")
    if reply in ("full", "checklist"):
        return row
    emptied = {column: "" for column in ("reason", "explanation") if column in row}
    if reply == "answer" and "boxes" in row:
        emptied["boxes"] = []
    return {**row, **emptied}


def shown_images(row: dict, kind: str) -> int:
    """How many images a conversation row shows (its first turn's image parts): GEMeX's one image, a ReXVQA
    study's stored images, counted by their sizes where the image column was left out to count tokens."""
    if kind == "gemex":
        return 1
    for column in ("images", "image_widths"):
        if row.get(column) is not None:
            return len(row[column])
    return PROMPTS[kind].image_count(row)


def question_ids(row: dict) -> list[str]:
    """The questions a row holds: one a row, or a conversation's (`question_ids`)."""
    return list(row["question_ids"]) if "question_ids" in row else [row["question_id"]]


def to_trl_example(row: dict, kind: str, settings: ConversationSettings, with_answer: bool = True) -> dict:
    """One row as ``{"images": [PIL, ...], "messages": [...], "question_ids": [...]}``."""
    return {
        "images": row_images(row, kind, settings),
        "messages": to_messages(row, kind, settings, with_answer),
        "question_ids": question_ids(row),
    }


IMAGE_SIZE_COLUMNS: dict[str, tuple[str, str]] = {
    "gemex": ("image_width", "image_height"),
    "rexvqa": ("image_widths", "image_heights"),
}
"""The build's columns of each stored image's (width, height): image tokens are counted from them, nothing decoded."""


def missing_size_columns(column_names: list[str], kind: str) -> list[str]:
    """The size columns a split lacks (one built before they existed, or with them removed)."""
    return [column for column in IMAGE_SIZE_COLUMNS[kind] if column not in column_names]


def image_sizes(row: dict, kind: str) -> list[tuple[int, int]]:
    """(width, height) of each of the row's images as stored, from the build's size columns (nothing decoded)."""
    widths, heights = (row[column] for column in IMAGE_SIZE_COLUMNS[kind])
    return [(widths, heights)] if kind == "gemex" else list(zip(widths, heights))


def image_tokens(size: tuple[int, int], settings: ConversationSettings) -> int:
    """Tokens of one image of `size` at the settings' pixel budget (`PixelBudget.image_tokens`); 0 for a
    processor of fixed input size (no resize known)."""
    return settings.pixel_budget.image_tokens(*size) if settings.pixel_budget else 0


def sequence_lengths(
    dataset: Dataset, settings: ConversationSettings, processor, with_answer: bool = True, num_proc: int | None = None
) -> list[int]:
    """Each row's sequence length in tokens, counted without decoding an image: the conversation
    rendered by the processor's chat template and tokenized, each image's one placeholder counted as
    the tokens of its stored size at the pixel budget (`with_answer=False`: the prompt with the
    generation prompt). For batches of rows of like length (`LengthGroupedSampler`, sorted
    generation): random batches of ReXVQA rows, 1-4 images a study, are about a third padding.
    A `datasets` map, so the count is cached beside the split and `num_proc` spreads it."""
    kind = dataset_kind(dataset.column_names, dataset.features)
    missing = missing_size_columns(dataset.column_names, kind)
    if missing:
        raise ValueError(
            f"the {kind} split has no {' / '.join(missing)} column: its image tokens cannot be counted "
            "without decoding every image (rebuild it, or do without length grouping)"
        )
    image_column = "image" if kind == "gemex" else "images"
    text_only = dataset.remove_columns([c for c in (image_column,) if c in dataset.column_names])

    def count(batch: dict[str, list]) -> dict[str, list[int]]:
        rows = rows_of(batch)
        conversations = [to_messages(row, kind, settings, with_answer) for row in rows]
        texts = processor.apply_chat_template(conversations, tokenize=False, add_generation_prompt=not with_answer)
        counted = processor.tokenizer(texts, add_special_tokens=False)["input_ids"]
        lengths = []
        for row, ids in zip(rows, counted):
            sizes = image_sizes(row, kind)
            images = sum(image_tokens(size, settings) for size in sizes)
            lengths.append(len(ids) + (images - len(sizes) if images else 0))
        return {"length": lengths}

    counted = text_only.map(
        count,
        batched=True,
        batch_size=1000,
        remove_columns=text_only.column_names,
        num_proc=num_proc,
        desc="Counting tokens",
    )
    return list(counted["length"])


def rows_of(batch: dict[str, list]) -> list[dict]:
    columns = list(batch)
    return [dict(zip(columns, values)) for values in zip(*(batch[c] for c in columns))]


def conversational(dataset: Dataset, settings: ConversationSettings, with_answer: bool = True) -> Dataset:
    """The split as `images` + `messages`, converted (and its images decoded) per accessed batch.

    Train with ``remove_unused_columns=False``: the stored columns are what the transform reads.
    The images are read as stored bytes and decoded by `decode_image` (at the pixel budget).
    """
    kind = dataset_kind(dataset.column_names, dataset.features)
    dataset = undecoded(dataset, kind)

    def transform(batch: dict[str, list]) -> dict[str, list]:
        examples = [to_trl_example(row, kind, settings, with_answer) for row in rows_of(batch)]
        return {column: [e[column] for e in examples] for column in ("images", "messages", "question_ids")}

    return dataset.with_transform(transform)


def conversational_stream(
    dataset: Dataset | IterableDataset, settings: ConversationSettings, num_shards: int = STREAM_SHARDS
) -> IterableDataset:
    """The split as a stream of `images` + `messages` with the images still encoded.

    Images pass through as their stored bytes (decoding off), so nothing is decoded and
    re-encoded on the way; `decode_images` decodes each once, as the mixed stream is read.
    A map-style split becomes `num_shards` shards; a streamed Parquet split one shard per row group
    (`IterableDataset.reshard`), not per file, so that several processes each read their own shards.
    """
    kind = dataset_kind(dataset.column_names, dataset.features)
    if isinstance(dataset, IterableDataset):
        dataset = dataset.reshard()
    else:
        dataset = dataset.to_iterable_dataset(num_shards=min(num_shards, max(len(dataset), 1)))
    dataset = undecoded(dataset, kind)

    def convert(row: dict) -> dict:
        images = [row["image"]] if kind == "gemex" else list(row["images"])
        return {"images": images, "messages": to_messages(row, kind, settings), "question_ids": question_ids(row)}

    return dataset.map(convert, remove_columns=dataset.column_names, features=TRL_FEATURES)


def first_rows(stream: IterableDataset, n: int) -> IterableDataset:
    """The first `n` rows of a stream in their stored order, the same rows however many loader workers or
    processes read it (a non-streaming load's first `n` too): one shard, read by one worker.
    `IterableDataset.take(n)` is split over a loader's workers, each keeping the first rows of its own
    shards; a worker's `iter` does not split the stream again. Images stay encoded."""
    stream = undecoded(stream, dataset_kind(stream.column_names, stream.features))
    return IterableDataset.from_generator(stored_rows, gen_kwargs={"stream": stream.take(n)}, features=stream.features)


def stored_rows(stream: IterableDataset, batch_size: int = 64):
    for batch in stream.iter(batch_size=batch_size):
        yield from rows_of(batch)


def whole_steps(stream: IterableDataset, rows_per_step: int) -> IterableDataset:
    """`stream` without the rows at the end of a pass that do not fill an optimizer step (micro-batch
    size x gradient accumulation steps), in each reader of it (process, loader worker). Two processes
    whose passes end on another micro-batch would otherwise run a partial accumulation group on one of
    them (an extra gradient all-reduce the other never matches) and hang; with whole steps every pass
    ends on a step, wherever it ends."""

    def identity(rows: dict[str, list]) -> dict[str, list]:
        return rows

    return stream.map(identity, batched=True, batch_size=rows_per_step, drop_last_batch=True)


def undecoded(dataset: Dataset | IterableDataset, kind: str) -> Dataset | IterableDataset:
    """The split with its image column left as stored bytes, for `decode_image` to decode.

    A map-style ReXVQA split keeps decoding its images: `datasets` casts a list of images by
    rewriting the whole split (a single image column only changes its schema), and a PNG gains
    nothing from being read by us (`draft` is for JPEG). A stream casts lazily.
    """
    if kind == "gemex":
        return dataset.cast_column("image", Image(decode=False))
    if isinstance(dataset, IterableDataset):
        return dataset.cast_column("images", List(Image(decode=False)))
    return dataset


def mix(
    weighted: list[tuple[Dataset, float]],
    settings: ConversationSettings,
    seed: int = 0,
    num_shards: int = STREAM_SHARDS,
    shuffle_block: int = SHUFFLE_BLOCK,
) -> IterableDataset:
    """Several built splits as one stream, drawing from each with probability proportional to its weight.

    Stops when every dataset has been seen once in full (``all_exhausted``): the smaller ones
    repeat meanwhile, so the weights, not the sizes, set the mixture. Train with `max_steps`.
    Shuffled in blocks (`shuffled_in_blocks`), so a run resumes from the stream's saved state
    onto the same rows in the same order.
    """
    total = sum(weight for _, weight in weighted)
    streams = [conversational_stream(dataset, settings, num_shards) for dataset, _ in weighted]
    if len(streams) == 1:  # one stream needs no interleaving (whose saved state loses a second pass's place)
        mixed = streams[0]
    else:
        mixed = interleave_datasets(
            streams,
            probabilities=[weight / total for _, weight in weighted],
            seed=seed,
            stopping_strategy="all_exhausted",
        )
    return shuffled_in_blocks(mixed, seed, shuffle_block).map(decode_images, fn_kwargs={"settings": settings})


def shuffled_in_blocks(stream: IterableDataset, seed: int, block: int = SHUFFLE_BLOCK) -> IterableDataset:
    """`stream` with each run of `block` rows put in a random order, seeded by `seed` and the block's start.

    Unlike `IterableDataset.shuffle`, whose buffer is not part of the stream's `state_dict` (a
    resumed stream refills it and trains other rows), this is a batched `map`, whose state
    `datasets` saves: a resumed stream reads the current block again (no image decoded) and goes on
    with the same rows in the same order. Rows stay as they are (images encoded) until `decode_images`.
    """

    def permute(rows: dict[str, list], indices: list[int]) -> dict[str, list]:
        order = np.random.default_rng([seed, indices[0]]).permutation(len(indices))
        return {column: [values[i] for i in order] for column, values in rows.items()}

    return stream.map(permute, batched=True, batch_size=block, with_indices=True)


def decode_images(example: dict, settings: ConversationSettings | None = None) -> dict:
    """Encoded images (``{"bytes", "path"}``) of a stream example as RGB PIL images, at the settings' pixel budget."""
    budget = settings.pixel_budget if settings else None
    return {"images": [decode_image(image, budget) for image in example["images"]]}


def box_convention_for(model_type: str) -> str:
    return BOX_CONVENTION_BY_MODEL_TYPE.get(model_type, "pixels")


def apply_pixel_budget(processor, budget: PixelBudget) -> PixelBudget | None:
    """Set a processor that resizes to a pixel count (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) to `budget`,
    whatever it was saved with (12.8 M pixels for Qwen2.5-VL's release), and return `budget` with the
    processor's factor (patch size x merge size); None for processors with fixed input sizes."""
    image_processor = getattr(processor, "image_processor", None)
    size = getattr(image_processor, "size", None)
    bounds = ("shortest_edge", "longest_edge")
    if not (hasattr(image_processor, "merge_size") and size is not None and all(_get(size, k) for k in bounds)):
        return None
    wanted = {"shortest_edge": budget.min_pixels, "longest_edge": budget.max_pixels}
    image_processor.size = wanted if isinstance(size, dict) else type(size)(**wanted)
    for name in ("min_pixels", "max_pixels"):  # transformers 4.x keeps them beside `size` too
        if getattr(image_processor, name, None) is not None:
            setattr(image_processor, name, getattr(budget, name))
    return replace(budget, factor=image_processor.patch_size * image_processor.merge_size)


def _get(size, key: str):
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


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
    model_type: str,
    processor,
    box_convention: str | None = None,
    fold_system: bool | None = None,
    pixel_budget: PixelBudget | None = None,
) -> ConversationSettings:
    """The conversation settings a model family needs; explicit arguments win over the defaults.

    Sets `processor` to the pixel budget (`apply_pixel_budget`; the default budget when none is
    given), so training, generation and the boxes never use the processor's own limit.
    """
    convention = box_convention or box_convention_for(model_type)
    if fold_system is None:
        fold_system = not chat_template_accepts_system(processor)
    return ConversationSettings(convention, fold_system, apply_pixel_budget(processor, pixel_budget or PixelBudget()))


def stream_sharding(dataset: IterableDataset, processes: int) -> str:
    """One line: how a stream's shards split over the processes, and what each process reads."""
    shards = dataset.n_shards
    if processes <= 1:
        return f"stream: {shards} shards, read by one process"
    if shards >= processes:
        return (
            f"stream: {shards} shards over {processes} processes: each reads {shards // processes}"
            f"{'-' + str(-(-shards // processes)) if shards % processes else ''} of them, no row twice"
        )
    return (
        f"stream: {shards} shards for {processes} processes: each reads every row and keeps 1 in {processes} "
        f"(rebuild with more row groups or shards to read each row once)"
    )
