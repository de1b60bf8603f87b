"""The paged KV tensors of one model, bound to its attention layers."""

from __future__ import annotations

import torch
from torch import nn

from outpace.attention.kv_quant import is_fp8
from outpace.attention.layer import PagedCacheLayer
from outpace.cache.block_pool import BlockPool
from outpace.validation import ConfigError


def bind_kv_cache(
    model: nn.Module, pool: BlockPool, dtype: torch.dtype, device: torch.device | str
) -> list[tuple[torch.Tensor, ...]]:
    """Allocate and bind the cache of every ``PagedCacheLayer`` of ``model`` (in module order), each layer's
    tensors shaped [num_blocks + 1, block_size, ...] in the layout it declares (``Attention``: k and v
    [.., kv_heads, head_dim]; MLA: a latent view and a rope view of one row per token); returns the list
    of each layer's tensors. The pool remembers the binding, so ``rebind_kv_caches`` can reallocate it.

    Block 0, ``pool.padding_block``, belongs to no request: padded rows of a CUDA-graph replay write their
    KV there. ``dtype`` float8_e4m3fn makes an FP8 cache (attention/kv_quant.py): the layers then store
    and read it with their scales (cache/kv_scales.py loads a checkpoint's).
    """
    try:
        caches = [
            module.bind_cache(pool.num_blocks + 1, pool.block_size, dtype, device)
            for module in model.modules()
            if isinstance(module, PagedCacheLayer)
        ]
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not isinstance(e, torch.OutOfMemoryError) and "allocate" not in str(e):
            raise
        raise ConfigError(
            f"a KV cache of {pool.num_blocks} blocks of {pool.block_size} tokens does not fit the memory of "
            f"device {str(device)!r} ({str(e).splitlines()[0]}): lower EngineConfig.num_kv_blocks "
            "(--num-kv-blocks) or block_size, or where the pool is sized from memory its memory utilization"
        ) from None
    pool._bound.append((model, dtype, device))
    return caches


def bound_caches(model: nn.Module) -> list[tuple[torch.Tensor, ...]]:
    """The cache tensors bound to each ``PagedCacheLayer`` of ``model``, in module order."""
    return [module.kv_cache for module in model.modules() if isinstance(module, PagedCacheLayer)]


def rebind_kv_caches(pool: BlockPool) -> None:
    """Reallocate every cache bound to ``pool`` at its (new) size."""
    bound, pool._bound = pool._bound, []
    for model, dtype, device in bound:
        bind_kv_cache(model, pool, dtype, device)


def pool_cache_tensors(pool: BlockPool) -> list[torch.Tensor]:
    """Every cache tensor bound to ``pool``, model by model in binding order."""
    return [t for model, _, _ in pool._bound for layer in bound_caches(model) for t in layer]


def bound_dtypes(pool: BlockPool) -> str:
    """The dtypes of the caches bound to ``pool``, in binding order ("float8_e4m3fn, bfloat16")."""
    names = (str(dtype).removeprefix("torch.") for _, dtype, _ in pool._bound)
    return ", ".join(dict.fromkeys(names))


def kv_cache_bytes(pool: BlockPool) -> int:
    """Bytes of every cache bound to ``pool`` (the padding block included)."""
    return sum(t.numel() * t.element_size() for t in pool_cache_tensors(pool))


class CacheRows:
    """Moves token rows inside every cache tensor of a model at once: what a tree commit does to the target's
    KV (engine/decode_step.py). ``move(src, dst)``, both [b, width] flat token rows (block * block_size +
    offset): for each request r and column i >= 1, row dst[r, i] of every tensor receives row src[r, i].

    On CUDA one Triton launch serves every tensor (cache/row_move_kernel.py), copying each request's
    columns in order, in place. That is safe under the commit's invariant: a column's source is never a
    row an earlier column wrote (the accepted path's node indices grow faster than its depths, so
    src[r, j] >= dst[r, j] > dst[r, i] for i < j). Elsewhere each tensor is gathered, then scattered."""

    def __init__(self, caches: list[tuple[torch.Tensor, ...]], fused: bool | None = None) -> None:
        """``fused``: use the Triton kernel (None: on CUDA)."""
        self.tensors = [t for layer in caches for t in layer]
        self.fused = bool(self.tensors) and (
            self.tensors[0].device.type == "cuda" if fused is None else fused
        )
        if self.fused:
            for t in self.tensors:  # each token row: contiguous bytes, rows a fixed stride apart
                assert t.stride(0) == t.shape[1] * t.stride(1) and t[0, 0].is_contiguous(), t.shape
            size = self.tensors[0].element_size()
            device = self.tensors[0].device
            self.bases = torch.tensor(
                [t.data_ptr() for t in self.tensors], dtype=torch.int64, device=device
            )
            self.row_strides = torch.tensor(
                [t.stride(1) * size for t in self.tensors], dtype=torch.int64, device=device
            )
            sizes = [t[0, 0].numel() * t.element_size() for t in self.tensors]
            self.row_bytes = torch.tensor(sizes, dtype=torch.int64, device=device)
            self.max_row_bytes = max(sizes)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if self.fused:
            from outpace.cache.row_move_kernel import move_rows_all  # Triton: only where a GPU runs

            move_rows_all(
                self.bases, self.row_strides, self.row_bytes, self.max_row_bytes, src, dst
            )
            return
        src, dst = src.reshape(-1), dst.reshape(-1)
        for cache in self.tensors:
            flat = cache.view(-1, *cache.shape[2:])
            if is_fp8(flat.dtype):  # (torch has no float8 index_copy_ on the CPU: moved as bytes)
                flat = flat.view(torch.uint8)
            flat.index_copy_(0, dst, flat.index_select(0, src))
