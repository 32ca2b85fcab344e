"""Greedy predictions over a built split, written as the JSON Lines `cxr-vqa evaluate` reads.

Each line is ``{"question_id": ..., "prediction": "<raw model text>"}``. The file is appended to
batch by batch, and a rerun skips the questions already in it, so an interrupted run resumes. What
wrote it (the model and its weights files' sizes and times, the built folder and split, the settings
that change a reply) is recorded beside it, in ``<output_file>.run.json``: a rerun resumes only a
file its own run wrote and otherwise stops, naming what differs (`--overwrite_output_file` starts
it over).
The prompt is `to_messages(row, with_answer=False)`: the training prompt without the reply.
Questions are asked longest prompt first (`--sort_by_length`, counted from the chat template and
the stored image sizes): a batch is left-padded to its longest prompt, and a ReXVQA study has 1-4
images, so in split order most of a batch can be padding; the longest batch also comes first, so
a batch size too large for the GPU fails at once. `--cache_implementation static` asks
`generate` for a fixed-size KV cache (what `torch.compile` of the decoding step needs).

    python training_recipes/generate.py --model_name_or_path runs/qwen25vl-gemex \\
        --dataset_path ./gemex --split test --output_file predictions/gemex-test.jsonl

A LoRA output directory works as `--model_name_or_path` (its base model is read from
`adapter_config.json`).
"""

from __future__ import annotations

import json
import string
import sys
import warnings
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path

import torch
from datasets import Dataset, load_dataset
from transformers import AutoModelForImageTextToText, HfArgumentParser

from builders.files import write_text
from builders.local_images import HELP as LOCAL_IMAGES_HELP
from builders.local_images import LocalImagesError, with_local_images
from builders.pixel_budget import PixelBudgetOptions
from training_recipes.data import (
    REPLIES,
    ConversationSettings,
    dataset_kind,
    missing_size_columns,
    row_images,
    sequence_lengths,
    settings_for,
    to_messages,
    undecoded,
)
from training_recipes.runtime.attention_kernels import flash_first
from training_recipes.runtime.checkpoints import differences, folder_contents, source
from training_recipes.runtime.processors import RecipeError, default_dtype, load_processor
from training_recipes.runtime.vision_attention import use_chunked_vision_attention

CHOICES = ("greedy", "likelihood")
"""How a reply is chosen: written greedily, or the likeliest of each offered option's reply."""
LIKELIHOOD_REPLIES = ("answer", "checklist")
"""Replies whose whole text follows from the answer, so every offered option's can be written and scored."""
RUN_RECORD = ".run.json"
"""The suffix of the record of what wrote a predictions file, beside it (`cxr-vqa evaluate` reads the file alone)."""
MODEL_FILES = ("*.safetensors", "*.bin", "config.json", "adapter_config.json")
"""The files of a model folder that say which weights it holds."""


