"""Linear projections.

Tensor parallelism will add column- and row-parallel variants here with the same constructor
signature, so models never change when TP arrives.

Batch-invariant mode (a setting of the forward context: attention/context.py, from
EngineConfig.batch_invariant): every projection on a CUDA tensor goes through
``batch_invariant_linear``, whose result for a row does not depend on how many rows share the
call, so a verify forward and a decode step produce the same bits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from outpace.attention.context import batch_invariant


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] -> [..., out]. On CUDA: the batch-invariant kernel in that mode; a Triton kernel
    that streams the weights once for few rows (bf16/fp16 decode and small verify batches, where it
    beats cuBLAS's GEMV: layers/skinny_gemm.py); F.linear otherwise."""
    if x.is_cuda and batch_invariant():
        from outpace.layers.batch_invariant import batch_invariant_linear

        return batch_invariant_linear(x, weight, bias)
    if x.is_cuda:
        from outpace.layers.skinny_gemm import skinny_applies, skinny_linear

        if skinny_applies(x, weight, bias):
            return skinny_linear(x, weight)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias)


def linear(in_features: int, out_features: int, bias: bool = False) -> Linear:
    return Linear(in_features, out_features, bias=bias)
