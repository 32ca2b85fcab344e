"""The `sft` config trains unmodified: SFTTrainer with defaults, and a plain Trainer with TRL's collator."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from datasets import load_dataset
from transformers import Trainer, TrainingArguments
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

from builders.assembly.settings import BuildSettings
from gemex_dataset.build import build_gemex
from rexvqa_dataset.build import build_rexvqa
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa

from . import tiny_models


@pytest.fixture(scope="module")
def gemex_sft(gemex_release, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "gemex"
    build_gemex(
        BuildSettings(
            source=gemex_release.root / "per_type",
            out=out,
            images=gemex_release.image_root,
            image_mode="embed",
            image_size=112,
        )
    )
    return out


@pytest.fixture(scope="module")
def rexvqa_sft(tmp_path_factory):
    root = tmp_path_factory.mktemp("rexvqa-sft")
    release = generate_rexvqa(root / "release", num_studies=12)
    build_rexvqa(BuildSettings(source=release.root, out=root / "rexvqa", image_mode="embed", image_size=112))
    return root / "rexvqa"


def test_sft_rows_carry_image_and_messages(gemex_sft, rexvqa_sft):
    gemex = load_dataset(str(gemex_sft), "sft", split="train")
    row = gemex[0]
    assert [turn["role"] for turn in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][1]["content"][0]["type"] == "image"
    assert row["messages"][2]["content"][0]["text"].startswith("<answer> ")
    assert len(gemex) == len(load_dataset(str(gemex_sft), split="train"))
    rex = load_dataset(str(rexvqa_sft), "sft", split="train")
    for row in rex:
        parts = row["messages"][1]["content"]
        assert sum(p["type"] == "image" for p in parts) == len(row["images"])


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("fixture", ["gemex_sft", "rexvqa_sft"])
def test_sft_trainer_with_defaults_trains_on_the_sft_config(fixture, request, tmp_path):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    train = load_dataset(str(request.getfixturevalue(fixture)), "sft", split="train").select(range(8))
    # The defaults bar bf16 off a GPU: `use_cpu` is this CPU machine's setting, not the data's.
    args = SFTConfig(
        output_dir=str(tmp_path), max_steps=3, max_length=None, use_cpu=True, logging_steps=1, report_to="none"
    )
    trainer = SFTTrainer(model=vlm.model, processing_class=vlm.processor, train_dataset=train, args=args)
    trainer.train()
    assert len(_losses(trainer)) == 3


def test_plain_trainer_with_trls_vision_collator(gemex_sft, tmp_path):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    train = load_dataset(str(gemex_sft), "sft", split="train").select(range(8))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        logging_steps=1,
        report_to="none",
        remove_unused_columns=False,
        per_device_train_batch_size=4,
        use_cpu=True,
    )
    trainer = Trainer(
        model=vlm.model,
        args=args,
        train_dataset=train,
        data_collator=DataCollatorForVisionLanguageModeling(vlm.processor),
    )
    trainer.train()
    assert len(_losses(trainer)) == 3
