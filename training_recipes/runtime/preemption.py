"""SIGTERM (a preempted cloud GPU, a SLURM job at its limit, `kill`, a container stop, `timeout`)
ends a recipe run in a complete checkpoint and exit status 0.

`Preemption` asks for a checkpoint at the end of the current step and a stop; every process stops
at the same step (`synchronised`). It listens from the start of training to the end of the final
save: a SIGTERM once training is over lets the final save finish, and further SIGTERMs are noted
and ignored, so a save always runs to its end. Python handles signals in the main thread; a process
started by a launcher gets the signal only if the launcher passes it on: `training_recipes.runtime.launch`
(which holds a SIGTERM sent before `listening` starts until it does).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR


def synchronised(flag: bool, device) -> bool:
    """`flag` if any process raised it (all processes then agree on when to stop)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    raised = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(raised, op=torch.distributed.ReduceOp.MAX)
    return bool(raised.item())


class Preemption(TrainerCallback):
    """SIGTERM: a checkpoint at the end of the current step, then a stop; `preempted_at` is that checkpoint."""

    def __init__(self):
        self.signalled = False
        self.preempted_at: Path | None = None

    @contextlib.contextmanager
    def listening(self):
        """SIGTERM handled by this callback while the block runs (training and the final save). SIGTERM is
        unblocked once the handler is in place: `training_recipes.runtime.launch` starts the recipe's processes with
        it blocked, so one sent before this point has waited, pending, and is handled now."""
        previous = signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)

    def on_sigterm(self, signum, frame) -> None:
        if self.signalled:
            print("SIGTERM again: still saving", file=sys.stderr, flush=True)
        self.signalled = True

    def on_step_end(self, args, state, control, **kwargs):
        if synchronised(self.signalled, args.device):
            self.signalled = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.signalled:
            self.preempted_at = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        return control