@dataclass
class GenerateArguments(PixelBudgetOptions):
    model_name_or_path: str = field(metadata={"help": "Fine-tuned model folder, LoRA output folder or Hub id."})
    dataset_path: str = field(metadata={"help": "Built GEMeX or ReXVQA folder (or Hub repo id)."})
    output_file: str = field(
        metadata={"help": "Predictions JSON Lines; appended to, and resumed from when the same run wrote it."}
    )
    overwrite_output_file: bool = field(
        default=False,
        metadata={"help": "Start --output_file over, whatever wrote it (default: resume it only when this run did)."},
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Config to read (default: the card's default, every question)."}
    )
    split: str = field(default="test", metadata={"help": "Split to answer (train, validation or test)."})
    batch_size: int = field(default=8, metadata={"help": "Questions generated at once."})
    max_new_tokens: int = field(default=256, metadata={"help": "Most tokens of one reply."})
    max_samples: int | None = field(default=None, metadata={"help": "Only the first N questions of the split."})
    dtype: str | None = field(
        default=None,
        metadata={"help": "bfloat16, float16, float32 or auto. Default: bfloat16 on a GPU that has it, else float32."},
    )
    device: str | None = field(default=None, metadata={"help": "Default: cuda when available, else cpu."})
    box_convention: str | None = field(default=None, metadata={"help": "As in training; default from the model."})
    fold_system_prompt: bool | None = field(default=None, metadata={"help": "As in training; default: auto."})
    image_root: str | None = field(default=None, metadata={"help": LOCAL_IMAGES_HELP})
    sort_by_length: bool = field(
        default=True,
        metadata={
            "help": "Ask the longest prompts first, so each batch holds prompts of like length (less left "
            "padding; a study of 4 images beside one of 1 pads the whole batch). --no_sort_by_length: split order."
        },
    )
    cache_implementation: str | None = field(
        default=None,
        metadata={"help": "generate's KV cache: default dynamic; 'static' preallocates it (for torch.compile)."},
    )
    choose_by: str = field(
        default="greedy",
        metadata={
            "help": "greedy: the reply the model writes. likelihood (ReXVQA): the reply, written as trained "
            "(--reply), of the offered option whose reply the model finds likeliest, as lmms-eval scores "
            "multiple choice by log-likelihood.",
            "choices": list(CHOICES),
        },
    )
    reply: str = field(
        default="full",
        metadata={
            "help": "What the model was trained to reply (sft.py --reply): the candidates --choose_by likelihood "
            "scores are written so; answer or checklist (a full reply's explanation is written for the true answer "
            "only).",
            "choices": list(REPLIES),
        },
    )


def done_question_ids(output_file: Path) -> set[str]:
    """Question ids already answered in `output_file` (a torn last line is ignored and rewritten)."""
    if not output_file.exists():
        return set()
    done = set()
    for line in output_file.read_text().splitlines():
        try:
            done.add(json.loads(line)["question_id"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return done


def drop_torn_last_line(output_file: Path) -> None:
    """A run killed mid-write leaves a partial line; cut it so appended lines stay valid."""
    if output_file.exists():
        text = output_file.read_text()
        if text and not text.endswith("\n"):
            write_text(output_file, text[: text.rfind("\n") + 1])


def run_record_file(output_file: Path) -> Path:
    return output_file.with_name(output_file.name + RUN_RECORD)


def read_run_record(output_file: Path) -> dict | None:
    """The record of what wrote `output_file`; None when there is none, or it cannot be read."""
    try:
        record = json.loads(run_record_file(output_file).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def start_or_resume(output_file: Path, record: dict, overwrite: bool) -> None:
    """Resume `output_file` when its record is `record`; start it over when `overwrite` or it holds no
    prediction yet; otherwise stop with a `RecipeError` naming the file and what differs. A start removes
    the predictions before it writes the record, so old predictions never stand under a new record."""
    if not overwrite and done_question_ids(output_file):
        written_by = read_run_record(output_file)
        if written_by is None:
            why = f"holds predictions but no record of what wrote them ({run_record_file(output_file).name})"
        elif changed := differences(record, written_by):
            why = f"written by another run ({changed})"
        else:
            return
        raise RecipeError(
            f"{output_file}: {why}; pass --overwrite_output_file to start it over, or give another --output_file"
        )
    output_file.unlink(missing_ok=True)
    write_text(run_record_file(output_file), json.dumps(record, indent=1) + "\n")


def adapter_base(model_name_or_path: str) -> str | None:
    """The base model of a LoRA output folder (its `adapter_config.json`); None for a whole model."""
    adapter_config = Path(model_name_or_path) / "adapter_config.json"
    return json.loads(adapter_config.read_text())["base_model_name_or_path"] if adapter_config.exists() else None


def model_files(folder: Path) -> dict[str, str]:
    """Each `MODEL_FILES` file of a local model folder as ``SIZE bytes, modified TIME``: training again
    rewrites the weights at the same size, so their time tells one training's from another's."""
    found = {}
    for pattern in MODEL_FILES:
        for path in folder.glob(pattern):
            stat = path.stat()
            found[path.name] = f"{stat.st_size} bytes, modified {datetime.fromtimestamp(stat.st_mtime).isoformat()}"
    return dict(sorted(found.items()))


def model_identity(model_name_or_path: str, model) -> dict:
    """Which weights answer: the model folder or Hub id, its Hub commit (None for a local folder), and the
    files (`model_files`) of the local folder and of a LoRA folder's base, each by its absolute path."""
    identity = {"model_name_or_path": source(model_name_or_path)}
    identity["hub_commit"] = getattr(model.config, "_commit_hash", None)
    for path in (model_name_or_path, adapter_base(model_name_or_path)):
        if path and Path(path).is_dir():
            identity |= {str(Path(source(path)) / name): about for name, about in model_files(Path(path)).items()}
    return identity


def run_identity(args: GenerateArguments, model) -> dict:
    """The model and data of a command line's run; `generate_predictions` adds the reply settings. Not
    `--dataset_config` or `--max_samples`: they choose which of the split's questions are asked (one file
    may gather a split's configs, one run each), not what a question's reply is."""
    data = {"dataset_path": source(args.dataset_path), "dataset_files": folder_contents(args.dataset_path)}
    return {"model": model_identity(args.model_name_or_path, model), "data": data | {"split": args.split}}


def load_model(model_name_or_path: str, dtype: str, device: str):
    """A model folder or a LoRA adapter folder (base model from its `adapter_config.json`); the
    processor first, so one that cannot be built stops the run before any weights load."""
    processor = load_processor(model_name_or_path)
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    base = adapter_base(model_name_or_path)
    if base is not None:
        from peft import PeftModel

        model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch_dtype)
        model = PeftModel.from_pretrained(model, model_name_or_path).merge_and_unload()
    else:
        model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, dtype=torch_dtype)
    use_chunked_vision_attention(model)
    return model.to(device).eval(), processor


def longest_first(dataset: Dataset, todo: list[int], kind: str, settings: ConversationSettings, processor) -> list[int]:
    """`todo`'s rows by prompt length, longest first (ties in split order); split order where the
    rows carry no stored image sizes to count from."""
    missing = missing_size_columns(dataset.column_names, kind)
    if missing:
        warnings.warn(
            f"questions asked in split order: the split has no {' / '.join(missing)} column to count image tokens from",
            stacklevel=2,
        )
        return todo
    lengths = sequence_lengths(dataset.select(todo), settings, processor, with_answer=False)
    return [todo[k] for k in sorted(range(len(todo)), key=lambda k: -lengths[k])]


def with_images(messages: list[dict], images) -> list[dict]:
    """`messages` with each image part holding its image, as TRL's collator fills them."""
    images = iter(images)
    for message in messages:
        message["content"] = [
            {"type": "image", "image": next(images)} if part["type"] == "image" else part for part in message["content"]
        ]
    return messages


def left_padded(model, processor, conversations: list[list[dict]], add_generation_prompt: bool = False):
    """The conversations tokenized into one left-padded batch on the model's device, pixels in its dtype."""
    inputs = processor.apply_chat_template(
        conversations,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"padding": True, "padding_side": "left"},
    ).to(model.device)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    return inputs


@torch.inference_mode()
def generate_batch(
    model,
    processor,
    rows: list[dict],
    kind: str,
    settings: ConversationSettings,
    max_new_tokens: int,
    cache_implementation: str | None = None,
):
    """Raw model text for each row: greedy, left-padded, the prompt's tokens cut off."""
    conversations = [
        with_images(to_messages(row, kind, settings, with_answer=False), row_images(row, kind, settings))
        for row in rows
    ]
    inputs = left_padded(model, processor, conversations, add_generation_prompt=True)
    tokenizer = processor.tokenizer
    output = model.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        **({"cache_implementation": cache_implementation} if cache_implementation else {}),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    new_tokens = output[:, inputs["input_ids"].shape[1] :]
    return [text.strip() for text in processor.batch_decode(new_tokens, skip_special_tokens=True)]


def candidate_rows(row: dict) -> list[dict]:
    """The row once for each offered option, that option as its answer."""
    return [
        {**row, "answer": letter, "answer_index": index}
        for index, letter in enumerate(string.ascii_uppercase[: len(row["options"])])
    ]


@torch.inference_mode()
def reply_log_likelihoods(model, processor, conversations: list[list[dict]], prompt_lengths: list[int]) -> torch.Tensor:
    """The summed log-probability of each conversation's reply: its tokens after the first `prompt_lengths[i]`
    (the prompt with the generation prompt), the conversations left-padded into one batch."""
    inputs = left_padded(model, processor, conversations)
    reply_lengths = inputs["attention_mask"].sum(1).cpu() - torch.tensor(prompt_lengths)
    longest = int(reply_lengths.max())
    logits = model(**inputs, logits_to_keep=longest + 1).logits[:, :-1].float()
    targets = inputs["input_ids"][:, -longest:]
    token_scores = logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0].cpu()
    in_reply = torch.arange(longest)[None, :] >= (longest - reply_lengths)[:, None]
    return (token_scores * in_reply).sum(1)


