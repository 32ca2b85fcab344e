"""Fine-tune a vision-language model on built GEMeX and/or ReXVQA folders with TRL's SFTTrainer.

Loss on the assistant's reply only (`assistant_only_loss`, with TRL's training chat template),
LoRA (`--use_peft`) or full fine-tuning, gradient checkpointing by default, and bf16 where the GPU
has it (float32 on a CPU, where the same command runs a smoke test: `python -m training_recipes.tiny_model`
makes a tiny model offline). With two
datasets, training draws from each by its weight (`--gemex_weight`, `--rexvqa_weight`) and
needs `--max_steps`. `--streaming` reads the rows as they train (`load_dataset(streaming=True)`):
a non-streaming load writes an Arrow cache with one copy of an image per question (about 11x the
images for GEMeX), a stream writes nothing; it also needs `--max_steps`. `--layout per_image` trains on one conversation
per image instead (GEMeX `sft_per_image`, ReXVQA `sft_per_study`): each image is sent, and cached, once.
Batches hold rows of like length (`--train_sampling_strategy group_by_length`, the recipe's default;
`random` for the Trainer's own): random batches of ReXVQA rows, 1-4 images a study, are about a third
padding, grouped ones 1.3% (`benchmarks/token_bill.py`). `--torch_compile` and `--use_liger_kernel` are the
Trainer's own flags (Liger 0.8.5's Qwen2.5-VL patch does not load with transformers 5.23: training_recipes/README.md).

    accelerate launch --config_file training_recipes/accelerate/single_gpu.yaml \\
        training_recipes/sft.py \\
        --model_name_or_path Qwen/Qwen2.5-VL-3B-Instruct \\
        --gemex_path ./gemex --output_dir runs/qwen25vl-gemex \\
        --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --learning_rate 1e-5

    # or every argument in a file
    accelerate launch training_recipes/sft.py --config training_recipes/configs/qwen25vl_lora.yaml
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset, IterableDataset, load_dataset
from safetensors import safe_open
from transformers import AutoModelForImageTextToText, PreTrainedModel, TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from builders.local_images import HELP as LOCAL_IMAGES_HELP
from builders.local_images import LocalImagesError, with_local_images
from builders.pixel_budget import PixelBudgetOptions
from training_recipes.data import conversational, layout_config, mix, sequence_lengths, settings_for
from training_recipes.processors import RecipeError, bf16_available, default_dtype, load_processor


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
        return dataset.take(max_samples) if max_samples is not None else dataset
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


COMPLETE = "checkpoint_complete.json"
"""Written into a checkpoint folder last, once every process has saved its part: `auto` resumes only
from folders that have it. The Trainer writes a checkpoint in place, so a run killed while saving
leaves a folder named like a checkpoint that `transformers.trainer_utils.get_last_checkpoint` would pick."""
STREAM_STATE = "stream_state_{rank}.pt"
"""Each process's data loader state in a checkpoint of a streamed run (torchdata's `StatefulDataLoader`
through accelerate: the stream's `datasets` state, per worker)."""
AUTO = "auto"


def checkpoint_step(folder: Path) -> int | None:
    match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", folder.name)
    return int(match.group(1)) if match else None


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """The run's checkpoints that were saved in full (`COMPLETE`), oldest first."""
    root = Path(output_dir)
    found = [f for f in root.iterdir() if f.is_dir() and checkpoint_step(f) is not None] if root.is_dir() else []
    return sorted((f for f in found if (f / COMPLETE).is_file()), key=checkpoint_step)


def resume_checkpoint(requested: str | None, output_dir: str) -> str | None:
    """The checkpoint to resume from: `requested` as given, or for `auto` the newest complete one in
    `output_dir` (a fresh start when there is none); says which in one line."""
    if requested is None:
        return None
    if requested != AUTO:
        if not (Path(requested) / "trainer_state.json").is_file():
            raise SystemExit(f"--resume_from_checkpoint {requested}: not a checkpoint folder (no trainer_state.json)")
        return requested
    complete = complete_checkpoints(output_dir)
    if not complete:
        print(f"resume: no complete checkpoint in {output_dir}; starting from step 0", file=sys.stderr)
        return None
    print(f"resume: from {complete[-1]} (step {checkpoint_step(complete[-1])})", file=sys.stderr)
    return str(complete[-1])


