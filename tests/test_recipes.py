"""The training recipes on CPU with tiny models built offline (tests/tiny_models.py) and small
built folders (tests/tiny_builds.py): label masking, a loss that falls, LoRA save and reload,
mixing, the plain-Trainer path, and a predictions file the scorer can read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("peft")

from transformers import Trainer, TrainingArguments  # noqa: E402
from trl import ModelConfig, SFTConfig  # noqa: E402
from trl.chat_template_utils import get_training_chat_template  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling  # noqa: E402

from builders.pixel_budget import MAX_PIXELS, MIN_PIXELS, PixelBudget  # noqa: E402
from cxr_vqa import cli  # noqa: E402
from gemex_dataset.prompts import type_prompt  # noqa: E402
from training_recipes import data, generate, sft  # noqa: E402
from training_recipes.runtime import processors  # noqa: E402

from . import tiny_builds, tiny_models  # noqa: E402

END_OF_TURN = {"qwen2_5_vl": "<|im_end|>", "idefics3": "<end_of_utterance>", "gemma3": "<end_of_turn>"}


@pytest.fixture(scope="module")
def gemex_dir(tmp_path_factory) -> Path:
    return tiny_builds.built_gemex(tmp_path_factory.mktemp("gemex"), n=8)


@pytest.fixture(scope="module")
def rexvqa_dir(tmp_path_factory) -> Path:
    return tiny_builds.built_rexvqa(tmp_path_factory.mktemp("rexvqa"), n=4)


def training_collator(processor) -> DataCollatorForVisionLanguageModeling:
    """The collator SFTTrainer builds for `assistant_only_loss`: TRL's training chat template."""
    return DataCollatorForVisionLanguageModeling(
        processor, assistant_only_loss=True, chat_template=get_training_chat_template(processor)
    )


def sft_config(output_dir: Path, **overrides) -> SFTConfig:
    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        max_steps=10,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        seed=0,
    )
    settings.update(overrides)
    return SFTConfig(**settings)


def mean_loss(model, collator, examples: list[dict]) -> float:
    model.eval()
    with torch.no_grad():
        loss = model(**collator([dict(e) for e in examples])).loss.item()
    model.train()
    return loss


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_labels_cover_only_the_assistant_reply(family, gemex_dir, rexvqa_dir):
    vlm = tiny_models.tiny_vlm(family)
    settings = data.settings_for(vlm.model.config.model_type, vlm.processor)
    collator = training_collator(vlm.processor)
    for built in (tiny_builds.load_built(gemex_dir), tiny_builds.load_built(rexvqa_dir)):
        examples = data.conversational(built.select(range(3)), settings)
        batch = collator([examples[i] for i in range(3)])
        for i in range(3):
            target = examples[i]["messages"][-1]["content"][0]["text"]
            trained = batch["labels"][i][batch["labels"][i] != -100]
            text = vlm.processor.tokenizer.decode(trained)
            # the reply and the end-of-turn token that teaches the model to stop; nothing else
            assert text.strip() == f"{target}{END_OF_TURN[family]}", text
            assert (batch["labels"][i] != -100).sum() < batch["attention_mask"][i].sum()


def test_gemma3_instruction_goes_into_the_user_turn(gemex_dir):
    vlm = tiny_models.tiny_vlm("gemma3")
    row = tiny_builds.load_built(gemex_dir)[3]
    for fold in (True, None):  # folded by us, or by the template itself
        settings = data.settings_for("gemma3", vlm.processor, fold_system=fold)
        messages = data.to_messages(row, "gemex", settings, with_answer=False)
        rendered = vlm.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        user_turn = rendered.split("<start_of_turn>user\n", 1)[1].split("<end_of_turn>")[0]
        assert type_prompt("multi_choice") in user_turn and "<start_of_turn>system" not in rendered
        assert rendered.endswith("<start_of_turn>model\n")
    assert [
        m["role"] for m in data.to_messages(row, "gemex", data.settings_for("gemma3", vlm.processor, fold_system=True))
    ] == [
        "user",
        "assistant",
    ]


