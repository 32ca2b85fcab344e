"""The kit's steps that run the recipes in one process with a model built once (kit.py starts each).

    python -m benchmarks.gpu.workers generate --work /tmp/gpu-kit --result generate.json [--tiny]
    python -m benchmarks.gpu.workers loop --work /tmp/gpu-kit --result loop.json [--tiny]
    python -m benchmarks.gpu.workers layouts --work /tmp/gpu-kit --result layouts.json [--tiny]

The model is the benchmark's: Qwen2.5-VL of the plan's size from its config with random weights
and the offline processor (`benchmarks/train_throughput.py`), built straight on the device; no
checkpoint is saved and reloaded (a 3B one is 7.5 GB). The recipes' own functions do the work:
`training_recipes.generate.generate_predictions` (what `generate.py` runs after loading a model) and
`training_recipes.sft.train` (what `sft.py` runs after parsing its arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu.kit import load_plan
from benchmarks.train_throughput import MODELS, TINY, build_model_and_processor, model_preset
from training_recipes.runtime.vision_attention import use_chunked_vision_attention


def budget(plan: dict):
    from builders.pixel_budget import PixelBudget

    return PixelBudget(plan["min_pixels"], plan["max_pixels"])


def model_on_device(plan: dict, tiny: bool):
    torch.manual_seed(0)
    preset = model_preset(TINY if tiny else MODELS[plan["model"]])
    model, processor = build_model_and_processor(preset, budget(plan), plan["attn_implementation"], plan["device"])
    use_chunked_vision_attention(model)  # as the recipes load a model
    return model, processor


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_memory_gb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def for_generation(model, device: str):
    """Inference dtype as `generate.py` loads it: bf16 on a GPU, float32 on CPU."""
    return model.to(torch.bfloat16 if device.startswith("cuda") else torch.float32).eval()


def save(result: dict, path: Path) -> dict:
    """Written after each stage, so a step killed later still leaves what it measured."""
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


VARIANTS = {
    "longest first": {},
    "split order": {"sort_by_length": False},
    "static cache": {"cache_implementation": "static"},
}
"""generate_predictions' options each B.2 row is taken with: the recipe's default first."""


def timed_generation(model, processor, questions, output: Path, batch_size: int, plan: dict, variant: str) -> dict:
    """One B.2 row: every question of `questions` at `batch_size` with `variant`'s options."""
    from training_recipes.data import settings_for
    from training_recipes.generate import generate_predictions

    settings, device = plan["generate"], plan["device"]
    conversation = settings_for("qwen2_5_vl", processor, pixel_budget=budget(plan))
    output.unlink(missing_ok=True)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    row = {"batch_size": batch_size, "variant": variant}
    started = time.perf_counter()
    try:
        written = generate_predictions(
            model,
            processor,
            questions,
            output,
            batch_size,
            settings["max_new_tokens"],
            conversation,
            **VARIANTS[variant],
        )
    except torch.OutOfMemoryError as err:
        return {
            **row,
            "status": "failed",
            "seconds": time.perf_counter() - started,
            "error": f"out of memory: {str(err).splitlines()[0]}",
        }
    synchronize(device)
    seconds = time.perf_counter() - started
    replies = [json.loads(line)["prediction"] for line in output.read_text().splitlines()]
    return {
        **row,
        "status": "ok",
        "seconds": seconds,
        "questions": written,
        "questions_per_s": written / seconds,
        "peak_memory_gb": peak_memory_gb(device),
        "mean_reply_chars": sum(map(len, replies)) / max(len(replies), 1),
    }


