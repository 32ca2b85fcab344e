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

    python training_recipes/sft.py \\
        --model_name_or_path Qwen/Qwen2.5-VL-3B-Instruct \\
        --gemex_path ./gemex --output_dir runs/qwen25vl-gemex \\
        --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --learning_rate 1e-5

    # or every argument in a file, on 8 GPUs (a SIGTERM then still ends in a checkpoint: training_recipes/runtime/launch.py)
    python -m training_recipes.runtime.launch torchrun --nproc_per_node 8 training_recipes/sft.py \\
        --config training_recipes/configs/qwen25vl_lora.yaml

Checkpoints `--resume_from_checkpoint auto` can trust: `training_recipes/runtime/checkpoints.py`; SIGTERM:
`training_recipes/runtime/preemption.py`; the trainer: `training_recipes/runtime/trainer.py`; the data arguments and
splits: `training_recipes/runtime/splits.py`; the vision tower's attention: `training_recipes/runtime/vision_attention.py`;
which attention kernel runs: `training_recipes/runtime/attention_kernels.py`; `--freeze_vision_tower` (on by default in LLaMA-Factory
and ms-swift, off here as in TRL): `training_recipes/runtime/vision_tower.py`.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from transformers import AutoModelForImageTextToText
from trl import ModelConfig, SFTConfig, TrlParser, get_peft_config

from builders.local_images import LocalImagesError
from training_recipes.data import settings_for
from training_recipes.runtime.checkpoints import Checkpointing, RunIdentity, resume_checkpoint
from training_recipes.runtime.launch import adopt_slurm_environment, check_world_size
from training_recipes.runtime.preemption import Preemption
from training_recipes.runtime.processors import RecipeError, bf16_available, default_dtype, load_processor
from training_recipes.runtime.splits import DataArguments, TrainingSplits
from training_recipes.runtime.trainer import LengthGroupedSFTTrainer
from training_recipes.runtime.vision_attention import use_chunked_vision_attention
from training_recipes.runtime.vision_tower import RecipeModelConfig, freeze_vision_tower


def recipe_defaults(training_args: SFTConfig) -> SFTConfig:
    """Settings the recipe relies on, whatever the command line says."""
    training_args.assistant_only_loss = True  # loss on the reply only, via {% generation %} markers
    training_args.remove_unused_columns = False  # the lazy transform reads the stored columns
    training_args.dataset_kwargs = {"skip_prepare_dataset": True}
    # each process prepares its own batches from its own shards of a stream (accelerate would
    # otherwise read every batch on process 0 and send it to the others)
    training_args.accelerator_config.dispatch_batches = False
    training_args.save_total_limit = None  # applied by `Checkpointing` once the new checkpoint is marked
    return training_args


def train(
    data_args: DataArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
    model=None,
    processor=None,
    preemption: Preemption | None = None,
):
    """Build (or take) the model and processor, the data, and run SFT; returns the trainer. A SIGTERM
    (`preemption`, listening from the start) ends in a checkpoint and a return."""
    preemption = preemption or Preemption()
    check_world_size(training_args.world_size)
    save_total_limit, training_args = training_args.save_total_limit, recipe_defaults(training_args)
    identity = RunIdentity.of(data_args, training_args, model_args)  # which checkpoints this run may resume
    resume = resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir, identity)
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
    use_chunked_vision_attention(model)
    peft_config = get_peft_config(model_args)
    if getattr(model_args, "freeze_vision_tower", False):  # TRL's own ModelConfig has no such option
        freeze_vision_tower(model, peft_config)
    budget = data_args.pixel_budget
    settings = settings_for(
        model.config.model_type, processor, data_args.box_convention, data_args.fold_system_prompt, budget
    )
    settings = replace(settings, reply=data_args.reply)
    splits = TrainingSplits.of(data_args, training_args, settings, processor)
    trainer = LengthGroupedSFTTrainer(
        callbacks=[preemption, Checkpointing(identity, splits.streamed, save_total_limit)],
        lengths=splits.lengths,
        model=model,
        args=training_args,
        train_dataset=splits.train,
        eval_dataset=splits.eval,
        processing_class=processor,
        peft_config=peft_config,
    )
    with preemption.listening():
        trainer.train(resume_from_checkpoint=resume)
        if preemption.preempted_at is None:
            trainer.save_model(training_args.output_dir)
            if trainer.accelerator.is_main_process:
                processor.save_pretrained(training_args.output_dir)
    if preemption.preempted_at is not None and trainer.accelerator.is_main_process:
        print(
            f"SIGTERM: saved {preemption.preempted_at} at step {trainer.state.global_step}; "
            "run the same command with --resume_from_checkpoint auto to go on",
            flush=True,
        )
    return trainer


def make_parser() -> TrlParser:
    parser = TrlParser((DataArguments, SFTConfig, RecipeModelConfig))
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
    adopt_slurm_environment()
    preemption = Preemption()
    with preemption.listening():  # a SIGTERM while the model loads stops the run at its first step
        data_args, training_args, model_args = make_parser().parse_args_and_config(args=argv)
        return train(data_args, training_args, model_args, preemption=preemption)


if __name__ == "__main__":
    try:
        main()
    except (RecipeError, LocalImagesError) as error:
        sys.exit(f"sft.py: error: {error}")