def likeliest_replies(model, processor, rows: list[dict], kind: str, settings: ConversationSettings) -> list[str]:
    """For each row, the reply (`settings.reply`) of the offered option whose reply the model finds likeliest."""
    if kind != "rexvqa" or settings.reply not in LIKELIHOOD_REPLIES:
        raise RecipeError(
            f"--choose_by likelihood scores ReXVQA's offered options with --reply {' or '.join(LIKELIHOOD_REPLIES)}, "
            f"not {kind} with --reply {settings.reply}"
        )
    conversations, prompt_lengths, owners = [], [], []
    for index, row in enumerate(rows):
        images = row_images(row, kind, settings)
        prompt = with_images(to_messages(row, kind, settings, with_answer=False), images)
        tokens = processor.apply_chat_template([prompt], add_generation_prompt=True, tokenize=True, return_dict=True)
        for candidate in candidate_rows(row):
            conversations.append(with_images(to_messages(candidate, kind, settings), images))
            prompt_lengths.append(len(tokens["input_ids"][0]))
            owners.append(index)
    scores = reply_log_likelihoods(model, processor, conversations, prompt_lengths).tolist()
    best: dict[int, tuple[float, str]] = {}
    for owner, score, conversation in zip(owners, scores, conversations):
        if owner not in best or score > best[owner][0]:
            best[owner] = (score, conversation[-1]["content"][0]["text"])
    return [best[index][1] for index in range(len(rows))]


