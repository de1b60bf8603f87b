"""The paged KV tensors of one model, bound to its attention layers."""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention.layer import Attention


def bind_kv_cache(model: nn.Module, num_blocks: int, block_size: int, dtype: torch.dtype,
                  device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Allocate [num_blocks, block_size, kv_heads, head_dim] k and v tensors for every Attention
    module of ``model`` (in module order) and bind them; returns the list of (k, v)."""
    caches = []
    for module in model.modules():
        if isinstance(module, Attention):
            shape = (num_blocks, block_size, module.num_kv_heads, module.head_dim)
            module.kv_cache = (torch.zeros(shape, dtype=dtype, device=device),
                               torch.zeros(shape, dtype=dtype, device=device))
            caches.append(module.kv_cache)
    return caches
