"""The batch-invariant projection's matrix product (layers/batch_invariant.py): y [M, N] = x [M, K] @ w [N, K].T,
a row's bits independent of M. (The normal path's few-row projections are layers/fused_projection.py's.)

With M <= 16 the product is a pass over the weights; this kernel streams them once, each program
owning BLOCK_N output columns of a 16-row tile and walking K in BLOCK_K steps (16-byte loads along
the weights' rows, software-pipelined), with no split-K and so no second reduction kernel.

Any M is served: the rows go in tiles of 16 (``ROW_TILE``), ``subtiles`` of them a program (each weight
tile loaded once for all of them), the row-tile groups on the grid's fast axis so that the programs sharing a weight tile run together
and read it from L2. Every 16-row tile is its own ``tl.dot`` of the same [16, BLOCK_K] x [BLOCK_K,
BLOCK_N] shape, accumulated over K in the same order (acc = dot(x, w, acc), K ascending), and BLOCK_N,
BLOCK_K and the warps depend on N alone (``tiles_for``): so a row's bits depend only on its own input
row, whatever M is, where the row sits among the tiles, and how many tiles a program holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # the few-row regime of the normal path's fused projections, and the rows of one tile
ROW_TILE = 16
_WIDE = 16384  # products at least this wide (the head, gate_up) get 64 output columns a program
_SUBTILES_FROM = (
    64  # above this many rows a program holds 4 row tiles (prefill in batch-invariant mode)
)


@triton.jit
def _row_tile_dot(x_ptr, rows, ks, M, K, stride_xm, wt, acc, PRECISION: tl.constexpr):
    """acc [ROW_TILE, BN] + x[rows, ks] @ wt [BK, BN]: one 16-row tile's step along K."""
    x = tl.load(
        x_ptr + rows[:, None] * stride_xm + ks[None, :],
        mask=(rows[:, None] < M) & (ks[None, :] < K),
        other=0.0,
    )  # [ROW_TILE, BK]
    return tl.dot(x, wt, acc, input_precision=PRECISION)


