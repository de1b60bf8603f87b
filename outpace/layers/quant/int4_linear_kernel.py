"""INT4 W4A16 linear products on the GPU: y [M, N] = x [M, K] @ W.T with W kept packed.

compressed-tensors pack-quantized (Kimi-K2-Thinking / K2.5 experts, Gemma 4 QAT): ``weight_packed`` int32
[N, K/8], eight 4-bit values a word, value j in bits 4j..4j+3 and stored + 8; ``weight_scale`` [N,
K/group] (bf16), symmetric: W = (nibble - 8) * scale (quant/dequantize.py ``dequantize_int4_group`` has
the math and cites compressed-tensors). Every row count goes through quant_matmul_kernel.py: the nibbles
are unpacked and scaled in registers into x's dtype (few rows: the weight-streaming launch; prefill: 64
or 128-row tiles of the same kernel, a W4A16 GEMM).
"""

from __future__ import annotations

import torch

from outpace.layers.quant.quant_matmul_kernel import quant_matmul
from outpace.layers.quant.weight_tiles import INT4_PACK


def int4_group_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group: int = 32
) -> torch.Tensor:
    """x [..., K] @ W.T, W given by ``packed`` int32 [N, K/8] and ``scale`` [N, K/group] -> [..., N] in x's
    dtype. ``group`` a power of two >= 8."""
    n, words = packed.shape
    k = x.shape[-1]
    if packed.dtype != torch.int32 or packed.stride(1) != 1:
        raise ValueError(f"weight_packed must be int32 with contiguous rows, got {packed.dtype}")
    if group < INT4_PACK or group & (group - 1):
        raise ValueError(
            f"the INT4 kernels take groups of a power of two >= 8 columns, not {group}"
        )
    if k % group or words * INT4_PACK != k:
        raise ValueError(
            f"x has {k} columns: weight_packed [{n}, {words}] holds {words * INT4_PACK}, and they must "
            f"be a multiple of the group ({group})"
        )
    if tuple(scale.shape) != (n, k // group):
        raise ValueError(
            f"weight_scale of shape {tuple(scale.shape)} does not fit a weight of [{n}, {k}] in groups "
            f"of {group} (expected [{n}, {k // group}])"
        )
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or float32, got {x.dtype}")
    out = quant_matmul(x.reshape(-1, k), packed, scale, "int4_group", (1, group))
    return out.reshape(*x.shape[:-1], n)
