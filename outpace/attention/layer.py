"""The attention module models use: owns its layer's KV cache, delegates to the context's backend."""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention.backend import KVCache
from outpace.attention.context import get_forward_context
from outpace.attention.metadata import PagedAttentionMetadata


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: int | None = None) -> None:
        """``sliding_window``: a query at position p sees only keys at positions above p - sliding_window
        (None: every earlier key). Keys older than the window stay in the paged cache, masked, not freed."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sliding_window = sliding_window
        self.scale = head_dim ** -0.5
        self.kv_cache: KVCache | None = None  # bound by the engine when it allocates the pool

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """q [num_tokens, heads, head_dim]; k, v [num_tokens, kv_heads, head_dim]; positions [num_tokens]
        (needed with a sliding window) -> [num_tokens, heads * head_dim]."""
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, self.kv_cache, ctx.metadata, self.scale, self.sliding_window, positions)
        return out.reshape(out.shape[0], -1)

    def fused_write_target(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(k_cache, v_cache, slot_mapping [num_tokens]) for a kernel that writes this forward's k and v
        into the cache itself, when the backend can then attend over it (``attend_written``); None
        otherwise (no paged cache bound, or a backend that writes the cache on its own)."""
        ctx = get_forward_context()
        if self.kv_cache is None or not isinstance(ctx.metadata, PagedAttentionMetadata) \
                or not hasattr(ctx.backend, "attend_written"):
            return None
        return (*self.kv_cache, ctx.metadata.slot_mapping)

    def attend_written(self, q: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """q [num_tokens, heads, head_dim], the new tokens' k and v already in the cache; positions
        [num_tokens] as in ``forward`` -> [num_tokens, heads * head_dim]."""
        ctx = get_forward_context()
        out = ctx.backend.attend_written(q, self.kv_cache, ctx.metadata, self.scale, self.sliding_window, positions)
        return out.reshape(out.shape[0], -1)