def test_qwen25vl_boxes_are_in_the_processed_image_pixels(gemex_dir):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    settings = data.settings_for("qwen2_5_vl", vlm.processor)
    assert settings.box_convention == "qwen2.5-vl"
    assert settings.pixel_budget == PixelBudget(MIN_PIXELS, MAX_PIXELS, factor=28)  # the default budget
    row = tiny_builds.load_built(gemex_dir)[0]
    example = data.to_trl_example(row, "gemex", settings)
    grid = vlm.processor.image_processor(example["images"], return_tensors="pt")["image_grid_thw"][0]
    processed_w, processed_h = int(grid[2]) * 14, int(grid[1]) * 14
    assert example["images"][0].size == (
        processed_w,
        processed_h,
    )  # decoded at the budget: the processor's resize is a no-op
    x1, y1, x2, y2 = row["boxes"][0]
    sx, sy = processed_w / row["image_width"], processed_h / row["image_height"]
    expected = [round(x1 * sx), round(y1 * sy), round(x2 * sx), round(y2 * sy)]
    assert example["messages"][-1]["content"][0]["text"].endswith(f"<location> {[expected]}")


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_short_sft_run_lowers_the_loss(family, gemex_dir, tmp_path):
    vlm = tiny_models.tiny_vlm(family)
    built = tiny_builds.load_built(gemex_dir).select(range(4))
    settings = data.settings_for(vlm.model.config.model_type, vlm.processor)
    examples = data.conversational(built, settings)
    collator = training_collator(vlm.processor)
    before = mean_loss(vlm.model, collator, [examples[i] for i in range(4)])
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), max_train_samples=4)
    trainer = sft.train(data_args, sft_config(tmp_path), ModelConfig(), model=vlm.model, processor=vlm.processor)
    after = mean_loss(trainer.model, collator, [examples[i] for i in range(4)])
    assert after < 0.7 * before, (before, after)


def test_a_run_with_reply_answer_trains_the_answer_alone(gemex_dir, tmp_path):
    from training_recipes.runtime.checkpoints import RunIdentity

    vlm = tiny_models.tiny_vlm("idefics3")
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), max_train_samples=4, reply="answer")
    args = sft_config(tmp_path, max_steps=1)
    trainer = sft.train(data_args, args, ModelConfig(), model=vlm.model, processor=vlm.processor)
    replies = [
        part["text"]
        for row in trainer.train_dataset
        for message in row["messages"]
        if message["role"] == "assistant"
        for part in message["content"]
    ]
    assert len(replies) == 4 and all(
        r.startswith("<answer> ") and r.endswith(" <reason>  <location> []") for r in replies
    )
    assert RunIdentity.of(data_args, args, ModelConfig()).run["data"]["reply"] == "answer"


def test_lora_run_from_a_config_file_saves_reloads_and_generates(gemex_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_models.save_tiny_vlm("idefics3", tmp_path / "base")
    out = tmp_path / "lora"
    config = tmp_path / "lora.yaml"
    config.write_text(
        "\n".join(
            [
                f"model_name_or_path: {model_dir}",
                f"gemex_path: {gemex_dir}",
                f"output_dir: {out}",
                "use_peft: true",
                "lora_r: 8",
                "lora_alpha: 16",
                "dtype: float32",
                "bf16: false",
                "use_cpu: true",
                "max_steps: 3",
                "per_device_train_batch_size: 4",
                "learning_rate: 0.01",
                "save_strategy: 'no'",
            ]
        )
    )
    trainer = sft.main(["--config", str(config), "--max_train_samples", "4"])
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert trainer.args.gradient_checkpointing  # the recipe default, kept through the config file

    trained = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_B" in k}
    assert trained and any(v.abs().sum() > 0 for v in trained.values())  # B starts at zero: it trained
    reloaded = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(model_dir), out)
    reloaded_params = dict(reloaded.named_parameters())
    for name, value in trained.items():
        assert torch.equal(reloaded_params[name], value)

    # generation reads the adapter folder, resolves its base model, and writes the predictions file
    predictions = tmp_path / "predictions.jsonl"
    written = generate.main(
        [
            "--model_name_or_path",
            str(out),
            "--dataset_path",
            str(gemex_dir),
            "--split",
            "train",
            "--output_file",
            str(predictions),
            "--batch_size",
            "3",
            "--max_new_tokens",
            "6",
            "--dtype",
            "float32",
        ]
    )
    assert written == 8
    assert_scorer_accepts(predictions, tiny_builds.load_built(gemex_dir))


