"""The per-head half of a q/k/v projection whose heads are too wide for one program an SM to hold whole
(head_dim 256 or 512: Gemma, Qwen3-Next; layers/fused_projection.py ``norm_project_qkv``): after a plain
projection, one program a (row tile, head) applies the input norm's factor, the head's RMSNorm, RoPE, and
stores q and writes k and v into the paged cache. Launched with programmatic dependent launch on Hopper
(layers/pdl.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from outpace.layers.pdl import pdl_enter


@triton.jit
def _normed_rotated(
    head_ptr,  # [BM, 1] pointers: the rows' first column of the head in the raw projection
    x,  # [BM, HALF] float32: the head's columns h, raw
    h,  # [HALF]
    scale,  # [BM, 1] float32: the rows' factor (the input norm's, the head norm's)
    is_q,  # (scalar) a q head, else a k head
    q_norm_ptr,
    k_norm_ptr,
    offset,
    pos,  # [BM] the rows' positions
    cos_ptr,
    sin_ptr,
    ok,  # [BM, HALF]
    ROT_HALF: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    """Columns h of a q or k head times scale (and offset + the head norm's weight with QK_NORM), rotated:
    a column h < 2 * ROT_HALF with its neox partner h +- ROT_HALF (read again from the raw projection,
    scaled alike) by the table's entry h mod ROT_HALF; the columns past 2 * ROT_HALF pass."""
    rotated = h < 2 * ROT_HALF  # [HALF]
    lower = h < ROT_HALF
    partner = tl.where(lower, h + ROT_HALF, tl.where(rotated, h - ROT_HALF, h))  # [HALF]
    p = tl.load(head_ptr + partner[None, :], mask=ok & rotated[None, :], other=0.0).to(tl.float32)
    x, p = x * scale, p * scale
    if QK_NORM:
        w = tl.where(is_q, tl.load(q_norm_ptr + h), tl.load(k_norm_ptr + h)).to(tl.float32)
        w_p = tl.where(is_q, tl.load(q_norm_ptr + partner), tl.load(k_norm_ptr + partner))
        x, p = x * (w + offset)[None, :], p * (w_p.to(tl.float32) + offset)[None, :]
    entry = tl.where(lower, h, tl.where(rotated, h - ROT_HALF, 0))  # [HALF]
    trig = pos[:, None].to(tl.int64) * ROT_HALF + entry[None, :]  # [BM, HALF]
    turn = ok & rotated[None, :]
    cos = tl.load(cos_ptr + trig, mask=turn, other=1.0)
    sin = tl.load(sin_ptr + trig, mask=turn, other=0.0)
    return x * cos + tl.where(lower, -1.0, 1.0)[None, :] * p * sin


@triton.jit
def qkv_heads_kernel(
    raw_ptr,  # [M, q_size + 2 * kv_size] (V_FROM_K: + kv_size) any float dtype: the projection, no per-head work
    q_ptr,
    pos_ptr,
    cos_ptr,  # [max_positions, ROT_HALF] float32
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    q_norm_ptr,
    k_norm_ptr,
    sq_ptr,  # [num_sq_parts, M] float32 (ROW_NORM): the input norm's partial sums of squares
    M,
    K,  # the input norm's width (ROW_NORM)
    num_sq_parts,
    row_eps,
    stride_rm,
    stride_qm,
    q_size,
    kv_size,
    qk_eps,
    qk_offset,
    HALF: tl.constexpr,
    ROT_HALF: tl.constexpr,  # pairs RoPE turns a head (HALF: all of it; fewer: partial rotary)
    BM: tl.constexpr,
    ROW_NORM: tl.constexpr,  # raw is (s * w_norm) @ W.T: each row times rsqrt(mean(s^2) + row_eps)
    QK_NORM: tl.constexpr,
    V_NORM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    Q_GATED: tl.constexpr,  # raw's q part is [q head | its gate head] per head (Qwen3-Next's q_proj)
    V_FROM_K: tl.constexpr,  # raw holds no v rows: v head i is k head i's projection (Gemma 4's k = v)
    PDL: tl.constexpr,
):
    """Program (t, h): head h of [q | k | v] for the rows of tile t, from the raw projection: with ROW_NORM
    each row first scaled by its input norm's factor (``NormedRows``: the projection read s * w_norm); q and
    k heads normalised by their per-head norm with QK_NORM (offset + weight) and rotated over their first
    2 * ROT_HALF dimensions (``_normed_rotated``), v heads normalised without a weight with V_NORM, else
    passed; q stored, k and v written into the caches' rows at the rows' slots (caches [slots, kv_size],
    contiguous). With V_FROM_K a v head reads its k head's columns: k's projection before k's norm and RoPE."""
    pdl_enter(PDL)
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)  # [BM]
    row_ok = rows < M
    first = tl.program_id(1) * 2 * HALF  # the head's first column of [q | k | v]
    is_q = first < q_size
    j = tl.arange(0, HALF)  # [HALF]
    ok = row_ok[:, None] & (j < HALF)[None, :]  # [BM, HALF]
    src = first  # its first column in raw
    if Q_GATED:  # (each q head followed by its gate head: the q part twice as wide)
        src = tl.where(is_q, 2 * first, first + q_size)
    if V_FROM_K:
        src = tl.where(first >= q_size + kv_size, first - kv_size, first)
    head_ptr = raw_ptr + rows[:, None] * stride_rm + src  # [BM, 1]
    a = tl.load(head_ptr + j[None, :], mask=ok, other=0.0).to(tl.float32)  # columns j
    b = tl.load(head_ptr + HALF + j[None, :], mask=ok, other=0.0).to(tl.float32)  # j + HALF
    scale = tl.full([BM, 1], 1.0, tl.float32)  # [BM, 1] each row's factor
    if ROW_NORM:
        parts = tl.arange(0, BLOCK_P)
        sq = tl.load(
            sq_ptr + parts[None, :] * M + rows[:, None],
            mask=row_ok[:, None] & (parts < num_sq_parts)[None, :],
            other=0.0,
        )  # [BM, BLOCK_P]
        scale = tl.rsqrt(tl.sum(sq, axis=1) / K + row_eps)[:, None]
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)[:, None]  # [BM, 1]
    # the head's RMSNorm, of the rows as scaled: q and k heads with QK_NORM, v heads with V_NORM
    head_scale = scale
    if QK_NORM or V_NORM:
        head_sq = tl.sum(a * a + b * b, axis=1)[:, None] * scale * scale  # [BM, 1]
        head_scale = scale * tl.rsqrt(head_sq / (2 * HALF) + qk_eps)
    if first >= q_size + kv_size:  # a v head
        if V_NORM:
            scale = head_scale
        v_dst = v_cache_ptr + slot * kv_size + (first - q_size - kv_size) + j[None, :]
        tl.store(v_dst, (a * scale).to(v_cache_ptr.dtype.element_ty), mask=ok)
        tl.store(v_dst + HALF, (b * scale).to(v_cache_ptr.dtype.element_ty), mask=ok)
    else:
        if QK_NORM:
            scale = head_scale
        pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)  # [BM]
        args = (scale, is_q, q_norm_ptr, k_norm_ptr, qk_offset, pos, cos_ptr, sin_ptr, ok)
        a = _normed_rotated(head_ptr, a, j, *args, ROT_HALF, QK_NORM)
        b = _normed_rotated(head_ptr, b, j + HALF, *args, ROT_HALF, QK_NORM)
        if is_q:
            q_dst = q_ptr + rows[:, None] * stride_qm + first + j[None, :]
            tl.store(q_dst, a.to(q_ptr.dtype.element_ty), mask=ok)
            tl.store(q_dst + HALF, b.to(q_ptr.dtype.element_ty), mask=ok)
        else:
            k_dst = k_cache_ptr + slot * kv_size + (first - q_size) + j[None, :]
            tl.store(k_dst, a.to(k_cache_ptr.dtype.element_ty), mask=ok)
            tl.store(k_dst + HALF, b.to(k_cache_ptr.dtype.element_ty), mask=ok)
