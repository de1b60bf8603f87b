"""A matrix product for few rows (decode and small verify batches): y [M, N] = x [M, K] @ w [N, K].T.

With M <= 16 the product is a pass over the weights; this kernel streams them once, each program
owning BLOCK_N output columns for every row and walking K in BLOCK_K steps (16-byte loads along the
weights' rows, software-pipelined), with no split-K and so no second reduction kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    rows = tl.arange(0, BM)  # [BM]
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        w = tl.load(
            w_ptr + cols[:, None] * stride_wn + (k0 + ks)[None, :],
            mask=(cols[:, None] < N) & ((k0 + ks)[None, :] < K),
            other=0.0,
        )  # [BN, BK]
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :],
            mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K),
            other=0.0,
        )  # [BM, BK]
        acc += tl.dot(x, tl.trans(w))
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def skinny_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``skinny_linear`` serves this product: few rows, half precision, no bias, no autograd."""
    return (
        bias is None
        and x.dim() == 2
        and x.shape[0] <= MAX_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and not torch.is_grad_enabled()
    )


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    block_n: int | None = None,
    block_k: int = 256,
    num_warps: int = 4,
    num_stages: int = 5,
) -> torch.Tensor:
    """x [M, K] (M <= 16, bf16/fp16) @ weight [N, K].T -> [M, N] in x's dtype, float32 accumulation.

    Default tiles: the best of a sweep on the H100 at the Llama-3.1-8B shapes (``python -m
    outpace.bench.skinny``): 64 output columns a program for wide products (the head, gate_up), else 32.
    """
    m, k = x.shape
    n = weight.shape[0]
    if block_n is None:
        block_n = 64 if n >= 16384 else 32
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, block_n),)](
        x,
        weight,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BM=MAX_ROWS,
        BN=block_n,
        BK=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
