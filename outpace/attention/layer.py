"""The attention module models use: owns its layer's KV cache, delegates to the context's backend."""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention.backend import KVCache
from outpace.attention.context import get_forward_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.kv_cache: KVCache | None = None  # bound by the engine when it allocates the pool

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [num_tokens, heads, head_dim]; k, v [num_tokens, kv_heads, head_dim] -> [num_tokens, heads * head_dim]."""
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, self.kv_cache, ctx.metadata, self.scale)
        return out.reshape(out.shape[0], -1)