def assert_scorer_accepts(predictions: Path, split) -> None:
    """What `cxr-vqa evaluate` reads: one JSON object per line, a string `question_id` of the
    split and the raw text `prediction`, each question once."""
    lines = predictions.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(set(r) == {"question_id", "prediction"} and isinstance(r["prediction"], str) for r in records)
    ids = [r["question_id"] for r in records]
    assert len(ids) == len(set(ids)) and set(ids) == set(split["question_id"])


def test_generation_resumes_where_it_stopped(gemex_dir, rexvqa_dir, tmp_path):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    for built_dir in (gemex_dir, rexvqa_dir):
        split = tiny_builds.load_built(built_dir)
        predictions = tmp_path / f"{built_dir.name}.jsonl"
        assert generate.generate_predictions(vlm.model, vlm.processor, split.select(range(3)), predictions, 2, 4) == 3
        with predictions.open("a") as f:
            f.write('{"question_id": "torn')  # a run killed mid-line
        assert generate.generate_predictions(vlm.model, vlm.processor, split, predictions, 2, 4) == len(split) - 3
        assert generate.generate_predictions(vlm.model, vlm.processor, split, predictions, 2, 4) == 0
        assert_scorer_accepts(predictions, split)


def test_generation_resumes_only_a_file_its_own_run_wrote(gemex_dir, tmp_path):
    """Another reply setting, or the model trained again (its weights rewritten at the same size), and the
    same command stops, naming the file and what differs, rather than leave the old predictions for
    `cxr-vqa evaluate` to score; `--overwrite_output_file` starts the file over."""
    model_dir = tiny_models.save_tiny_vlm("gemma3", tmp_path / "model")
    predictions = tmp_path / "predictions.jsonl"
    argv = ["--model_name_or_path", str(model_dir), "--dataset_path", str(gemex_dir), "--split", "train"]
    argv += ["--output_file", str(predictions), "--batch_size", "4", "--max_new_tokens", "2", "--dtype", "float32"]
    refused = rf"{re.escape(str(predictions))}: written by another run \({{}}\); pass --overwrite_output_file"
    assert generate.main([*argv, "--max_samples", "3"]) == 3
    assert generate.main([*argv, "--batch_size", "3"]) == 5  # the same run resumes, whatever its questions or batch
    with pytest.raises(processors.RecipeError, match=refused.format("max_new_tokens 2 -> 3")):
        generate.main([*argv, "--max_new_tokens", "3"])
    tiny_models.save_tiny_vlm("gemma3", model_dir, seed=1)  # trained again
    weights = rf"{re.escape(str(model_dir / 'model.safetensors'))} '(\d+) bytes, modified [^']+' -> '\1 bytes, [^']+'"
    with pytest.raises(processors.RecipeError, match=refused.format(f".*{weights}")):
        generate.main(argv)
    assert generate.main([*argv, "--overwrite_output_file"]) == 8
    assert generate.main(argv) == 0
    assert_scorer_accepts(predictions, tiny_builds.load_built(gemex_dir, "train"))
    generate.run_record_file(predictions).unlink()
    with pytest.raises(processors.RecipeError, match="holds predictions but no record of what wrote them"):
        generate.main(argv)


def test_generation_asks_longest_prompts_first_and_pads_less(tmp_path, monkeypatch):
    """ReXVQA studies of 1 and 2 images alternate in the split: in split order every batch of two is
    left-padded by a whole image; longest first, one batch is. The replies are the same either way,
    and with the static KV cache."""
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    split = tiny_builds.load_built(tiny_builds.built_rexvqa(tmp_path / "rexvqa", n=6))
    padded: list[int] = []
    ask = vlm.model.generate

    def counting_padding(**inputs):
        padded.append(int((inputs["attention_mask"] == 0).sum()))
        return ask(**inputs)

    monkeypatch.setattr(vlm.model, "generate", counting_padding)
    replies, padding, order = {}, {}, {}
    for run, options in {
        "split order": {"sort_by_length": False},
        "longest first": {},
        "static cache": {"cache_implementation": "static"},
    }.items():
        padded.clear()
        output = tmp_path / f"{run}.jsonl"
        assert generate.generate_predictions(vlm.model, vlm.processor, split, output, 2, 4, **options) == 6
        records = [json.loads(line) for line in output.read_text().splitlines()]
        replies[run] = {r["question_id"]: r["prediction"] for r in records}
        order[run], padding[run] = [r["question_id"] for r in records], sum(padded)
    assert order["split order"] == list(split["question_id"])
    two_images = [q for q, images in zip(split["question_id"], split["image_widths"]) if len(images) == 2]
    assert order["longest first"][: len(two_images)] == two_images
    assert padding["longest first"] < padding["split order"] / 2
    assert replies["longest first"] == replies["split order"] == replies["static cache"]