def generate_predictions(
    model,
    processor,
    dataset: Dataset,
    output_file: str | Path,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    settings: ConversationSettings | None = None,
    sort_by_length: bool = True,
    cache_implementation: str | None = None,
    choose_by: str = "greedy",
    run: dict | None = None,
    overwrite_output_file: bool = False,
) -> int:
    """Append a prediction for every question of `dataset` not yet in `output_file`; returns how many.
    `run` (`run_identity`) and the reply settings are the run's record: a file another run wrote is
    refused unless `overwrite_output_file` (`start_or_resume`)."""
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    kind = dataset_kind(dataset.column_names)
    settings = settings or settings_for(model.config.model_type, processor)
    replies = {**asdict(settings), "choose_by": choose_by, "max_new_tokens": max_new_tokens, "dtype": model.dtype}
    record = json.loads(json.dumps({**(run or {}), "replies": replies}, default=str))
    start_or_resume(output_file, record, overwrite_output_file)
    dataset = undecoded(dataset, kind)  # `row_images` decodes each image at the pixel budget
    drop_torn_last_line(output_file)
    done = done_question_ids(output_file)
    todo = [i for i, question_id in enumerate(dataset["question_id"]) if question_id not in done]
    if sort_by_length and todo:
        todo = longest_first(dataset, todo, kind, settings, processor)
    with output_file.open("a") as out, flash_first():
        for start in range(0, len(todo), batch_size):
            rows = list(dataset.select(todo[start : start + batch_size]))  # reads this batch's images only
            if choose_by == "likelihood":
                texts = likeliest_replies(model, processor, rows, kind, settings)
            else:
                texts = generate_batch(model, processor, rows, kind, settings, max_new_tokens, cache_implementation)
            for row, text in zip(rows, texts):
                out.write(json.dumps({"question_id": row["question_id"], "prediction": text}) + "\n")
            out.flush()
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    (args,) = HfArgumentParser(GenerateArguments).parse_args_into_dataclasses(args=argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, processor = load_model(args.model_name_or_path, args.dtype or default_dtype(), device)
    dataset = load_dataset(args.dataset_path, args.dataset_config, split=args.split)
    if args.image_root:
        dataset = with_local_images(dataset, args.image_root)
    if args.max_samples is not None:
        dataset = dataset.select(range(min(args.max_samples, len(dataset))))
    budget = args.pixel_budget
    settings = settings_for(model.config.model_type, processor, args.box_convention, args.fold_system_prompt, budget)
    settings = replace(settings, reply=args.reply)
    written = generate_predictions(
        model,
        processor,
        dataset,
        args.output_file,
        args.batch_size,
        args.max_new_tokens,
        settings,
        args.sort_by_length,
        args.cache_implementation,
        args.choose_by,
        run_identity(args, model),
        args.overwrite_output_file,
    )
    print(f"wrote {written} predictions to {args.output_file}")
    return written


if __name__ == "__main__":
    try:
        main()
    except (RecipeError, LocalImagesError) as error:
        sys.exit(f"generate.py: error: {error}")
