"""The paged KV tensors of one model, bound to its attention layers."""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention.layer import PagedCacheLayer
from outpace.cache.block_pool import BlockPool


def bind_kv_cache(model: nn.Module, pool: BlockPool, dtype: torch.dtype,
                  device: torch.device | str) -> list[tuple[torch.Tensor, ...]]:
    """Allocate and bind the cache of every ``PagedCacheLayer`` of ``model`` (in module order), each layer's
    tensors shaped [num_blocks + 1, block_size, ...] in the layout it declares (``Attention``: k and v
    [.., kv_heads, head_dim]; MLA: a latent view and a rope view of one row per token); returns the list
    of each layer's tensors.

    The extra block, ``pool.padding_block``, belongs to no request: padded rows of a CUDA-graph
    replay write their KV there.
    """
    return [module.bind_cache(pool.num_blocks + 1, pool.block_size, dtype, device)
            for module in model.modules() if isinstance(module, PagedCacheLayer)]
