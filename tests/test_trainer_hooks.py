"""The private Trainer methods the recipe's trainer overrides or calls still have the signatures it
was written against (`training_recipes.runtime.trainer.PRIVATE_TRAINER_HOOKS`): an upgrade of transformers
or TRL that changes one fails here, not in a run."""

from __future__ import annotations

import inspect
import sys

import pytest

pytest.importorskip("trl")

from trl import SFTTrainer

from training_recipes.runtime.trainer import PRIVATE_TRAINER_HOOKS, LengthGroupedSFTTrainer


@pytest.mark.parametrize("name", sorted(PRIVATE_TRAINER_HOOKS))
def test_private_hook_signature_is_the_one_the_recipe_was_written_against(name):
    assert str(inspect.signature(getattr(SFTTrainer, name))) == PRIVATE_TRAINER_HOOKS[name]


def test_every_private_method_the_trainer_overrides_is_listed():
    overridden = {name for name in vars(LengthGroupedSFTTrainer) if name.startswith("_") and not name.startswith("__")}
    assert overridden <= set(PRIVATE_TRAINER_HOOKS)


def test_a_stream_without_torchdata_stops_at_once_and_says_what_to_install(monkeypatch):
    """accelerate's own error comes only from inside `prepare`, after the model is built and the run has started."""
    from datasets import IterableDataset

    from training_recipes.runtime.trainer import vision_example

    monkeypatch.setitem(sys.modules, "torchdata", None)
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    with pytest.raises(ImportError, match=r"StatefulDataLoader.*pip install 'torchdata>=0.11'"):
        LengthGroupedSFTTrainer(model=None, train_dataset=IterableDataset.from_generator(vision_example))
