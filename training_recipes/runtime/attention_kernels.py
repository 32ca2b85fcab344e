"""Which kernel `scaled_dot_product_attention` runs on a GPU: FlashAttention first, cuDNN's after.

PyTorch's recent releases try cuDNN's attention first on Hopper and Blackwell GPUs (torch 2.11 did on the
H100 the GPU kit ran on). cuDNN builds an execution plan for each new shape it meets: 45-70 ms
of host time while the GPU waits. The recipes' batches bring new shapes at every step: rows of like
length, not of one length; each image at its own size within the pixel budget; the vision tower's chunks
stacked by length. On an H100 a full fine-tuning step of Qwen2.5-VL-3B at batch 8 spent 1.2 s of its
2.7 s in 21 such plan builds, the GPU idle throughout (benchmarks/README.md, B.1, the third H100 run).
FlashAttention, and the memory-efficient kernel where a padding mask rules FlashAttention out, build
nothing per shape; cuDNN stays as the fallback for a shape neither takes, the math kernel last.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

FLASH_FIRST = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
)
"""The order the recipes' attention calls try the kernels in."""


def flash_first() -> AbstractContextManager:
    """Attention calls inside try the kernels in `FLASH_FIRST`'s order. The order is the process's (the
    backward pass's thread reads it too), and the previous one comes back on leaving."""
    return sdpa_kernel(list(FLASH_FIRST), set_priority=True)
