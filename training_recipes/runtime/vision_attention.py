"""The Qwen-VL vision towers' attention in a few calls a layer, not one per window.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers attend within chunks of their patch sequence:
each image, and in Qwen2.5-VL each 112-px window of it. Under `attn_implementation="sdpa"`
transformers attends to the chunks one at a time, a kernel launch each: about 19,000 launches
in one training step of Qwen2.5-VL-3B at batch 8 within the recipes' pixel budget, which kept an
H100 busy 1.4 s of a 4.1 s step (benchmarks/README.md, B.1). The towers hand the chunk bounds
(`cu_seqlens`) to an attention function only when its name says "flash" (as flash-attn's varlen
kernels take them); `CHUNKED_SDPA` is such a name, for `chunked_sdpa`: the chunks of each length
stacked into one batch and attended by one `scaled_dot_product_attention` call, so a layer makes as
many calls as it has distinct chunk lengths (a few), with the same result.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch.nn import functional
from transformers import AttentionInterface

CHUNKED_SDPA = "sdpa_chunks_flash_varlen"
"""The vision towers pass `cu_seqlens` only to an implementation whose name holds "flash"."""

CHUNKED_TOWERS = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})
"""Model types whose vision attention takes `cu_seqlens` as Qwen2.5-VL's does (transformers 5)."""


def chunked_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention within each chunk `cu_seq_lens_q` bounds, for (1, heads, tokens, head_dim) inputs;
    returns (1, tokens, heads, head_dim) as transformers' attention functions do."""
    if cu_seq_lens_q is None:
        raise ValueError(f"{CHUNKED_SDPA} attends within chunks and needs cu_seq_lens_q (a Qwen-VL vision tower's)")
    bounds = cu_seq_lens_q.tolist()
    by_length: dict[int, list[int]] = {}
    for start, end in pairwise(bounds):
        by_length.setdefault(end - start, []).append(start)
    positions, outputs = [], []
    for length, starts in by_length.items():
        index = (
            torch.tensor(starts, device=query.device)[:, None] + torch.arange(length, device=query.device)
        ).flatten()
        stacked = [
            t[0].index_select(1, index).unflatten(1, (len(starts), length)).transpose(0, 1) for t in (query, key, value)
        ]
        attended = functional.scaled_dot_product_attention(*stacked, dropout_p=dropout, scale=scaling)
        outputs.append(attended.transpose(1, 2).flatten(0, 1))  # (chunks * length, heads, head_dim)
        positions.append(index)
    order = torch.cat(positions)
    output = torch.cat(outputs).index_select(0, torch.argsort(order))
    return output.unsqueeze(0), None


AttentionInterface.register(CHUNKED_SDPA, chunked_sdpa)


def use_chunked_vision_attention(model: torch.nn.Module) -> bool:
    """Switch a Qwen-VL model's vision tower from per-chunk sdpa to `chunked_sdpa`; any other model,
    or a tower on another implementation (flash-attn, eager), is left as it is. Says whether it switched.

    Only the in-memory config changes: a checkpoint saved afterwards names no implementation."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    if getattr(config, "model_type", None) not in CHUNKED_TOWERS or vision is None:
        return False
    if vision._attn_implementation != "sdpa":
        return False
    vision._attn_implementation = CHUNKED_SDPA
    return True