def test_gemex_and_rexvqa_mix_by_weight_and_train(gemex_dir, rexvqa_dir, tmp_path):
    vlm = tiny_models.tiny_vlm("gemma3")
    settings = data.settings_for("gemma3", vlm.processor)
    gemex, rexvqa = tiny_builds.load_built(gemex_dir), tiny_builds.load_built(rexvqa_dir)
    stream = data.mix([(gemex, 1.0), (rexvqa, 3.0)], settings, seed=1, num_shards=2)
    drawn = list(stream.take(40))
    from_rexvqa = sum(
        e["messages"][-1]["content"][0]["text"].startswith("<answer> ")
        and "effusion" in e["messages"][-2]["content"][-1]["text"]
        for e in drawn
    )
    assert 20 <= from_rexvqa <= 38  # about 3 in 4, and GEMeX still drawn
    assert all(len(e["images"]) == sum(p["type"] == "image" for p in e["messages"][-2]["content"]) for e in drawn)
    assert all(image.mode == "RGB" for e in drawn for image in e["images"])  # 16-bit PNGs scaled to 8-bit

    data_args = sft.DataArguments(gemex_path=str(gemex_dir), rexvqa_path=str(rexvqa_dir), rexvqa_weight=3.0)
    trainer = sft.train(data_args, sft_config(tmp_path, max_steps=2), ModelConfig(), vlm.model, vlm.processor)
    assert trainer.state.global_step == 2 and all(
        torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h
    )


def test_streaming_run_trains_and_caches_nothing(gemex_dir, tmp_path, monkeypatch):
    """`--streaming`: rows read as they train; the datasets cache gets no Arrow copy of the images."""
    import datasets

    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    data_args = sft.DataArguments(gemex_path=str(gemex_dir), streaming=True)
    trainer = sft.train(data_args, sft_config(tmp_path / "run", max_steps=2), ModelConfig(), vlm.model, vlm.processor)
    assert trainer.state.global_step == 2
    assert not list(cache.rglob("*.arrow"))


def test_plain_trainer_trains_through_trls_vision_collator(gemex_dir, tmp_path):
    """The documented `transformers.Trainer` snippet (training_recipes/README.md)."""
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    model, processor = vlm.model, vlm.processor
    # --- snippet ---
    settings = data.settings_for(model.config.model_type, processor)
    train_dataset = data.conversational(tiny_builds.load_built(gemex_dir), settings)
    collator = DataCollatorForVisionLanguageModeling(
        processor, assistant_only_loss=True, chat_template=get_training_chat_template(processor)
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=6,
        learning_rate=3e-3,
        remove_unused_columns=False,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=collator)
    trainer.train()
    # --- end of snippet ---
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and losses[-1] < losses[0]


def test_throughput_benchmark_runs_tiny_on_cpu(tmp_path, capsys):
    from benchmarks import train_throughput

    result = train_throughput.main(
        [
            "--tiny",
            "--steps",
            "3",
            "--warmup_steps",
            "1",
            "--batch_size",
            "2",
            "--rows",
            "8",
            "--workdir",
            str(tmp_path),
        ]
    )
    for key in ("samples_per_s", "tokens_per_s", "mfu", "peak_memory_gb", "data_wait_share"):
        assert key in result
    assert result["samples_per_s"] > 0 and 0 <= result["data_wait_share"] <= 1
    assert "samples/s" in capsys.readouterr().out


