"""The attention backend interface."""
from __future__ import annotations

from typing import Protocol

import torch

from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata

KVCache = tuple[torch.Tensor, torch.Tensor]  # ([num_blocks, block_size, kv_heads, head_dim]) x (k, v)


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
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Write the new tokens' k/v into ``kv_cache`` (paged) and attend."""
        ...
