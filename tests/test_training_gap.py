"""The pixels reach the model: a reduced learning-signal probe (benchmarks/training_gap.py) trained through
`training_recipes.sft` (its data path, TRL's vision collator, the Idefics3 processor) on the same balanced,
answer-only closed-ended GEMeX rows twice from the same weights with the same seed, once on the images and
once with each image's pixels swapped for another image's (the `shuffled` arm).

What is measured is the trainer's logged training loss, the mean over the completion tokens: the reply
``<answer> Yes. <reason>  <location> []`` and the end of turn, 21 tokens. Every one of them but the answer
is the same in every row and is learned in both arms by step ~60; after that the loss is
the answer token's loss over 21, at chance ln 2 / 21 (about 0.033), and falls below it in the images arm
as the probe reads the answer off the image. The shuffled arm can only memorise rows (so can the images
arm: a permutation moves whole images), which it does more slowly. If the images stop reaching the row
they belong to anywhere between the Parquet column and the model's pixel values, the images arm loses
what sets it apart and the last assertion fails."""

from __future__ import annotations

import math

import datasets
import pytest

from benchmarks.training_gap import GapSettings, logged_losses, measure

pytest.importorskip("trl")

CHANCE = math.log(2) / 21
"""The completion loss of a model that knows the reply's format but not the answer (two answers, 21 tokens)."""


def test_logged_losses_are_the_training_steps_not_the_summary():
    history = [{"loss": 4.0, "step": 1}, {"loss": 2.5, "step": 2}, {"train_loss": 3.2, "train_runtime": 9.0}]
    assert logged_losses(history) == [4.0, 2.5]


@pytest.mark.slow
def test_the_images_arm_trains_to_a_lower_answer_loss_than_the_shuffled_arm(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    settings = GapSettings(seed=0, out=tmp_path)
    gap = measure(settings)
    images, shuffled = gap.images, gap.shuffled
    assert images.rows == shuffled.rows > 100 and images.steps == shuffled.steps == settings.steps
    assert shuffled.tail_loss < 1.25 * CHANCE, f"the reply's format is not learned: {shuffled.tail_loss:.4f}"
    assert images.tail_loss < 0.85 * shuffled.tail_loss, (
        f"completion loss over the last {settings.tail} steps: images {images.tail_loss:.4f}, "
        f"shuffled {shuffled.tail_loss:.4f} (ratio {gap.ratio:.3f}): the pixels do not reach the model"
    )