def test_the_throughput_benchmark_trains_on_the_loss_the_recipes_trainer_computes():
    """B.1's step takes its loss from TRL's fused LM head, as SFTTrainer does: the model's own loss on the same
    batch, without the whole vocabulary's logits; its FLOPs count the head where a label is scored."""
    from benchmarks import train_throughput

    torch.manual_seed(0)
    preset = train_throughput.model_preset(train_throughput.TINY)
    model, _ = train_throughput.build_model_and_processor(preset, PixelBudget(), "sdpa")
    model.eval()
    input_ids = torch.randint(10, 300, (2, 12))
    labels = input_ids.clone()
    labels[0, :7] = labels[1, :4] = -100
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    own = model(**batch).loss
    train_throughput.use_the_trainers_loss(model)
    fused = model(**batch, fused_lm_head=True)
    assert torch.allclose(fused.loss, own, atol=1e-5) and not hasattr(fused, "logits")
    assert model(**batch).logits.shape[-1] == model.config.get_text_config().vocab_size  # generation's forward
    assert train_throughput.scored_positions(batch) == (12 - 7) + (12 - 4)
    text_config = model.config.get_text_config()
    head = 6 * text_config.hidden_size * text_config.vocab_size
    assert train_throughput.step_flops(batch, 0, 0, text_config) == pytest.approx(
        6 * text_config.num_hidden_layers * text_config.hidden_size * 2 * 12**2 + head * 13
    )


def test_end_to_end_on_a_real_demo_build(tmp_path):
    """The real builder makes a small synthetic GEMeX build (what `cxr-vqa demo` does); the recipe
    trains on it and predicts its questions. (`run_demo` itself is not called: with few images its
    preview asks for a `test` split the build may not have.)"""
    from builders.assembly.settings import BuildSettings
    from gemex_dataset.build import build_gemex
    from gemex_dataset.synthetic.release import generate as generate_release

    release = generate_release(tmp_path / "raw", num_images=4)
    gemex_dir = tmp_path / "gemex"
    build_gemex(
        BuildSettings(
            source=release.root / "per_type",
            out=gemex_dir,
            images=release.image_root,
            image_mode="embed",
            overwrite=True,
        )
    )
    model_dir = tiny_models.save_tiny_vlm("gemma3", tmp_path / "base")
    out = tmp_path / "full"
    sft.main(
        [
            "--model_name_or_path",
            str(model_dir),
            "--gemex_path",
            str(gemex_dir),
            "--train_split",
            "train",
            "--max_train_samples",
            "8",
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--bf16",
            "false",
            "--use_cpu",
            "true",
            "--dtype",
            "float32",
            "--save_strategy",
            "no",
        ]
    )
    predictions = tmp_path / "predictions.jsonl"
    generate.main(
        [
            "--model_name_or_path",
            str(out),
            "--dataset_path",
            str(gemex_dir),
            "--split",
            "train",
            "--output_file",
            str(predictions),
            "--max_samples",
            "6",
            "--batch_size",
            "3",
            "--max_new_tokens",
            "4",
            "--dtype",
            "float32",
        ]
    )
    split = tiny_builds.load_built(gemex_dir, "train").select(range(6))
    assert_scorer_accepts(predictions, split)


SMALL_BUDGET = PixelBudget(min_pixels=28 * 28, max_pixels=4 * 28 * 28)
"""Below the tiny builds' 64 x 80 images (which the processor's own 12.8 M leaves at 56 x 84), so a
budget that reached the processor shows as 28 x 56 images."""


def at_processor_limit(processor):
    """`processor` as Qwen2.5-VL is released: 12.8 M pixels."""
    size = type(processor.image_processor.size)
    processor.image_processor.size = size(shortest_edge=MIN_PIXELS, longest_edge=16384 * 28 * 28)
    return processor


def grids(batch) -> list[list[int]]:
    return batch["image_grid_thw"].tolist()


