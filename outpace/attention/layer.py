"""The attention module models use: owns its layer's KV cache, delegates to the context's backend."""

from __future__ import annotations

import torch
from torch import nn

from outpace.attention.backend import KVCache
from outpace.attention.context import get_forward_context
from outpace.attention.metadata import PagedAttentionMetadata


class PagedCacheLayer(nn.Module):
    """A module that owns one layer's share of the paged KV pool. ``bind_kv_cache`` (cache/kv_cache.py)
    asks each for its tensors, so every layer declares its own per-token layout (per-head k and v here,
    one latent row for MLA: layers/mla.py)."""

    kv_cache: tuple[torch.Tensor, ...] | None = (
        None  # bound by the engine when it allocates the pool
    )

    def bind_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> tuple[torch.Tensor, ...]:
        """Allocate this layer's cache, keep it as ``kv_cache`` and return it: tensors shaped
        [num_blocks, block_size, ...], a token's entry at [block, offset] of each (what the engine's tree
        commit copies rows of)."""
        raise NotImplementedError


class Attention(PagedCacheLayer):
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        sliding_window: int | None = None,
        scale: float | None = None,
    ) -> None:
        """``sliding_window``: a query at position p sees only keys at positions above p - sliding_window
        (None: every earlier key). Keys older than the window stay in the paged cache, masked, not freed.
        ``scale``: what q.k is multiplied by before the softmax (None: head_dim ** -0.5)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sliding_window = sliding_window
        self.scale = head_dim**-0.5 if scale is None else scale
        self.kv_cache: KVCache | None = None  # bound by the engine when it allocates the pool

    def bind_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> KVCache:
        """k and v, [num_blocks, block_size, kv_heads, head_dim] each."""
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        self.kv_cache = (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        return self.kv_cache

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [num_tokens, heads, head_dim]; k, v [num_tokens, kv_heads, head_dim]; positions [num_tokens]
        (needed with a sliding window) -> [num_tokens, heads * head_dim]."""
        ctx = get_forward_context()
        out = ctx.backend.forward(
            q, k, v, self.kv_cache, ctx.metadata, self.scale, self.sliding_window, positions
        )
        return out.reshape(out.shape[0], -1)

    def fused_write_target(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(k_cache, v_cache, slot_mapping [num_tokens]) for a kernel that writes this forward's k and v
        into the cache itself, when the backend can then attend over it (``attend_written``); None
        otherwise (no paged cache bound, or a backend that writes the cache on its own)."""
        ctx = get_forward_context()
        if (
            self.kv_cache is None
            or not isinstance(ctx.metadata, PagedAttentionMetadata)
            or not hasattr(ctx.backend, "attend_written")
        ):
            return None
        return (*self.kv_cache, ctx.metadata.slot_mapping)

    def attend_written(
        self, q: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q [num_tokens, heads, head_dim], the new tokens' k and v already in the cache; positions
        [num_tokens] as in ``forward`` -> [num_tokens, heads * head_dim]."""
        ctx = get_forward_context()
        out = ctx.backend.attend_written(
            q, self.kv_cache, ctx.metadata, self.scale, self.sliding_window, positions
        )
        return out.reshape(out.shape[0], -1)
