"""Batches of rows of like length: each row's token count, taken from its text and stored image
sizes without decoding an image, agrees with TRL's collator; the SFT recipe groups batches by it
by default and they carry less padding than random batches; the throughput benchmark's speed-up
flags (grouping, regional compilation, Liger) run, or fail clearly, on CPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from datasets import load_dataset  # noqa: E402
from transformers.trainer_pt_utils import LengthGroupedSampler  # noqa: E402
from trl import ModelConfig  # noqa: E402

from builders.assembly.settings import BuildSettings  # noqa: E402
from rexvqa_dataset.build import build_rexvqa  # noqa: E402
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa  # noqa: E402
from training_recipes import data, generate, sft  # noqa: E402

from . import tiny_builds, tiny_models  # noqa: E402
from .test_recipes import sft_config, training_collator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONVERSATION_TOKENS = 300
"""Conversation rows short enough for the tiny models' 2,048 positions."""
REXVQA_SIZE = 336
"""144 tokens an image at the pixel budget: a study's 1-4 images, not its text, set its length, as at full size."""


@pytest.fixture(scope="module")
def built(gemex_embed_112, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grouping")
    release = generate_rexvqa(root / "release", num_studies=16, seed=5)
    build_rexvqa(
        BuildSettings(
            source=release.root,
            out=root / "rexvqa",
            image_mode="embed",
            image_size=REXVQA_SIZE,
            conversation_tokens=CONVERSATION_TOKENS,
        )
    )
    return {"gemex": gemex_embed_112, "rexvqa": root / "rexvqa"}


def padding_share(batches) -> float:
    masks = [batch["attention_mask"] for batch in batches]
    return 1 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)


@pytest.mark.parametrize(
    "dataset,config", [("gemex", "sft"), ("gemex", "sft_per_image"), ("rexvqa", "sft"), ("rexvqa", "sft_per_study")]
)
def test_token_counts_without_decoding_agree_with_the_collator(built, dataset, config):
    vlm = tiny_models.tiny_qwen2_5_vl()
    settings = data.settings_for("qwen2_5_vl", vlm.processor)
    split = load_dataset(str(built[dataset]), config, split="train")
    split = split.select(range(min(10, len(split))))
    counted = data.sequence_lengths(split, settings, vlm.processor)
    collator, examples = training_collator(vlm.processor), data.conversational(split, settings)
    collated = [int(collator([examples[i]])["attention_mask"].sum()) for i in range(len(split))]
    ratios = [c / r for c, r in zip(counted, collated)]
    assert ratios == [1.0] * len(split)


def test_a_split_without_image_sizes_is_not_counted_and_generation_keeps_its_order(tmp_path):
    """A split built before the size columns existed: counting fails naming the columns (decoding
    every image instead would be silent and slow), generation warns and asks in split order."""
    vlm = tiny_models.tiny_qwen2_5_vl()
    settings = data.settings_for("qwen2_5_vl", vlm.processor)
    split = tiny_builds.load_built(tiny_builds.built_rexvqa(tmp_path / "rexvqa", n=4))
    split = split.remove_columns(["image_widths", "image_heights"])
    with pytest.raises(ValueError, match="no image_widths / image_heights column"):
        data.sequence_lengths(split, settings, vlm.processor)
    output = tmp_path / "predictions.jsonl"
    with pytest.warns(UserWarning, match="split order: the split has no image_widths / image_heights"):
        assert generate.generate_predictions(vlm.model, vlm.processor, split, output, 2, 2) == 4
    asked = [json.loads(line)["question_id"] for line in output.read_text().splitlines()]
    assert asked == list(split["question_id"])


def test_the_recipe_groups_batches_by_length_by_default(tmp_path):
    _, training_args, _ = sft.make_parser().parse_args_and_config(
        args=[
            "--model_name_or_path",
            "unused",
            "--output_dir",
            str(tmp_path),
            "--rexvqa_path",
            "unused",
            "--use_cpu",
            "--bf16",
            "false",
        ]
    )
    assert training_args.train_sampling_strategy == "group_by_length"


def trained(built: Path, tmp_path: Path, strategy: str):
    vlm = tiny_models.tiny_qwen2_5_vl()
    args = sft_config(tmp_path / strategy, max_steps=1, per_device_train_batch_size=4, train_sampling_strategy=strategy)
    return sft.train(
        sft.DataArguments(rexvqa_path=str(built)), args, ModelConfig(), model=vlm.model, processor=vlm.processor
    )


def test_grouped_batches_carry_less_padding_than_random_ones(built, tmp_path):
    grouped = trained(built["rexvqa"], tmp_path, "group_by_length")
    sampler = grouped._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler)
    split = load_dataset(str(built["rexvqa"]), split="train")
    assert sampler.lengths == data.sequence_lengths(
        split, data.settings_for("qwen2_5_vl", grouped.processing_class), grouped.processing_class
    )
    assert max(sampler.lengths) > 1.5 * min(sampler.lengths)  # studies of 1-4 images, as in the release
    random = trained(built["rexvqa"], tmp_path, "random")
    assert not isinstance(random._get_train_sampler(), LengthGroupedSampler)
    grouped_padding = padding_share(grouped.get_train_dataloader())
    random_padding = padding_share(random.get_train_dataloader())
    assert grouped_padding < 0.75 * random_padding, (grouped_padding, random_padding)


def test_a_mixture_streams_in_its_own_order(built, tmp_path):
    vlm = tiny_models.tiny_qwen2_5_vl()
    data_args = sft.DataArguments(gemex_path=str(built["gemex"]), rexvqa_path=str(built["rexvqa"]))
    args = sft_config(tmp_path, max_steps=2, per_device_train_batch_size=2, train_sampling_strategy="group_by_length")
    trainer = sft.train(data_args, args, ModelConfig(), model=vlm.model, processor=vlm.processor)
    assert trainer.lengths == {} and trainer.state.global_step == 2


def throughput(args: list[str], tmp_path: Path) -> dict:
    from benchmarks import train_throughput

    return train_throughput.main(
        [
            "--tiny",
            "--steps",
            "2",
            "--warmup_steps",
            "1",
            "--batch_size",
            "2",
            "--rows",
            "8",
            "--workdir",
            str(tmp_path),
            *args,
        ]
    )


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed")
def test_liger_without_liger_kernel_says_what_to_install(tmp_path):
    with pytest.raises(SystemExit, match="pip install liger-kernel"):
        throughput(["--liger"], tmp_path)


def test_the_token_bills_padding_figure_counts_padded_positions():
    from benchmarks import token_bill

    assert token_bill.padding_share([100] * 50) == 0 == token_bill.padding_share([100] * 50, grouped=True)
    studies = [300 + 600 * images for images in (1, 1, 1, 2, 2, 3, 4)]  # ReXVQA-like: length set by the image count
    random, grouped = (
        token_bill.padding_share(studies, seeds=1),
        token_bill.padding_share(studies, grouped=True, seeds=1),
    )
    assert 0.25 < random < 0.6 and grouped < 0.05
    assert token_bill.prompt_padding([1, 3, 1, 3], batch_size=2) == pytest.approx(
        {"split order": 1 / 3, "longest first": 0}
    )
