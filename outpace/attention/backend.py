"""The attention backend interface."""

from __future__ import annotations

from typing import Protocol

import torch

from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata

KVCache = tuple[
    torch.Tensor, torch.Tensor
]  # ([num_blocks, block_size, kv_heads, head_dim]) x (k, v)
KVScales = tuple[torch.Tensor, torch.Tensor]  # (k_scale, v_scale), [] float32 each: an FP8 cache's


class AttentionBackend(Protocol):
    name: str

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: KVCache | None,
        metadata: PagedAttentionMetadata | DenseCausalMetadata,
        scale: float,
        sliding_window: int | None = None,
        positions: torch.Tensor
        | None = None,  # [num_tokens]: the queries' positions (paged, sliding window)
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Write the new tokens' k/v into ``kv_cache`` (paged) and attend; with ``sliding_window``, a
        query at position p sees only keys at positions above p - sliding_window. An FP8 cache comes
        with its ``kv_scales``: written quantized and read dequantized (attention/kv_quant.py)."""
        ...
