"""The few-row projection kernel of layers/fused_projection.py (its docstring says what each entry point
folds in): one pass over a weight for each tile of up to 16 rows (one tile outside batch-invariant mode), with
the epilogue that the projection's neighbours need.

Rows: tiles of 16 (``skinny_gemm.MAX_ROWS``), one a program on the grid's fast axis (axis 0), the programs that
share outputs side by side so that their weight tiles come from L2. Outputs: each program owns a run of them,
computed in sub-tiles, each a new software pipeline over K (``fused_rows_kernel``'s docstring).

RoPE and SwiGLU pair column c with column c + H (H = head_dim / 2 inside each head; H = the intermediate size
for [gate | up]): a program computes both columns of each of its pairs, so the epilogue has what it needs. The
roundings differ from the unfused chain (no bf16 round trip between the steps).

On Hopper GPUs the kernel launches with programmatic dependent launch (layers/pdl.py): its programs start
while the previous kernel drains, prefetch their first weight tiles into L2 (weights never depend on the
previous kernel), and only then wait for the previous kernel's results."""

from __future__ import annotations

import triton
import triton.language as tl

from outpace.layers.fused_kernels import gelu_tanh, row_rstd
from outpace.layers.pdl import pdl_enter, prefetch_l2

# epilogues (EPILOGUE)
PLAIN = tl.constexpr(0)
SWIGLU = tl.constexpr(1)
QKV = tl.constexpr(2)
# gate activations (ACT)
ACT_SILU = tl.constexpr(0)
ACT_GELU_TANH = tl.constexpr(1)