def test_a_processor_at_its_own_limit_trains_at_the_budget_and_is_scored_at_it(gemex_dir, tmp_path):
    """Training: the processor, the images the collator sees and the boxes in the targets follow
    the budget; those targets scored as replies at the same budget match the stored boxes (up to
    the rounding of a 28 x 56 image's integer pixels), at the default budget they do not."""
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    processor = at_processor_limit(vlm.processor)
    assert grids(processor(images=[tiny_builds.load_built(gemex_dir)[0]["image"]], text=["<|image_pad|>"]))[0] == [
        1,
        6,
        4,
    ]
    data_args = sft.DataArguments(
        gemex_path=str(gemex_dir),
        max_train_samples=4,
        max_pixels=SMALL_BUDGET.max_pixels,
        min_pixels=SMALL_BUDGET.min_pixels,
    )
    trainer = sft.train(data_args, sft_config(tmp_path / "run", max_steps=1), ModelConfig(), vlm.model, processor)
    size = processor.image_processor.size
    assert (size.shortest_edge, size.longest_edge) == (SMALL_BUDGET.min_pixels, SMALL_BUDGET.max_pixels)
    examples = [trainer.train_dataset[i] for i in range(4)]
    assert all(image.size == (28, 56) for e in examples for image in e["images"])
    assert grids(trainer.data_collator([dict(e) for e in examples])) == [[1, 4, 2]] * 4

    replies = tmp_path / "replies.jsonl"
    split = tiny_builds.load_built(gemex_dir).select(range(4))
    replies.write_text(
        "".join(
            json.dumps({"question_id": row["question_id"], "prediction": e["messages"][-1]["content"][0]["text"]})
            + "\n"
            for row, e in zip(split, examples)
        )
    )
    ious = {}
    for budget in (SMALL_BUDGET, PixelBudget()):
        out = tmp_path / f"scores-{budget.max_pixels}.json"
        assert (
            cli.main(
                [
                    "evaluate",
                    str(gemex_dir),
                    "--split",
                    "train",
                    "--predictions",
                    str(replies),
                    "--box-convention",
                    "qwen2.5-vl",
                    "--max-pixels",
                    str(budget.max_pixels),
                    "--min-pixels",
                    str(budget.min_pixels),
                    "--text-metrics",
                    "",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        scores = json.loads(out.read_text())
        ious[budget] = [q["iou"] for q in scores["per_question"] if q["question_id"] in set(split["question_id"])]
        assert scores["settings"]["max_pixels"] == budget.max_pixels
    assert min(ious[SMALL_BUDGET]) > 0.7 and max(ious[PixelBudget()]) < 0.5, ious


def test_generation_asks_at_the_budget_not_the_saved_processors_limit(gemex_dir, tmp_path, monkeypatch):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    model_dir = tmp_path / "model"
    vlm.model.save_pretrained(model_dir)
    at_processor_limit(vlm.processor).save_pretrained(model_dir)
    seen = []
    original = Qwen2_5_VLForConditionalGeneration.generate

    def recording_generate(self, *args, **kwargs):
        seen.extend(kwargs["image_grid_thw"].tolist())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Qwen2_5_VLForConditionalGeneration, "generate", recording_generate)
    monkeypatch.setattr(
        AutoProcessor,
        "from_pretrained",
        lambda *a, **k: at_processor_limit(tiny_models.tiny_vlm("qwen2_5_vl").processor),
    )
    common = [
        "--model_name_or_path",
        str(model_dir),
        "--dataset_path",
        str(gemex_dir),
        "--split",
        "train",
        "--max_samples",
        "2",
        "--batch_size",
        "2",
        "--max_new_tokens",
        "2",
        "--dtype",
        "float32",
    ]
    generate.main(
        [
            *common,
            "--output_file",
            str(tmp_path / "small.jsonl"),
            "--max_pixels",
            str(SMALL_BUDGET.max_pixels),
            "--min_pixels",
            str(SMALL_BUDGET.min_pixels),
        ]
    )
    assert seen == [[1, 4, 2]] * 2
    seen.clear()
    generate.main([*common, "--output_file", str(tmp_path / "default.jsonl")])
    assert seen == [[1, 6, 4]] * 2  # the default budget (above these images' size), never a silent 12.8 M


@pytest.mark.parametrize("parser", [sft.make_parser, lambda: generate.HfArgumentParser(generate.GenerateArguments)])
def test_help_shows_the_pixel_budget_default(parser):
    text = parser().format_help()
    assert "--max_pixels" in text and "--min_pixels" in text and f"{MAX_PIXELS:,}" in text