@triton.jit
def _store_tile(out_ptr, b_ptr, rows, cols, M, N, stride_om, acc, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


@triton.jit(do_not_specialize=["M"])
def _skinny_kernel(
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
    stride_xh,  # per head (grid axis 2; 0 for one product)
    stride_wh,
    stride_oh,
    stride_wk,  # along K within a weight row (1 but for a transposed per-head weight)
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SUBTILES: tl.constexpr,  # 1 or 4 row tiles of BM rows a program
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (row-tile group, column block, head): rows [g * SUBTILES * BM, ...) x columns [c * BN, ...) of
    the head's product (the head moves the three pointers; the arithmetic is the same for every head)."""
    head = tl.program_id(2).to(tl.int64)
    x_ptr += head * stride_xh
    w_ptr += head * stride_wh
    out_ptr += head * stride_oh
    rows0 = tl.program_id(0) * (SUBTILES * BM) + tl.arange(0, BM)  # [BM]
    cols = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    acc0 = tl.zeros((BM, BN), dtype=tl.float32)
    acc1 = tl.zeros((BM, BN), dtype=tl.float32)
    acc2 = tl.zeros((BM, BN), dtype=tl.float32)
    acc3 = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        w = tl.load(
            w_ptr + cols[:, None] * stride_wn + ks[None, :] * stride_wk,
            mask=(cols[:, None] < N) & (ks[None, :] < K),
            other=0.0,
        )  # [BN, BK]
        wt = tl.trans(w)  # [BK, BN]
        acc0 = _row_tile_dot(x_ptr, rows0, ks, M, K, stride_xm, wt, acc0, PRECISION)
        if SUBTILES > 1:
            acc1 = _row_tile_dot(x_ptr, rows0 + BM, ks, M, K, stride_xm, wt, acc1, PRECISION)
            acc2 = _row_tile_dot(x_ptr, rows0 + 2 * BM, ks, M, K, stride_xm, wt, acc2, PRECISION)
            acc3 = _row_tile_dot(x_ptr, rows0 + 3 * BM, ks, M, K, stride_xm, wt, acc3, PRECISION)
    _store_tile(out_ptr, b_ptr, rows0, cols, M, N, stride_om, acc0, HAS_BIAS)
    if SUBTILES > 1:
        _store_tile(out_ptr, b_ptr, rows0 + BM, cols, M, N, stride_om, acc1, HAS_BIAS)
        _store_tile(out_ptr, b_ptr, rows0 + 2 * BM, cols, M, N, stride_om, acc2, HAS_BIAS)
        _store_tile(out_ptr, b_ptr, rows0 + 3 * BM, cols, M, N, stride_om, acc3, HAS_BIAS)


@dataclass(frozen=True)
class SkinnyTiles:
    """What a product's launch is made of. Only ``subtiles`` and ``row_groups`` depend on M, and
    neither changes a row's arithmetic (module docstring)."""

    block_m: int  # rows of one tile: always ROW_TILE
    block_n: int
    block_k: int
    num_warps: int
    subtiles: int  # row tiles a program
    row_groups: int  # programs along the rows (grid axis 0)
    col_blocks: int  # programs along the columns (grid axis 1)
    num_stages: int


def tiles_for(m: int, n: int, block_n: int | None = None, block_k: int = 256) -> SkinnyTiles:
    """The launch of an [m, K] @ [n, K].T product. Default tiles: the best of a sweep on the H100 at
    the Llama-3.1-8B shapes (``python -m outpace.bench.skinny``): 64 output columns a program for wide
    products (the head, gate_up), else 32; 5 pipeline stages for one row tile a program, 3 for four
    (their input tiles share the shared memory)."""
    block_n = block_n or (64 if n >= _WIDE else 32)
    subtiles = 4 if m > _SUBTILES_FROM else 1
    return SkinnyTiles(
        block_m=ROW_TILE,
        block_n=block_n,
        block_k=block_k,
        num_warps=4,
        subtiles=subtiles,
        row_groups=triton.cdiv(m, ROW_TILE * subtiles),
        col_blocks=triton.cdiv(n, block_n),
        num_stages=5 if subtiles == 1 else 3,
    )


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    block_n: int | None = None,
    block_k: int = 256,
    num_warps: int | None = None,
    num_stages: int | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N], added in float32) -> [M, N] in x's dtype, float32
    accumulation (float32 inputs: full-precision products, not tf32). Any M; fastest for M <= 16.
    ``weight`` must be contiguous."""
    t = tiles_for(x.shape[0], weight.shape[0], block_n, block_k)
    return _launch(x[:, None], weight[None], bias, t, num_warps, num_stages)[:, 0]


def skinny_linear_heads(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """x [M, H, K] through each head's own weight [H, N, K] (any strides) -> [M, H, N] in x's dtype: per head
    the product ``skinny_linear`` computes, with its tiles and bits, all heads in one launch (the absorbed MLA's
    per-head products in batch-invariant mode, layers/mla.py ``heads_apart``)."""
    return _launch(x, weights, None, tiles_for(x.shape[0], weights.shape[1]), None, None)


def _launch(
    x: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor | None,
    t: SkinnyTiles,
    num_warps: int | None,
    num_stages: int | None,
) -> torch.Tensor:
    """x [M, H, K], weights [H, N, K] -> [M, H, N]: ``_skinny_kernel`` over the heads (grid axis 2)."""
    m, h, k = x.shape
    n = weights.shape[1]
    out = torch.empty(m, h, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    x = x if x.stride(2) == 1 else x.contiguous()
    _skinny_kernel[(t.row_groups, t.col_blocks, h)](
        x,
        weights,
        bias if bias is not None else weights,
        out,
        m,
        n,
        k,
        x.stride(0),
        weights.stride(1),
        out.stride(0),
        x.stride(1),
        weights.stride(0),
        out.stride(1),
        weights.stride(2),
        BM=t.block_m,
        BN=t.block_n,
        BK=t.block_k,
        SUBTILES=t.subtiles,
        HAS_BIAS=bias is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps or t.num_warps,
        num_stages=num_stages or t.num_stages,
    )
    return out
