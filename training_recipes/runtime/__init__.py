"""The run machinery under the recipes: trusted checkpoints and exact resume, preemption, the launcher,
the trainer, attention kernels, the vision tower, processors and the splits a run reads."""