def generate_worker(plan: dict, work: Path, tiny: bool, result: Path) -> dict:
    """B.2: the same questions at each batch size; then, at the fastest batch size, the recipe's other
    options (`variants`) and ReXVQA's studies of 1-4 images in both orders. Each batch size's first
    batch, and each static cache's, runs once untimed first: a new size meets new shapes (the allocator's,
    the kernels' plans), a static cache compiles its decoding step."""
    from datasets import load_dataset

    settings = plan["generate"]
    model, processor = model_on_device(plan, tiny)
    model = for_generation(model, plan["device"])
    runs = work / "runs" / "generate"
    runs.mkdir(parents=True, exist_ok=True)

    def questions_of(dataset: str):
        split = load_dataset(str(work / "built" / dataset), split=settings["split"])
        return split.select(range(min(settings["questions"], len(split))))

    gemex = questions_of(settings["dataset"])
    batches, warmed = [], set()

    def measure(questions, dataset: str, batch_size: int, variant: str) -> dict:
        name = f"{dataset}-{variant.replace(' ', '-')}-{batch_size}"
        if (dataset, batch_size) not in warmed or variant == "static cache":
            first = questions.select(range(min(batch_size, len(questions))))
            timed_generation(model, processor, first, runs / f"warm-up-{name}.jsonl", batch_size, plan, variant)
            warmed.add((dataset, batch_size))
        row = {
            "dataset": dataset,
            **timed_generation(model, processor, questions, runs / f"{name}.jsonl", batch_size, plan, variant),
        }
        batches.append(row)
        save({"batches": batches}, result)
        return row

    for batch_size in settings["batch_sizes"]:
        if measure(gemex, settings["dataset"], batch_size, "longest first")["status"] != "ok":
            break  # out of memory: the larger batch sizes would be too
    measured = [row for row in batches if row["status"] == "ok"]
    if not measured:
        return save({"batches": batches}, result)
    best = max(measured, key=lambda row: row["questions_per_s"])["batch_size"]
    for variant in settings["variants"]:
        measure(gemex, settings["dataset"], best, variant)
    if settings.get("rexvqa"):
        rexvqa = questions_of("rexvqa")
        for variant in ("longest first", "split order"):
            measure(rexvqa, "rexvqa", best, variant)
    return save({"batches": batches}, result)


