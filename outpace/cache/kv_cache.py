"""The paged KV tensors of one model, bound to its attention layers."""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.cache.block_pool import BlockPool


def bind_kv_cache(model: nn.Module, pool: BlockPool, dtype: torch.dtype,
                  device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Allocate [num_blocks + 1, block_size, kv_heads, head_dim] k and v tensors for every Attention
    module of ``model`` (in module order) and bind them; returns the list of (k, v).

    The extra block, ``pool.padding_block``, belongs to no request: padded rows of a CUDA-graph
    replay write their KV there.
    """
    caches = []
    for module in model.modules():
        if isinstance(module, Attention):
            shape = (pool.num_blocks + 1, pool.block_size, module.num_kv_heads, module.head_dim)
            module.kv_cache = (torch.zeros(shape, dtype=dtype, device=device),
                               torch.zeros(shape, dtype=dtype, device=device))
            caches.append(module.kv_cache)
    return caches
