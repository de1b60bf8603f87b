"""The batch-invariant matrix product of linear layers on the GPU (the deterministic mode).

cuBLAS picks its kernel (tile shapes, split-K) by the problem's shape, so one row of ``x @ w.T`` can
round differently when it is computed among 1 row (decode) or among 6 (a verify forward over a draft
chain), and greedy speculative output can then drift from plain decoding in bf16. In this mode every
product, whatever its row count, runs the few-row kernel of the normal decode path
(layers/skinny_gemm.py): 16-row tiles, each its own ``tl.dot`` walking K in one fixed order with no
split-K, and tiles chosen from N and K alone. A row's bits thus depend only on its own input row,
and a decode step costs what it costs on the normal path; only the products of more than 16 rows
(verify batches, prefill) pay for the fixed tiling, against cuBLAS's.

The fused decoder layers (layers/fused_decoder.py) serve this mode too, at any row count: their
projection kernels (layers/fused_projection.py) follow the same rule (16-row tiles on a grid axis of
their own, tiles chosen from N and K alone), so a layer runs as the normal decode path's few launches
rather than one launch a projection and the element-wise kernels between them.
"""

from __future__ import annotations

import torch

from outpace.layers.skinny_gemm import skinny_linear


def batch_invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N] in x's dtype, float32 accumulation."""
    lead, k = x.shape[:-1], x.shape[-1]
    out = skinny_linear(x.reshape(-1, k), weight.contiguous(), bias=bias)  # [M, N]
    return out.reshape(*lead, weight.shape[0])
