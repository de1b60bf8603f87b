"""Paged attention in Triton (CUDA; also runs in Triton's interpreter on the CPU, for tests).

A drop-in replacement for the torch backend's paged path with the same semantics (causal or tree
mask, sliding window, GQA, any block size and head_dim), without materialising the gathered KV or the mask, and
capturable in a CUDA graph: see triton_kernels.py for the kernels and their grid. An FP8 cache is
written quantized and read in place, its layer's scales folded into the kernels (attention/kv_quant.py). Training's
dense causal attention is delegated to the torch backend. In batch-invariant mode
(EngineConfig.batch_invariant) ``paged_attention`` runs the kernels' batch-invariant variant, which
gives a row the same bits in a decode step and in a verify forward (invariant_attention.py says why).
"""

from __future__ import annotations

import torch

from outpace.attention.backend import KVCache, KVScales
from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata
from outpace.attention.torch_backend import TorchAttentionBackend
from outpace.attention.triton_kernels import paged_attention, write_kv


class TritonAttentionBackend:
    name = "triton"

    def __init__(self) -> None:
        self._dense = TorchAttentionBackend()

    def forward(
        self,
        q,
        k,
        v,
        kv_cache: KVCache | None,
        metadata: PagedAttentionMetadata | DenseCausalMetadata,
        scale: float,
        sliding_window: int | None = None,
        positions: torch.Tensor | None = None,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        if isinstance(metadata, DenseCausalMetadata):
            return self._dense.forward(q, k, v, kv_cache, metadata, scale, sliding_window)
        k_cache, v_cache = kv_cache
        token_table = write_kv(k, v, k_cache, v_cache, metadata, kv_scales)
        return paged_attention(
            q,
            k_cache,
            v_cache,
            metadata,
            token_table,
            scale,
            sliding_window=sliding_window,
            positions=positions,
            kv_scales=kv_scales,
        )

    def attend_written(
        self,
        q,
        kv_cache: KVCache,
        metadata: PagedAttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        positions: torch.Tensor | None = None,
        kv_scales: KVScales | None = None,
        out_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``forward`` for a batch whose k and v are already in the cache (a fused projection wrote them);
        ``out_gate`` (``paged_attention``'s): the output times sigmoid(out_gate), in the same launches."""
        k_cache, v_cache = kv_cache
        return paged_attention(
            q,
            k_cache,
            v_cache,
            metadata,
            metadata.token_table(),
            scale,
            sliding_window=sliding_window,
            positions=positions,
            kv_scales=kv_scales,
            out_gate=out_gate,
        )
