"""Streams that resume anywhere: a streamed run resumed from a checkpoint taken in its second pass
over the rows goes on with that pass's next rows and ends with the weights of an uninterrupted run
(largest difference <= 1e-6). Tiny Gemma 3 on CPU; 8 rows, 4 micro-batches a pass."""

from __future__ import annotations

from itertools import chain
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("torchdata")
pytestmark = pytest.mark.slow

from . import row_recorder, tiny_models  # noqa: E402
from .test_checkpoint_trust import command, largest_difference  # noqa: E402
from .test_resume import recorded_run  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_models.save_tiny_vlm("gemma3", tmp_path_factory.mktemp("stream-model"))


def test_a_stream_resumed_in_its_second_pass_goes_on_with_that_pass(
    gemex_embed_112, model, tmp_path, monkeypatch, capsys
):
    def streamed(output_dir: Path, max_steps: int, *extra: str) -> list[str]:
        return command(
            gemex_embed_112, model, output_dir, "1e-2", max_steps, "--streaming", "--save_steps", "6", *extra
        )

    recorded_run(streamed(tmp_path / "whole", 8), tmp_path / "whole-log", monkeypatch)
    recorded_run(streamed(tmp_path / "run", 6), tmp_path / "first-log", monkeypatch)
    resumed = recorded_run(
        streamed(tmp_path / "run", 8, "--resume_from_checkpoint", "auto"), tmp_path / "resumed-log", monkeypatch
    )
    assert f"resume: from {tmp_path / 'run' / 'checkpoint-6'} (step 6)" in capsys.readouterr().err
    # (a loader collates one micro-batch ahead of training: the logs may hold one more than was trained)
    whole = row_recorder.batches(tmp_path / "whole-log")[:8]
    assert sorted(chain(*whole[:4])) == sorted(chain(*whole[4:]))  # two passes over the 8 rows
    assert row_recorder.batches(tmp_path / "first-log")[:6] == whole[:6]
    assert row_recorder.batches(tmp_path / "resumed-log")[:2] == whole[6:]  # the second pass's last two, not its first
    assert resumed.state.global_step == 8
    assert largest_difference(tmp_path / "whole", tmp_path / "run") <= 1e-6


def test_max_train_samples_of_a_stream_are_the_first_rows_whatever_the_loader_workers(
    gemex_embed_112, model, tmp_path, monkeypatch
):
    """`--max_train_samples 6 --streaming --dataloader_num_workers 2` trains the split's first 6 rows,
    as the same command without streaming does (not the first 3 of each worker's shards)."""
    from datasets import load_dataset

    argv = command(gemex_embed_112, model, tmp_path / "run", "1e-2", 3, "--streaming", "--max_train_samples", "6")
    recorded_run([*argv, "--dataloader_num_workers", "2", "--save_strategy", "no"], tmp_path / "log", monkeypatch)
    trained = set(chain(*row_recorder.batches(tmp_path / "log")[:3]))
    first = load_dataset(str(gemex_embed_112), split="train")["question_id"][:6]
    assert trained == set(first)