# M is not specialized: Triton compiles a kernel of its own for an integer argument equal to 1, and there the
# sums of squares [BLOCK_P, BM] load with the parts axis contiguous (stride M = 1), a layout whose reduction
# adds the parts in another order: on the H200 a row's rstd, and so its output, differed decoded alone and
# among others (benchmarks/results/gpu_2026-11-30, call 4's README). Nor num_sq_parts, which follows the
# kernel that readied the rows (one for normed_rows, a projection's programs otherwise): its variants were met
# first inside requests (engine/warm_up.py).
@triton.jit(do_not_specialize=["M", "sq_m", "num_sq_parts"])
def fused_rows_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    res_ptr,
    sq_in_ptr,
    next_norm_ptr,
    normed_out_ptr,
    sq_out_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    q_norm_ptr,
    k_norm_ptr,
    scale_ptr,
    row_index_ptr,
    best_val_ptr,
    best_idx_ptr,
    arrivals_ptr,
    map_ptr,
    M,
    sq_m,
    N_OUT,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_om,
    stride_rm,
    num_sq_parts,
    eps,
    q_size,
    kv_size,
    qk_eps,
    subs,
    next_offset,
    qk_offset,
    cap,
    OUTS: tl.constexpr,
    CHUNK: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    NEXT_NORM: tl.constexpr,
    EPILOGUE: tl.constexpr,
    QK_NORM: tl.constexpr,
    V_NORM: tl.constexpr,
    ACT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    RELU2: tl.constexpr,
    HALF: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    BLOCK_P: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_K: tl.constexpr,
    FP8: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    GATHER: tl.constexpr,
    ARGMAX: tl.constexpr,
    MAP: tl.constexpr,
    BLOCK_PROGS: tl.constexpr,
):
    """Program (t, p) owns outputs p * OUTS ... p * OUTS + OUTS - 1 of the rows of tile t (rows t * BM ...
    t * BM + BM - 1) and computes them as ``subs`` sub-tiles of CHUNK (<= BN) consecutive outputs each.
    PLAIN: output i is column i.
    SWIGLU / QKV: output i is the pair (a, a + HALF), a = (i // HALF) * 2 * HALF + i % HALF.
    SCALE_ROWS: x is s * w_norm; row r's result is scaled by rsqrt(sum of sq_in[:, r] / K + eps).
    NEXT_NORM (PLAIN): also writes out * (next_offset + next_norm) and each sub-tile's sums of out^2
    (part p * subs + sub of sq_out). SOFTCAP (PLAIN): cap * tanh(result / cap) before any residual.
    RELU2 (PLAIN): relu(result)^2 of the result rounded to out's dtype, as the projection and then the
    activation round it (Nemotron-H's up_proj).
    SWIGLU: act(g) * u, act SiLU or GELU-tanh (ACT).
    QK_NORM (QKV, CHUNK a multiple of HALF: a sub-tile holds whole heads): per-head RMSNorm of q and k,
    their weights plus qk_offset; V_NORM: of v too, without a weight.
    FP8: the weight is float8 e4m3 with one float scale per SCALE_BN x SCALE_BK block (``Fp8Weight``; BK
    divides SCALE_BK, so a K step lies in one block column): each step's product, exact fp8 values in x's
    dtype, is scaled per output column before it is accumulated.
    GATHER: row r reads x's row row_index[r] (and that row's sums of squares: sq_in [P, sq_m]).
    ARGMAX (PLAIN, ``head_argmax``): nothing is stored per output; out [M] int64 receives each row's first
    column of the largest result (through ``map``, a lookup table, with MAP). Each program keeps its best over
    its sub-tiles and writes it to best_val / best_idx [row tiles, programs, BM]; the row tile's last program
    to arrive (arrivals [row tiles], left zero) takes the best of those, the lowest column among equals."""
    pid = tl.program_id(1)
    own_end = tl.minimum(pid * OUTS + OUTS, N_OUT)
    paired: tl.constexpr = EPILOGUE != PLAIN
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)  # [BM]: the program's row tile
    row_ok = rows < M
    src = rows  # [BM] the rows of x they read
    if GATHER:
        src = tl.load(row_index_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    ks = tl.arange(0, BK)
    if PDL:
        i = pid * OUTS + tl.arange(0, BN)  # the first sub-tile's outputs
        i = tl.where((i < pid * OUTS + CHUNK) & (i < own_end), i, pid * OUTS)
        if paired:
            i = (i // HALF) * (2 * HALF) + i % HALF
        lines = tl.arange(0, PREFETCH_K // 64) * 64  # one bf16 element per 128 B
        lines = tl.where(lines < K, lines, 0)[None, :]  # never past a row's end
        row_a = i[:, None] * stride_wn
        prefetch_l2(w_ptr + row_a + lines)
        if paired:
            prefetch_l2(w_ptr + row_a + HALF * stride_wn + lines)
    pdl_enter(PDL)
    if SCALE_ROWS:
        rstd = row_rstd(sq_in_ptr, src, row_ok, sq_m, num_sq_parts, K, eps, BLOCK_P)  # [BM, 1]
    best_val = tl.full([BM], float("-inf"), tl.float32)  # ARGMAX: the program's best so far
    best_idx = tl.zeros([BM], tl.int32)
    for sub in range(subs):
        start = pid * OUTS + sub * CHUNK
        i = start + tl.arange(0, BN)  # [BN]
        i_ok = (i < start + CHUNK) & (i < own_end)
        if paired:
            col_a = (i // HALF) * (2 * HALF) + i % HALF  # [BN]
        else:
            col_a = i
        ok = row_ok[:, None] & i_ok[None, :]
        # The epilogue's operands, asked for before the weights stream so that their latency hides behind it.
        if EPILOGUE == PLAIN:
            if RESIDUAL:
                res = tl.load(
                    res_ptr + rows[:, None] * stride_rm + i[None, :], mask=ok, other=0.0
                )  # [BM, BN]
            if NEXT_NORM:
                w_next = (
                    tl.load(next_norm_ptr + i, mask=i_ok, other=0.0).to(tl.float32) + next_offset
                )  # [BN]
        elif EPILOGUE == QKV:
            cos, sin, slot = _rope_operands(
                pos_ptr, cos_ptr, sin_ptr, slot_ptr, rows, row_ok, i % HALF, ok, HALF
            )
            if QK_NORM:
                norm_a, norm_b = _head_norm_weights(
                    col_a, i % HALF, q_size, kv_size, q_norm_ptr, k_norm_ptr, qk_offset, HALF
                )
        acc_a = tl.zeros((BM, BN), dtype=tl.float32)
        acc_b = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + ks  # [BK]
            k_ok = kk < K
            x = tl.load(
                x_ptr + src[:, None] * stride_xm + kk[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )  # [BM, BK]
            w_ok = i_ok[:, None] & k_ok[None, :]
            w_a = tl.load(
                w_ptr + col_a[:, None] * stride_wn + kk[None, :], mask=w_ok, other=0.0
            )  # [BN, BK]
            acc_a += _weighed_product(
                x, w_a, scale_ptr, col_a, k0, i_ok, stride_sn, stride_sk, FP8, SCALE_BN, SCALE_BK,
                PRECISION,
            )  # fmt: skip
            if paired:
                w_b = tl.load(
                    w_ptr + (col_a + HALF)[:, None] * stride_wn + kk[None, :], mask=w_ok, other=0.0
                )
                acc_b += _weighed_product(
                    x, w_b, scale_ptr, col_a + HALF, k0, i_ok, stride_sn, stride_sk, FP8,
                    SCALE_BN, SCALE_BK, PRECISION,
                )  # fmt: skip
        if SCALE_ROWS:
            acc_a *= rstd
            acc_b *= rstd
        if EPILOGUE == PLAIN:
            if SOFTCAP:
                acc_a = cap * _tanh(acc_a / cap)
            if RELU2:
                acc_a = tl.maximum(acc_a.to(out_ptr.dtype.element_ty).to(tl.float32), 0.0)
                acc_a = acc_a * acc_a
            if RESIDUAL:
                acc_a += res.to(tl.float32)
            if ARGMAX:  # (a NaN is never the best: drafts only, ``head_argmax``'s docstring)
                vals = tl.where(ok, acc_a, float("-inf"))
                top = tl.max(vals, axis=1)  # [BM]
                first = tl.min(tl.where(vals == top[:, None], i[None, :], N_OUT), axis=1)
                better = top > best_val  # strictly: an earlier sub-tile keeps a tie
                best_idx = tl.where(better, first, best_idx)
                best_val = tl.where(better, top, best_val)
            else:
                out = acc_a.to(out_ptr.dtype.element_ty)
                tl.store(out_ptr + rows[:, None] * stride_om + i[None, :], out, mask=ok)
            if NEXT_NORM:
                s = tl.where(ok, out.to(tl.float32), 0.0)  # the stream as stored
                tl.store(
                    normed_out_ptr + rows[:, None] * N_OUT + i[None, :],
                    (s * w_next[None, :]).to(normed_out_ptr.dtype.element_ty),
                    mask=ok,
                )
                tl.store(
                    sq_out_ptr + (pid * subs + sub) * M + rows, tl.sum(s * s, axis=1), mask=row_ok
                )
        elif EPILOGUE == SWIGLU:
            if ACT == ACT_GELU_TANH:
                gate = gelu_tanh(acc_a)
            else:
                gate = acc_a / (1.0 + tl.exp(-acc_a))
            tl.store(
                out_ptr + rows[:, None] * stride_om + i[None, :],
                (gate * acc_b).to(out_ptr.dtype.element_ty),
                mask=ok,
            )
        else:
            if QK_NORM:
                acc_a, acc_b = _head_norm(
                    acc_a,
                    acc_b,
                    col_a,
                    norm_a,
                    norm_b,
                    q_size,
                    kv_size,
                    qk_eps,
                    BM,
                    BN,
                    HALF,
                    V_NORM,
                )
            _qkv_epilogue(
                acc_a,
                acc_b,
                rows,
                col_a,
                ok,
                out_ptr,
                stride_om,
                cos,
                sin,
                slot,
                k_cache_ptr,
                v_cache_ptr,
                q_size,
                kv_size,
                HALF,
            )
    if ARGMAX:
        _argmax_across_programs(
            best_val, best_idx, best_val_ptr, best_idx_ptr, arrivals_ptr, map_ptr, out_ptr, rows,
            row_ok, N_OUT, pid, BM, BLOCK_PROGS, MAP,
        )  # fmt: skip


@triton.jit
def _argmax_across_programs(
    best_val,  # [BM] float32 this program's best result of each row
    best_idx,  # [BM] int32 its column
    best_val_ptr,
    best_idx_ptr,
    arrivals_ptr,
    map_ptr,
    out_ptr,
    rows,  # [BM] int64
    row_ok,
    N_OUT,
    pid,
    BM: tl.constexpr,
    BLOCK_PROGS: tl.constexpr,
    MAP: tl.constexpr,
):
    """ARGMAX's last step (``fused_rows_kernel``): this program's best into the row tile's slots, then, by the
    tile's last program to arrive, the best of every program's into out (the lowest column among equals: the
    programs own ascending columns). The count is an atomic add, acq_rel at gpu scope: it releases this
    program's slots, and the last to arrive acquires every program's (read past L1, which other SMs' writes do
    not reach); that program zeroes the count again for the next launch (layers/zeroed_scratch.py)."""
    tile, programs = tl.program_id(0), tl.num_programs(1)
    here = (tile * programs + pid) * BM + tl.arange(0, BM)
    tl.store(best_val_ptr + here, best_val)
    tl.store(best_idx_ptr + here, best_idx)
    tl.debug_barrier()  # every thread's slots before the count (one thread takes it for the program)
    arrivals = arrivals_ptr + tile
    if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == programs - 1:
        progs = tl.arange(0, BLOCK_PROGS)
        slots = (tile * programs + progs[:, None]) * BM + tl.arange(0, BM)[None, :]
        some = (progs < programs)[:, None]
        vals = tl.load(best_val_ptr + slots, mask=some, other=float("-inf"), cache_modifier=".cg")
        cols = tl.load(best_idx_ptr + slots, mask=some, other=N_OUT, cache_modifier=".cg")
        top = tl.max(vals, axis=0)  # [BM]
        # (a row with no finite result: column 0, as argmax's, every program's column before a better one)
        first = tl.min(tl.where(vals == top[None, :], cols, N_OUT), axis=0)
        if MAP:
            first = tl.load(map_ptr + first, mask=row_ok, other=0)
        tl.store(out_ptr + rows, first.to(tl.int64), mask=row_ok)
        tl.atomic_xchg(arrivals, 0)


@triton.jit
def _weighed_product(
    x,  # [BM, BK] in the compute dtype
    w,  # [BN, BK]: the weight tile as stored
    scale_ptr,
    cols,  # [BN] the tile's weight rows
    k0,
    cols_ok,  # [BN]
    stride_sn,
    stride_sk,
    FP8: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """x @ w.T [BM, BN] in float32. FP8 weights: the product of their exact values in x's dtype (e4m3 values
    are bf16 and float32 values), times each column's block scale (the block row of its weight row, the
    block column of k0: the step lies in one)."""
    if FP8:  # (both branches spelled out: Triton compiles what follows an early return)
        scale = tl.load(
            scale_ptr + (cols // SCALE_BN).to(tl.int64) * stride_sn + (k0 // SCALE_BK) * stride_sk,
            mask=cols_ok,
            other=0.0,
        ).to(tl.float32)  # [BN]
        product = tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PRECISION) * scale[None, :]
    else:
        product = tl.dot(x, tl.trans(w), input_precision=PRECISION)
    return product


@triton.jit
def _head_norm_weights(
    col_a, j, q_size, kv_size, q_norm_ptr, k_norm_ptr, offset, HALF: tl.constexpr
):
    """The per-head norm scales of columns col_a (pair j of its head) and col_a + HALF: offset + q_norm's
    for q columns, offset + k_norm's for k columns, 1 for v columns -> two [1, BN] float32."""
    is_q = col_a < q_size
    is_v = col_a >= q_size + kv_size
    w_a = tl.where(is_q, tl.load(q_norm_ptr + j), tl.load(k_norm_ptr + j)).to(tl.float32) + offset
    w_b = (
        tl.where(is_q, tl.load(q_norm_ptr + j + HALF), tl.load(k_norm_ptr + j + HALF)).to(
            tl.float32
        )
        + offset
    )
    return tl.where(is_v, 1.0, w_a)[None, :], tl.where(is_v, 1.0, w_b)[None, :]


@triton.jit
def _head_norm(
    a,
    b,
    col_a,
    w_a,
    w_b,
    q_size,
    kv_size,
    eps,
    BM: tl.constexpr,
    BN: tl.constexpr,
    HALF: tl.constexpr,
    V_NORM: tl.constexpr,
):
    """a, b [BM, BN]: columns j and j + HALF of whole heads (BN // HALF of them, in order). q and k
    columns get their head's RMSNorm (scales w_a, w_b: ``_head_norm_weights``); v columns too with
    V_NORM (scale 1), else they pass."""
    sq = tl.sum(tl.reshape(a * a + b * b, (BM, BN // HALF, HALF)), axis=2)  # [BM, heads]
    rstd = tl.rsqrt(sq / (2 * HALF) + eps)
    rstd = tl.reshape(tl.broadcast_to(rstd[:, :, None], (BM, BN // HALF, HALF)), (BM, BN))
    if V_NORM:
        normed = (col_a >= 0)[None, :]
    else:
        normed = (col_a < q_size + kv_size)[None, :]
    return tl.where(normed, a * rstd * w_a, a), tl.where(normed, b * rstd * w_b, b)


@triton.jit
def _tanh(x):
    """tanh in float32 from exp: 2 / (1 + e^-2x) - 1, x clamped to [-10, 10] (tanh(10) is 1 in float32)."""
    return 2.0 / (1.0 + tl.exp(-2.0 * tl.minimum(tl.maximum(x, -10.0), 10.0))) - 1.0


@triton.jit
def _rope_operands(pos_ptr, cos_ptr, sin_ptr, slot_ptr, rows, row_ok, j, ok, HALF: tl.constexpr):
    """For rows at positions pos_ptr[rows] and pair j of each column's head: cos, sin [BM, BN] float32
    and the rows' cache slots [BM, 1]."""
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)  # [BM]
    trig = pos[:, None].to(tl.int64) * HALF + j[None, :]  # [BM, BN]
    cos = tl.load(cos_ptr + trig, mask=ok, other=1.0)
    sin = tl.load(sin_ptr + trig, mask=ok, other=0.0)
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)[:, None]  # [BM, 1]
    return cos, sin, slot


@triton.jit
def _qkv_epilogue(
    a,
    b,
    rows,
    col_a,
    ok,
    q_ptr,
    stride_qm,
    cos,
    sin,
    slot,
    k_cache_ptr,
    v_cache_ptr,
    q_size,
    kv_size,
    HALF: tl.constexpr,
):
    """a, b [BM, BN]: columns col_a and col_a + HALF of [q | k | v] for each row. Rotates q and k pairs
    by cos, sin (``_rope_operands``, neox layout), then stores q into q_ptr [M, q_size] and k, v into
    the caches' rows at the rows' slots (caches [slots, kv_size], contiguous)."""
    rotate = (col_a < q_size + kv_size)[None, :]
    a, b = tl.where(rotate, a * cos - b * sin, a), tl.where(rotate, b * cos + a * sin, b)
    is_q = (col_a < q_size)[None, :]
    q_col = tl.where(is_q, col_a, 0)[None, :]
    q_dst = q_ptr + rows[:, None] * stride_qm + q_col
    tl.store(q_dst, a.to(q_ptr.dtype.element_ty), mask=ok & is_q)
    tl.store(q_dst + HALF, b.to(q_ptr.dtype.element_ty), mask=ok & is_q)
    is_k = (col_a >= q_size)[None, :] & rotate
    is_v = (col_a >= q_size + kv_size)[None, :]
    kv_col = tl.where(is_v, col_a - q_size - kv_size, tl.where(is_k, col_a - q_size, 0))  # [1, BN]
    k_dst = k_cache_ptr + slot * kv_size + kv_col
    v_dst = v_cache_ptr + slot * kv_size + kv_col
    tl.store(k_dst, a.to(k_cache_ptr.dtype.element_ty), mask=ok & is_k)
    tl.store(k_dst + HALF, b.to(k_cache_ptr.dtype.element_ty), mask=ok & is_k)
    tl.store(v_dst, a.to(v_cache_ptr.dtype.element_ty), mask=ok & is_v)
    tl.store(v_dst + HALF, b.to(v_cache_ptr.dtype.element_ty), mask=ok & is_v)
