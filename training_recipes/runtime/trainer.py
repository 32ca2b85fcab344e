"""The recipe's SFTTrainer: length-grouped batches from stored sizes, streams read by a stateful
loader, checkpoint weights read the way `from_pretrained` reads them.

Each private Trainer hook it overrides or calls is listed in `PRIVATE_TRAINER_HOOKS` with the
signature it was written against (`tests/test_trainer_hooks.py` fails when the installed one
differs); each has no public counterpart in transformers 5 / TRL 1:
`_build_accelerator_args` (the Trainer exposes no `use_stateful_dataloader`), `_get_train_sampler` /
`_get_eval_sampler` (no sampler argument), `_load_from_checkpoint` (the key renames of
`from_pretrained`), `_load_rng_state` (restored by the Trainer only when it skips batches).
"""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import IterableDataset
from safetensors import safe_open
from transformers import PreTrainedModel
from transformers.trainer_pt_utils import LengthGroupedSampler
from trl import SFTTrainer

from training_recipes.runtime.attention_kernels import flash_first
from training_recipes.runtime.checkpoints import STREAM_STATE

PRIVATE_TRAINER_HOOKS: dict[str, str] = {
    "_build_accelerator_args": "(self, **kwargs) -> dict[str, typing.Any]",
    "_load_from_checkpoint": "(self, resume_from_checkpoint: str, model: torch.nn.modules.module.Module | None = None) -> None",
    "_get_train_sampler": "(self, train_dataset: torch.utils.data.dataset.Dataset | None = None) -> torch.utils.data.sampler.Sampler | None",
    "_get_eval_sampler": "(self, eval_dataset: torch.utils.data.dataset.Dataset) -> torch.utils.data.sampler.Sampler | None",
    "_load_rng_state": "(self, checkpoint: str | None) -> None",
}
"""The Trainer's private methods `LengthGroupedSFTTrainer` overrides or calls, as `inspect.signature` prints them."""


def require_stateful_loader() -> None:
    """A stream is read only by torchdata's loader: say so before accelerate fails inside `prepare`."""
    try:
        import torchdata.stateful_dataloader  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "training on a stream (interleaved datasets, --streaming) reads it through torchdata's StatefulDataLoader,"
            " which resumes a run where it stopped, and torchdata is not installed: pip install 'torchdata>=0.11'"
            " (in the recipes' extra: pip install 'cxr-vqa[train]')"
        ) from err


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
    steps already trained again. Each process reads its own shards of it (`dispatch_batches` off).
    Training and evaluation attend FlashAttention first (`attention_kernels.flash_first`)."""

    def __init__(self, *args, lengths: dict[str, list[int]] | None = None, **kwargs):
        self.lengths = lengths or {}
        self.stream = isinstance(kwargs.get("train_dataset"), IterableDataset)
        self.stream_checkpoint: str | None = None
        train_dataset = kwargs.get("train_dataset")
        if self.stream:
            require_stateful_loader()
            # SFTTrainer reads a first example to see that the rows have images: not a block of the stream
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
        with flash_first():
            return super().train(resume_from_checkpoint, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        with flash_first():
            return super().evaluate(*args, **kwargs)

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
            state = torch.load(saved, weights_only=False)
            dataloader.load_state_dict(state)
            self._load_rng_state(self.stream_checkpoint)  # the Trainer restores it only when it skips batches
            epoch = saved_stream_epoch(state)
            if epoch is not None:
                resume_in_saved_epoch(dataloader, epoch)
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


def saved_stream_epoch(state: dict) -> int | None:
    """The stream's epoch in a `StatefulDataLoader` state (its `datasets` state, or a worker's)."""
    if isinstance(state.get("dataset_state"), dict) and "epoch" in state["dataset_state"]:
        return int(state["dataset_state"]["epoch"])
    for value in state.values():
        if isinstance(value, dict) and (epoch := saved_stream_epoch(value)) is not None:
            return epoch
    return None


def resume_in_saved_epoch(dataloader, saved_epoch: int) -> None:
    """Shift the epochs set on a resumed stream so that the first is the saved one.

    With `max_steps`, the Trainer counts a stream's epochs as `global_step // max_steps` (0 before the
    end) and sets that on the loader, which passes it to the stream; a stream that has wrapped around
    is in a later pass, and `datasets` drops a saved state whose epoch differs from the stream's: the
    run would start the stream again from its first row. The shift is on the stream's `set_epoch`
    (the loader sets the same epoch on it more than once)."""
    dataset = dataloader.dataset
    set_epoch, offset = dataset.set_epoch, []

    def shifted(epoch: int) -> None:
        if not offset:
            offset.append(saved_epoch - epoch)
        set_epoch(epoch + offset[0])

    dataset.set_epoch = shifted
