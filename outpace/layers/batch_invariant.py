"""A batch-invariant matrix product for linear layers (the deterministic mode).

cuBLAS picks its kernel (tile shapes, split-K) by the problem's shape, so one row of
``x @ w.T`` can round differently when it is computed among 1 row (decode) or among 6 (a verify
forward over a draft chain), and greedy speculative output can then drift from plain decoding in
bf16. This kernel always uses the same tiles and walks K in the same order, with no split-K, so
every output row depends only on its own input row: the same bits at any batch size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]): one BM x BN tile per program, K in BK steps."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :],
            mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K),
            other=0.0,
        )  # [BM, BK]
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + (k0 + ks)[:, None],
            mask=(cols[None, :] < N) & ((k0 + ks)[:, None] < K),
            other=0.0,
        )  # [BK, BN]
        if IEEE:  # float32 inputs: full precision, not tf32
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def batch_invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N] in x's dtype, float32 accumulation."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    w = weight.contiguous()
    m, n = x2.shape[0], w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _linear_kernel[grid](
        x2,
        w,
        bias if bias is not None else w,
        out,
        m,
        n,
        k,
        x2.stride(0),
        w.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=BLOCK_K,
    )
    return out.reshape(*lead, n)
