"""The attention module models use: owns its layer's KV cache, delegates to the context's backend."""

from __future__ import annotations

import torch
from torch import nn

from outpace.attention.backend import KVCache
from outpace.attention.context import get_forward_context
from outpace.attention.kv_quant import is_fp8, store, unit_scale
from outpace.attention.metadata import PagedAttentionMetadata


class PagedCacheLayer(nn.Module):
    """A module that owns one layer's share of the paged KV pool. ``bind_kv_cache`` (cache/kv_cache.py)
    asks each for its tensors, so every layer declares its own per-token layout (per-head k and v here,
    one latent row for MLA: layers/mla.py).

    An FP8 cache (attention/kv_quant.py) is stored with the layer's float32 scales: ``k_scale`` (and
    ``v_scale`` for a separate v cache), non-persistent buffers at 1.0 unless a checkpoint gives them
    (cache/kv_scales.py): they are not weights, and a checkpoint saved from the model carries none."""

    kv_scale_names: tuple[str, ...] = ("k_scale",)  # the scales the layer's cache is stored with

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

    def register_kv_scales(self) -> None:
        for name in self.kv_scale_names:
            self.register_buffer(name, unit_scale(), persistent=False)

    @property
    def fp8_cache(self) -> bool:
        """Whether the bound cache stores float8 (its readers dequantize with the layer's scales)."""
        return self.kv_cache is not None and is_fp8(self.kv_cache[0].dtype)


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
        self.register_kv_scales()

    kv_scale_names = ("k_scale", "v_scale")

    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k_scale, v_scale) [] float32 for an FP8 cache, None for a cache in the model's dtype."""
        return (self.k_scale, self.v_scale) if self.fp8_cache else None

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """k, v [n, kv_heads, head_dim] into the cache at slot_mapping [n] flat slots (quantized for
        an FP8 cache), without attending."""
        k_cache, v_cache = self.kv_cache
        store(k_cache, slot_mapping, k, self.k_scale)
        store(v_cache, slot_mapping, v, self.v_scale)

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
            q,
            k,
            v,
            self.kv_cache,
            ctx.metadata,
            self.scale,
            self.sliding_window,
            positions,
            self.kv_scales(),
        )
        return out.reshape(out.shape[0], -1)

    def fused_write_target(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(k_cache, v_cache, slot_mapping [num_tokens]) for a kernel that writes this forward's k and v
        into the cache itself, when the backend can then attend over it (``attend_written``); None
        otherwise (no paged cache bound, a backend that writes the cache on its own, or an FP8 cache,
        which the fused projection kernels do not quantize)."""
        ctx = get_forward_context()
        if (
            self.kv_cache is None
            or self.fp8_cache
            or not isinstance(ctx.metadata, PagedAttentionMetadata)
            or not hasattr(ctx.backend, "attend_written")
        ):
            return None
        return (*self.kv_cache, ctx.metadata.slot_mapping)

    def attend_written(
        self,
        q: torch.Tensor,
        positions: torch.Tensor | None = None,
        out_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [num_tokens, heads, head_dim], the new tokens' k and v already in the cache; positions
        [num_tokens] as in ``forward`` -> [num_tokens, heads * head_dim]. ``out_gate``: an output gate's
        logits [num_tokens, heads] or [num_tokens, heads, head_dim], applied as ``sigmoid_gate`` would apply
        it (layers/activation.py) inside the attention's launches (attention/triton_kernels.py)."""
        ctx = get_forward_context()
        out = ctx.backend.attend_written(
            q,
            self.kv_cache,
            ctx.metadata,
            self.scale,
            self.sliding_window,
            positions,
            self.kv_scales(),
            out_gate,
        )
        return out.reshape(out.shape[0], -1)