def synchronised(flag: bool, device) -> bool:
    """`flag` if any process raised it (all processes then agree on when to stop)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    raised = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(raised, op=torch.distributed.ReduceOp.MAX)
    return bool(raised.item())


class Checkpointing(TrainerCallback):
    """Checkpoints a run can be left with overnight.

    - After each save, every process adds its data loader state when the data is a stream (resuming
      then reads on from there, rather than reading and decoding the steps already trained again),
      and the main process marks the folder complete (`COMPLETE`) once every process is done.
    - SIGTERM (a preempted cloud GPU, a SLURM job at its limit) asks for a checkpoint at the end of
      the current step and a stop; `train` then returns with `preempted_at` set. Further SIGTERMs
      are noted and ignored, so the save runs to its end; a kill during it leaves a folder without
      `COMPLETE`, which `auto` passes over.
    """

    def __init__(self, stream: bool):
        self.stream = stream
        self.signalled = False
        self.preempted_at: Path | None = None

    @contextlib.contextmanager
    def listening(self):
        """SIGTERM handled by this callback while the block runs (the main thread only, as Python signals)."""
        previous = signal.signal(signal.SIGTERM, self.on_sigterm)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)

    def on_sigterm(self, signum, frame) -> None:
        if self.signalled:
            print("SIGTERM again: still saving the checkpoint of the current step", file=sys.stderr, flush=True)
        self.signalled = True

    def on_step_end(self, args, state, control, **kwargs):
        if synchronised(self.signalled, args.device):
            self.signalled = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, train_dataloader=None, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.stream and train_dataloader is not None:
            torch.save(train_dataloader.state_dict(), folder / STREAM_STATE.format(rank=args.process_index))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
        if state.is_world_process_zero:
            marker = folder / (COMPLETE + ".tmp")
            marker.write_text(json.dumps({"global_step": state.global_step, "processes": args.world_size}))
            os.replace(marker, folder / COMPLETE)
        if self.signalled:
            self.preempted_at = folder
        return control


def vision_example():
    """A row of the stream's shape, for SFTTrainer's look at a first example (images? a conversation?)."""
    yield {"images": [], "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}], "question_ids": []}


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """`LengthGroupedSampler` whose order for an epoch depends on the seed and the epoch alone
    (`set_epoch`, which accelerate's data loader calls), so a run resumed in its second epoch trains
    that epoch's order; transformers' own draws each epoch's order from one generator that a resumed
    run starts again, and would train the first epoch's order again."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator())
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


class LengthGroupedSFTTrainer(SFTTrainer):
    """SFTTrainer whose `group_by_length` sampling takes each row's length from `sequence_lengths`
    (text and stored image sizes). The Trainer's own route reads a length column through the split's
    lazy transform, which would decode every image of the split first.

    A stream (an `IterableDataset`) is read by torchdata's `StatefulDataLoader` (accelerate's
    `use_stateful_dataloader`, which the Trainer does not expose): a resumed run loads each process's
    saved state (`Checkpointing`) instead of the Trainer's skipping, which reads every batch of the
    steps already trained again. Each process reads its own shards of it (`dispatch_batches` off)."""

    def __init__(self, *args, lengths: dict[str, list[int]] | None = None, **kwargs):
        self.lengths = lengths or {}
        self.stream = isinstance(kwargs.get("train_dataset"), IterableDataset)
        self.stream_checkpoint: str | None = None
        train_dataset = kwargs.get("train_dataset")
        if self.stream:  # SFTTrainer reads a first example to see that the rows have images: not a block of the stream
            kwargs["train_dataset"] = IterableDataset.from_generator(vision_example)
        super().__init__(*args, **kwargs)
        self.train_dataset = train_dataset

    def _build_accelerator_args(self, **kwargs):
        if self.stream:
            kwargs["dataloader_config"].use_stateful_dataloader = True
        return super()._build_accelerator_args(**kwargs)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if self.stream and isinstance(resume_from_checkpoint, str):
            self.stream_checkpoint = resume_from_checkpoint
            self.args.ignore_data_skip = True  # the loader's own state puts it after the trained steps
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """The checkpoint's weights, read the way `from_pretrained` reads them. The Trainer saves a
        checkpoint in the original key layout (`save_pretrained`'s `save_original_format`) and loads
        it with a plain `load_state_dict`; for a model whose keys transformers renames on loading
        (Qwen2.5-VL, Gemma 3: `model.language_model.*` against `language_model.model.*`) that matches no
        key, and the run would go on from the weights it started with, with only a warning."""
        model = model if model is not None else self.model
        weights = Path(resume_from_checkpoint) / "model.safetensors"
        if not isinstance(model, PreTrainedModel) or not weights.is_file():
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        with safe_open(weights, framework="pt") as saved:
            if set(saved.keys()) <= set(model.state_dict()):
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
        reloaded = type(model).from_pretrained(resume_from_checkpoint, dtype=model.dtype, device_map="cpu")
        missing, unexpected = model.load_state_dict(reloaded.state_dict(), strict=False)
        if missing or unexpected:
            raise SystemExit(
                f"{resume_from_checkpoint}: the checkpoint's weights do not fit the model "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )

    def get_train_dataloader(self):
        dataloader = super().get_train_dataloader()
        if self.stream_checkpoint is not None:
            saved = Path(self.stream_checkpoint) / STREAM_STATE.format(rank=self.args.process_index)
            if not saved.is_file():
                raise SystemExit(
                    f"{saved}: no data loader state for process {self.args.process_index} "
                    "(a checkpoint of a streamed run saved by the same number of processes is needed)"
                )
            dataloader.load_state_dict(torch.load(saved, weights_only=False))
            self._load_rng_state(self.stream_checkpoint)  # the Trainer restores it only when it skips batches
        return dataloader

    def grouped_sampler(self, split: str, batch_size: int) -> LengthGroupedSampler | None:
        if self.args.train_sampling_strategy != "group_by_length" or split not in self.lengths:
            return None
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return EpochSeededLengthGroupedSampler(batch_size, lengths=self.lengths[split], seed=seed)

    def _get_train_sampler(self, train_dataset=None):
        batch_size = self.args.train_batch_size * self.args.gradient_accumulation_steps
        return self.grouped_sampler("train", batch_size) or super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        return self.grouped_sampler("eval", self.args.eval_batch_size) or super()._get_eval_sampler(eval_dataset)


def split_lengths(dataset, settings, processor, num_proc: int | None) -> list[int] | None:
    """Token counts of a map-style split's rows; None for a stream (read in its own order)."""
    if not isinstance(dataset, Dataset):
        return None
    return sequence_lengths(dataset.with_format(None), settings, processor, num_proc=num_proc)


def recipe_defaults(training_args: SFTConfig) -> SFTConfig:
    """Settings the recipe relies on, whatever the command line says."""
    training_args.assistant_only_loss = True  # loss on the reply only, via {% generation %} markers
    training_args.remove_unused_columns = False  # the lazy transform reads the stored columns
    training_args.dataset_kwargs = {"skip_prepare_dataset": True}
    # each process prepares its own batches from its own shards of a stream (accelerate would
    # otherwise read every batch on process 0 and send it to the others)
    training_args.accelerator_config.dispatch_batches = False
    return training_args


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


def train(data_args: DataArguments, training_args: SFTConfig, model_args: ModelConfig, model=None, processor=None):
    """Build (or take) the model and processor, the data, and run SFT; returns the trainer."""
    training_args = recipe_defaults(training_args)
    if processor is None:  # first: a processor that cannot be built stops the run before the model loads
        processor = load_processor(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
    if model is None:
        dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
        model = AutoModelForImageTextToText.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
            attn_implementation=model_args.attn_implementation,
            dtype=dtype,
        )
    budget = data_args.pixel_budget
    settings = settings_for(
        model.config.model_type, processor, data_args.box_convention, data_args.fold_system_prompt, budget
    )
    train_dataset = training_data(
        data_args, settings, data_args.train_split, training_args.seed, data_args.max_train_samples
    )
    eval_dataset = None
    if data_args.eval_split:
        eval_dataset = training_data(data_args, settings, data_args.eval_split, training_args.seed)
    lengths = {}
    if training_args.train_sampling_strategy == "group_by_length":
        for split, dataset in (("train", train_dataset), ("eval", eval_dataset)):
            counted = split_lengths(dataset, settings, processor, training_args.dataset_num_proc)
            if counted is not None:
                lengths[split] = counted
    if isinstance(train_dataset, IterableDataset) and training_args.process_index == 0:
        print(stream_sharding(train_dataset, training_args.world_size), file=sys.stderr)
    checkpointing = Checkpointing(stream=isinstance(train_dataset, IterableDataset))
    trainer = LengthGroupedSFTTrainer(
        callbacks=[checkpointing],
        lengths=lengths,
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    resume = resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    with checkpointing.listening():
        trainer.train(resume_from_checkpoint=resume)
    if checkpointing.preempted_at is not None:
        if trainer.accelerator.is_main_process:
            print(
                f"SIGTERM: saved {checkpointing.preempted_at} at step {trainer.state.global_step}; "
                "run the same command with --resume_from_checkpoint auto to go on",
                flush=True,
            )
        return trainer
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(training_args.output_dir)
    return trainer


def make_parser() -> TrlParser:
    parser = TrlParser((DataArguments, SFTConfig, ModelConfig))
    # Recipe defaults; a --config file or the command line still overrides them.
    parser.set_defaults(
        bf16=bf16_available(),  # a CPU (or a GPU without bf16) trains in float32 with no extra flag
        gradient_checkpointing=True,
        max_length=None,  # never cut image tokens; the pixel budget bounds the sequence
        lora_target_modules=["all-linear"],
        dtype=default_dtype(),
        report_to="none",
        train_sampling_strategy="group_by_length",  # rows of like length a batch (LengthGroupedSFTTrainer)
    )
    return parser


def main(argv: list[str] | None = None):
    data_args, training_args, model_args = make_parser().parse_args_and_config(args=argv)
    return train(data_args, training_args, model_args)


if __name__ == "__main__":
    try:
        main()
    except (RecipeError, LocalImagesError) as error:
        sys.exit(f"sft.py: error: {error}")