def lora_arguments(plan: dict, output_dir: Path, steps: int, batch_size: int, learning_rate: float, **options):
    """The recipe's LoRA run as the kit trains it (B.3, B.6): `sft.train`'s SFTConfig and ModelConfig."""
    from trl import ModelConfig, SFTConfig

    on_gpu = plan["device"].startswith("cuda")
    training_args = SFTConfig(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(10, steps // 5),
        save_strategy="no",
        report_to="none",
        bf16=on_gpu,
        use_cpu=not on_gpu,
        gradient_checkpointing=plan["train"]["gradient_checkpointing"],
        max_length=None,
        seed=0,
        **options,
    )
    model_args = ModelConfig(
        use_peft=True,
        lora_r=plan["train"]["lora_r"],
        lora_alpha=plan["train"]["lora_alpha"],
        lora_target_modules=["all-linear"],
    )
    return training_args, model_args


def loop_worker(plan: dict, work: Path, tiny: bool, result: Path) -> dict:
    """B.3: LoRA on the GEMeX + ReXVQA mixture through `sft.train`, then predictions on both test splits."""
    from datasets import load_dataset

    from training_recipes import sft
    from training_recipes.data import settings_for
    from training_recipes.generate import generate_predictions

    loop, device = plan["loop"], plan["device"]
    model, processor = model_on_device(plan, tiny)
    built = {name: work / "built" / name for name in ("gemex", "rexvqa")}
    data_args = sft.DataArguments(
        gemex_path=str(built["gemex"]),
        rexvqa_path=str(built["rexvqa"]),
        gemex_config="sft",
        rexvqa_config="sft",
        gemex_weight=loop["gemex_weight"],
        rexvqa_weight=loop["rexvqa_weight"],
        max_pixels=plan["max_pixels"],
        min_pixels=plan["min_pixels"],
    )
    training_args, model_args = lora_arguments(
        plan,
        work / "runs" / "loop",
        loop["steps"],
        loop["batch_size"],
        loop["learning_rate"],
        logging_steps=loop["logging_steps"],
        dataloader_num_workers=loop["num_workers"],
    )
    started = time.perf_counter()
    trainer = sft.train(data_args, training_args, model_args, model=model, processor=processor)
    train_seconds = time.perf_counter() - started
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    trained = save(
        {
            "steps": trainer.state.global_step,
            "train_seconds": train_seconds,
            "losses": losses,
            "peak_memory_gb": peak_memory_gb(device),
            "predictions": {},
        },
        result,
    )

    model = for_generation(trainer.model.merge_and_unload(), device)
    conversation = settings_for("qwen2_5_vl", processor, pixel_budget=budget(plan))
    predictions = trained["predictions"]
    for name, folder in built.items():
        test = load_dataset(str(folder), split="test")
        output = work / "runs" / "loop" / f"predictions-{name}.jsonl"
        output.unlink(missing_ok=True)
        count = generate_predictions(
            model, processor, test, output, loop["generate_batch_size"], loop["max_new_tokens"], conversation
        )
        predictions[name] = {"file": str(output), "count": count}
        (work / "logs" / f"predictions-{name}.jsonl").write_text(output.read_text())
        save(trained, result)
    return trained


def layouts_worker(plan: dict, work: Path, tiny: bool, result: Path) -> dict:
    """B.6: which layout teaches more per GPU second. The questions of the first `images` GEMeX training
    images, trained once a question a row and once an image's questions a conversation (one epoch each,
    LoRA from the same random weights, through `sft.train`), then each model's loss on the same held-back
    questions, a question a row: those of the next `held_out_images` images."""
    from dataclasses import replace

    from datasets import load_dataset

    from training_recipes import sft
    from training_recipes.data import conversational, settings_for

    race, device = plan["layout_race"], plan["device"]
    built, configs = str(work / "built" / "gemex"), plan["layouts"]["gemex"]
    conversations = load_dataset(built, configs["per_image"], split="train")
    questions = load_dataset(built, configs["per_question"], split="train")
    images = list(dict.fromkeys(conversations["dicom_id"]))
    trained_images = set(images[: race["images"]])
    held_images = set(images[race["images"] : race["images"] + race["held_out_images"]])
    subsets = {
        "per_question": questions.filter(lambda image: image in trained_images, input_columns="dicom_id"),
        "per_image": conversations.filter(lambda image: image in trained_images, input_columns="dicom_id"),
    }
    held_back = questions.filter(lambda image: image in held_images, input_columns="dicom_id")
    rows = []
    for layout, subset in subsets.items():
        folder = work / "runs" / "layouts" / layout  # a plain Parquet folder: sft.train loads it as it loads a build
        subset.to_parquet(str(folder / "data" / "train-00000-of-00001.parquet"))
        model, processor = model_on_device(plan, tiny)  # seeded: the same random weights for both layouts
        batch_size = race["batch_size"][layout]
        steps = -(-len(subset) // batch_size)
        data_args = sft.DataArguments(
            gemex_path=str(folder), max_pixels=plan["max_pixels"], min_pixels=plan["min_pixels"]
        )
        training_args, model_args = lora_arguments(
            plan,
            work / "runs" / "layouts" / f"run-{layout}",
            steps,
            batch_size,
            race["learning_rate"],
            logging_steps=max(1, steps // 10),
            dataloader_num_workers=race["num_workers"],
            per_device_eval_batch_size=race["eval_batch_size"],
        )
        synchronize(device)
        started = time.perf_counter()
        trainer = sft.train(data_args, training_args, model_args, model=model, processor=processor)
        synchronize(device)
        train_seconds = time.perf_counter() - started
        conversation = replace(
            settings_for(model.config.model_type, processor, pixel_budget=budget(plan)), reply=data_args.reply
        )
        held_back_loss = trainer.evaluate(eval_dataset=conversational(held_back, conversation))["eval_loss"]
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        trained_questions = len(subset) if layout == "per_question" else sum(len(ids) for ids in subset["question_ids"])
        rows.append(
            {
                "layout": layout,
                "config": configs[layout],
                "images": len(trained_images),
                "rows": len(subset),
                "questions": trained_questions,
                "batch_size": batch_size,
                "steps": trainer.state.global_step,
                "train_seconds": train_seconds,
                "questions_per_s": trained_questions / train_seconds,
                "loss_first": losses[0] if losses else None,
                "loss_last": losses[-1] if losses else None,
                "held_back_questions": len(held_back),
                "held_back_loss": held_back_loss,
                "peak_memory_gb": peak_memory_gb(device),
            }
        )
        save({"layouts": rows}, result)
        del trainer, model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return save({"layouts": rows}, result)


WORKERS = {"generate": generate_worker, "loop": loop_worker, "layouts": layouts_worker}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("worker", choices=sorted(WORKERS))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(WORKERS[args.worker](load_plan(args.tiny), args.work, args.tiny, args.result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
