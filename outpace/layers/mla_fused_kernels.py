"""The Triton kernels of MLA's few-row path (layers/mla_fused.py: its docstring says what each computes, how
block-FP8 and per-tensor FP8 weights are read, and how batch-invariant mode takes them): ``down_kernel`` (the
query's and kv_a's projections of the rows, side by side), ``q_absorb_kernel`` (with a q_lora_rank: q_b_proj's
q_nope rows times each head's W_UK, the rotated q_pe, and the kv rows finished into the latent cache) and
``absorb_kernel`` (without one: q_proj's q_nope rows times W_UK). With TRITON_INTERPRET=1 they run on CPU
tensors in float32 (tests)."""

from __future__ import annotations

import triton
import triton.language as tl

from outpace.attention.kernel_parts import fp8_rows
from outpace.layers.fused_kernels import row_rstd
from outpace.layers.pdl import pdl_enter, prefetch_l2
from outpace.layers.quant.weight_tiles import scale_rows, weight_tile


@triton.jit
def _rows_dot(
    x_ptr,
    stride_xm,
    rows,
    row_ok,  # [BM]
    w_ptr,
    w_rows,
    w_ok,  # [BN]: the weight rows this tile computes
    stride_wn,
    s_ptr,  # FORMAT "fp8_block": the weight's scales [ceil(N / SCALE_BN), ceil(K / SCALE_BK)]
    stride_sn,
    stride_sk,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    FORMAT: tl.constexpr,  # "none" (x's dtype) or "fp8_block"
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,  # (fp8_block: BK divides it or is a multiple of it)
):
    """x[rows] @ w[w_rows].T over K columns -> [BM, BN] float32 (masked rows and weight rows give 0); a
    block FP8 weight dequantized in registers to x's dtype (layers/quant/quant_matmul_kernel.py
    ``weight_tile``, as the few-row FP8 projections read theirs)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    w_row_ptrs = w_ptr + w_rows.to(tl.int64)[:, None] * stride_wn  # [BN, 1]
    s_row_ptrs = scale_rows(s_ptr, w_rows, stride_sn, FORMAT, SCALE_BN)  # [BN, 1]
    ks = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + kk[None, :],
            mask=row_ok[:, None] & (kk < K)[None, :],
            other=0.0,
        )  # [BM, BK]
        w = weight_tile(
            w_row_ptrs,
            s_row_ptrs,
            k0,
            K,
            w_ok,
            stride_sk,
            FORMAT,
            SCALE_BK,
            BK,
            x_ptr.dtype.element_ty,
        )  # [BN, BK]
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _prefetch_rows(
    w_ptr, w_rows, w_ok, stride_wn, K, PREFETCH_K: tl.constexpr, FORMAT: tl.constexpr
):
    """Brings the first PREFETCH_K // 64 lines of 128 bytes of weight rows ``w_rows`` [BN] (``w_ok``)
    into L2 (PREFETCH_K bf16 columns, twice as many fp8 ones): what a program reads first, asked for
    before it waits on the previous kernel (layers/pdl.py)."""
    if FORMAT == "fp8_block":
        lines = tl.arange(0, PREFETCH_K // 64) * 128  # one fp8 element per line
    else:
        lines = tl.arange(0, PREFETCH_K // 64) * 64  # one bf16 element per line
    lines = tl.where(lines < K, lines, 0)[None, :]  # never past a row's end
    prefetch_l2(w_ptr + tl.where(w_ok, w_rows, 0)[:, None] * stride_wn + lines)


@triton.jit
def _rope_pairs(pairs, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The two source columns of rotation pair ``pairs`` in a raw rope part (module docstring)."""
    if INTERLEAVED:
        return 2 * pairs, 2 * pairs + 1
    return pairs, pairs + HALF


@triton.jit
def _rotate(a, b, pos_ptr, cos_ptr, sin_ptr, rows, row_ok, pairs, pair_ok, HALF: tl.constexpr):
    """Rotation pairs (a, b) [BM, BLOCK_HP] of rows at positions pos_ptr[rows] by the cos, sin tables
    [max_positions, HALF] float32 (layers/rotary.py's formula)."""
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    trig = pos[:, None] * HALF + pairs[None, :]
    ok = row_ok[:, None] & pair_ok[None, :]
    cos = tl.load(cos_ptr + trig, mask=ok, other=1.0)
    sin = tl.load(sin_ptr + trig, mask=ok, other=0.0)
    return a * cos - b * sin, b * cos + a * sin


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count
def down_kernel(
    x_ptr,  # [M, K]: the normalised layer input, or (ROW_NORM) the stream times the input norm's weight
    sq_ptr,  # [num_sq_parts, M] float32 (ROW_NORM): the stream's partial sums of squares
    wq_ptr,  # [QR, K] q_a_proj (Q_NORMED) or q_proj (QR = heads * (nope + rope))
    wkv_ptr,  # [KV, K] kv_a_proj_with_mqa, KV = R + P
    wq_scale_ptr,  # Q_FORMAT "fp8_block": wq's scales (_rows_dot)
    wkv_scale_ptr,  # KV_FORMAT "fp8_block": kv_a_proj_with_mqa's
    q_norm_ptr,  # [QR] q_a_layernorm's weight (Q_NORMED)
    q_out_ptr,  # [M, QR] out: q_a * q_norm (Q_NORMED), else q_proj's float32 rows
    q_sq_ptr,  # [q_programs, M] float32 out (Q_NORMED): each q program's sums of q_a^2
    kv_raw_ptr,  # [M, KV] float32 out
    M,
    K,
    QR,
    KV,
    q_programs,
    num_sq_parts,
    eps,  # the input norm's (ROW_NORM)
    stride_xm,
    stride_wq,
    stride_wkv,
    stride_wq_sn,
    stride_wq_sk,
    stride_wkv_sn,
    stride_wkv_sk,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_K: tl.constexpr,
    Q_FORMAT: tl.constexpr,  # "none" or "fp8_block", each weight its own
    KV_FORMAT: tl.constexpr,
    SCALE_BN: tl.constexpr,  # a scale's block (fp8_block: the checkpoint's weight_block_size)
    SCALE_BK: tl.constexpr,
    Q_NORMED: tl.constexpr,  # wq is q_a_proj, followed by q_a_layernorm
    ROW_NORM: tl.constexpr,  # x is a stream times its input norm's weight (``NormedRows``)
    BLOCK_P: tl.constexpr,  # (ROW_NORM) num_sq_parts, rounded up to a power of two
):
    """Programs 0 .. q_programs - 1: BN outputs of the query's projection each; the rest: BN outputs of
    kv_a each; grid axis 1: the row tile. ROW_NORM: the input norm folded in, as layers/fused_projection.py's
    projections fold it: each row's products (float32, after the FP8 scales) times its ``row_rstd`` over K,
    so that q_a's norm (Q_NORMED) sums the squares of the normalised input's q_a."""
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BM + tl.arange(0, BM)  # the grid's row tile
    row_ok = rows < M
    if pid < q_programs:
        cols = pid * BN + tl.arange(0, BN)
        ok = cols < QR
        if PDL:
            _prefetch_rows(wq_ptr, cols, ok, stride_wq, K, PREFETCH_K, Q_FORMAT)
        pdl_enter(PDL)
        acc = _rows_dot(
            x_ptr,
            stride_xm,
            rows,
            row_ok,
            wq_ptr,
            cols,
            ok,
            stride_wq,
            wq_scale_ptr,
            stride_wq_sn,
            stride_wq_sk,
            K,
            BM,
            BN,
            BK,
            PRECISION,
            Q_FORMAT,
            SCALE_BN,
            SCALE_BK,
        )  # [BM, BN]; 0 in masked columns
        if ROW_NORM:
            acc *= row_rstd(sq_ptr, rows, row_ok, M, num_sq_parts, K, eps, BLOCK_P)
        dst = q_out_ptr + rows[:, None] * QR + cols[None, :]
        if Q_NORMED:
            w = tl.load(q_norm_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            out = (acc * w[None, :]).to(q_out_ptr.dtype.element_ty)
            tl.store(dst, out, mask=row_ok[:, None] & ok[None, :])
            tl.store(q_sq_ptr + pid * M + rows, tl.sum(acc * acc, axis=1), mask=row_ok)
        else:
            tl.store(dst, acc, mask=row_ok[:, None] & ok[None, :])
    else:
        cols = (pid - q_programs) * BN + tl.arange(0, BN)
        ok = cols < KV
        if PDL:
            _prefetch_rows(wkv_ptr, cols, ok, stride_wkv, K, PREFETCH_K, KV_FORMAT)
        pdl_enter(PDL)
        acc = _rows_dot(
            x_ptr,
            stride_xm,
            rows,
            row_ok,
            wkv_ptr,
            cols,
            ok,
            stride_wkv,
            wkv_scale_ptr,
            stride_wkv_sn,
            stride_wkv_sk,
            K,
            BM,
            BN,
            BK,
            PRECISION,
            KV_FORMAT,
            SCALE_BN,
            SCALE_BK,
        )
        if ROW_NORM:
            acc *= row_rstd(sq_ptr, rows, row_ok, M, num_sq_parts, K, eps, BLOCK_P)
        tl.store(
            kv_raw_ptr + rows[:, None] * KV + cols[None, :],
            acc,
            mask=row_ok[:, None] & ok[None, :],
        )


@triton.jit
def _write_kv_rows(
    kv_raw_ptr,  # [M, R + P] float32
    kv_norm_ptr,  # [R] kv_a_layernorm's weight
    cache_ptr,  # [slots, R + P]
    k_scale_ptr,  # [] float32: an FP8 cache's scale (read only when the cache is float8)
    slot_ptr,  # [M]
    pos_ptr,
    cos_ptr,
    sin_ptr,
    rows,
    row_ok,
    kv_eps,
    stride_cache_slot,
    R: tl.constexpr,
    P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_HP: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    """The cache rows [RMSNorm(latent) | rotated k_pe] of the raw kv rows, at the rows' slots; a float8
    cache (attention/kv_quant.py) gets them quantized with the layer's k scale (the cache's element
    type is a compile-time fact: the test compiles out of other variants)."""
    offs = tl.arange(0, BLOCK_R)
    r_ok = offs < R
    ok = row_ok[:, None] & r_ok[None, :]
    raw = kv_raw_ptr + rows[:, None] * (R + P)
    latent = tl.load(raw + offs[None, :], mask=ok, other=0.0)  # [BM, BLOCK_R]
    rstd = tl.rsqrt(tl.sum(latent * latent, axis=1) / R + kv_eps)
    w = tl.load(kv_norm_ptr + offs, mask=r_ok, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    dst = cache_ptr + slot[:, None] * stride_cache_slot
    latent = latent * rstd[:, None] * w[None, :]
    if cache_ptr.dtype.element_ty.is_fp8():
        latent = fp8_rows(latent, k_scale_ptr)
    tl.store(dst + offs[None, :], latent.to(cache_ptr.dtype.element_ty), mask=ok)
    pairs = tl.arange(0, BLOCK_HP)
    pair_ok = pairs < P // 2
    col_a, col_b = _rope_pairs(pairs, P // 2, INTERLEAVED)
    pok = row_ok[:, None] & pair_ok[None, :]
    a = tl.load(raw + R + col_a[None, :], mask=pok, other=0.0)
    b = tl.load(raw + R + col_b[None, :], mask=pok, other=0.0)
    a, b = _rotate(a, b, pos_ptr, cos_ptr, sin_ptr, rows, row_ok, pairs, pair_ok, P // 2)
    if cache_ptr.dtype.element_ty.is_fp8():
        a = fp8_rows(a, k_scale_ptr)
        b = fp8_rows(b, k_scale_ptr)
    tl.store(dst + R + pairs[None, :], a.to(cache_ptr.dtype.element_ty), mask=pok)
    tl.store(dst + R + P // 2 + pairs[None, :], b.to(cache_ptr.dtype.element_ty), mask=pok)


@triton.jit
def _latent_columns(
    q_nope,
    w_uk_rows,
    j_ok,
    dst,
    row_ok,
    r_start,
    R,
    R_LEN: tl.constexpr,
    BR: tl.constexpr,
    PRECISION,
):
    """q_nope [BM, NC] (W_UK's dtype) times W_UK's rows ``w_uk_rows`` [NC, 1] (``j_ok`` [NC]) in columns
    r_start .. r_start + R_LEN (< R), BR at a time, stored at ``dst`` [BM, 1] + column."""
    for r0 in range(r_start, r_start + R_LEN, BR):
        rr = r0 + tl.arange(0, BR)
        r_ok = rr < R
        w_uk = tl.load(
            w_uk_rows + rr[None, :], mask=j_ok[:, None] & r_ok[None, :], other=0.0
        )  # [NC, BR]
        latent = tl.dot(q_nope, w_uk, input_precision=PRECISION)  # [BM, BR]
        tl.store(
            dst + rr[None, :],
            latent.to(dst.dtype.element_ty),
            mask=row_ok[:, None] & r_ok[None, :],
        )


@triton.jit
def _store_q_pe(a, b, q_pe_ptr, rows, head, pairs, ok, HEADS: tl.constexpr, P: tl.constexpr):
    """A head's rotated q_pe pairs (a, b) [BM, BLOCK_HP] at (i, i + P/2) of its rows of q_pe [M, HEADS, P]."""
    pe_dst = q_pe_ptr + (rows * HEADS + head)[:, None] * P + pairs[None, :]
    tl.store(pe_dst, a.to(q_pe_ptr.dtype.element_ty), mask=ok)
    tl.store(pe_dst + P // 2, b.to(q_pe_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count
def q_absorb_kernel(
    x_ptr,  # [M, K]: q_a * q_norm
    sq_ptr,  # [num_sq_parts, M] float32: sums of q_a^2
    wq_ptr,  # [HEADS * (NOPE + P), K]: q_b_proj
    wq_scale_ptr,  # Q_FORMAT "fp8_block": its scales (_rows_dot)
    w_uk_ptr,  # [HEADS, NOPE, R] (strides stride_uk_head, stride_uk_row, 1): W_UK (mla.py up_weights)
    kv_raw_ptr,
    kv_norm_ptr,
    cache_ptr,
    k_scale_ptr,
    slot_ptr,  # as _write_kv_rows's
    pos_ptr,  # [M]
    cos_ptr,
    sin_ptr,  # [max_positions, P // 2] float32
    q_parts_ptr,  # [Q_PARTS, M, HEADS, R] out: partial query latents
    q_pe_ptr,  # [M, HEADS, P] out: rotated
    M,
    K,
    num_sq_parts,
    eps,
    kv_eps,
    stride_xm,
    stride_wq,
    stride_wq_sn,
    stride_wq_sk,
    stride_uk_head,
    stride_uk_row,
    stride_cache_slot,
    HEADS: tl.constexpr,
    NOPE: tl.constexpr,
    P: tl.constexpr,
    R: tl.constexpr,
    Q_PARTS: tl.constexpr,
    NOPE_CHUNK: tl.constexpr,
    PE_PARTS: tl.constexpr,
    PE_CHUNK: tl.constexpr,  # rotation pairs a q_pe program
    BLOCK_NC: tl.constexpr,
    BLOCK_HP: tl.constexpr,  # a q_pe program's pairs
    BLOCK_KP: tl.constexpr,  # all of k_pe's pairs (the kv rows' program)
    BLOCK_R: tl.constexpr,
    BLOCK_SQ: tl.constexpr,
    BR: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_K: tl.constexpr,
    Q_FORMAT: tl.constexpr,  # "none" or "fp8_block"
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
):
    """Program h * (Q_PARTS + PE_PARTS) + c of head h: c < Q_PARTS, part c of the query latent (q_nope's
    columns c * NOPE_CHUNK ... times their rows of W_UK); else part c - Q_PARTS of the head's rotated q_pe
    (PE_CHUNK rotation pairs). The last program (HEADS * (Q_PARTS + PE_PARTS)) writes the kv rows into the
    cache. Row r of x @ W.T is scaled by rsqrt(sum(sq[:, r]) / K + eps) (q_a_layernorm)."""
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BM + tl.arange(0, BM)  # the grid's row tile
    row_ok = rows < M
    if pid == HEADS * (Q_PARTS + PE_PARTS):
        pdl_enter(PDL)
        _write_kv_rows(
            kv_raw_ptr,
            kv_norm_ptr,
            cache_ptr,
            k_scale_ptr,
            slot_ptr,
            pos_ptr,
            cos_ptr,
            sin_ptr,
            rows,
            row_ok,
            kv_eps,
            stride_cache_slot,
            R,
            P,
            BLOCK_R,
            BLOCK_KP,
            INTERLEAVED,
        )
    else:
        head = pid // (Q_PARTS + PE_PARTS)
        c = pid % (Q_PARTS + PE_PARTS)
        head_row = head * (NOPE + P)
        j = c * NOPE_CHUNK + tl.arange(0, BLOCK_NC)  # [BLOCK_NC] q_nope columns (c < Q_PARTS)
        j_ok = (j < c * NOPE_CHUNK + NOPE_CHUNK) & (j < NOPE)
        pe_start = (c - Q_PARTS) * PE_CHUNK
        pairs = pe_start + tl.arange(0, BLOCK_HP)  # q_pe's rotation pairs (c >= Q_PARTS)
        pair_ok = (pairs < pe_start + PE_CHUNK) & (pairs < P // 2)
        col_a, col_b = _rope_pairs(pairs, P // 2, INTERLEAVED)
        if PDL:
            if c < Q_PARTS:
                _prefetch_rows(wq_ptr, head_row + j, j_ok, stride_wq, K, PREFETCH_K, Q_FORMAT)
            else:
                a_rows = head_row + NOPE + col_a
                b_rows = head_row + NOPE + col_b
                _prefetch_rows(wq_ptr, a_rows, pair_ok, stride_wq, K, PREFETCH_K, Q_FORMAT)
                _prefetch_rows(wq_ptr, b_rows, pair_ok, stride_wq, K, PREFETCH_K, Q_FORMAT)
        pdl_enter(PDL)
        rstd = row_rstd(sq_ptr, rows, row_ok, M, num_sq_parts, K, eps, BLOCK_SQ)  # [BM, 1]
        if c < Q_PARTS:
            q_nope = _rows_dot(
                x_ptr,
                stride_xm,
                rows,
                row_ok,
                wq_ptr,
                head_row + j,
                j_ok,
                stride_wq,
                wq_scale_ptr,
                stride_wq_sn,
                stride_wq_sk,
                K,
                BM,
                BLOCK_NC,
                BK,
                PRECISION,
                Q_FORMAT,
                SCALE_BN,
                SCALE_BK,
            )
            q_nope = (q_nope * rstd).to(w_uk_ptr.dtype.element_ty)  # [BM, BLOCK_NC]
            w_uk_rows = w_uk_ptr + head * stride_uk_head + j[:, None] * stride_uk_row
            part_dst = q_parts_ptr + ((c * M + rows) * HEADS + head)[:, None] * R
            _latent_columns(q_nope, w_uk_rows, j_ok, part_dst, row_ok, 0, R, R, BR, PRECISION)
        else:
            a = _rows_dot(
                x_ptr,
                stride_xm,
                rows,
                row_ok,
                wq_ptr,
                head_row + NOPE + col_a,
                pair_ok,
                stride_wq,
                wq_scale_ptr,
                stride_wq_sn,
                stride_wq_sk,
                K,
                BM,
                BLOCK_HP,
                BK,
                PRECISION,
                Q_FORMAT,
                SCALE_BN,
                SCALE_BK,
            )
            b = _rows_dot(
                x_ptr,
                stride_xm,
                rows,
                row_ok,
                wq_ptr,
                head_row + NOPE + col_b,
                pair_ok,
                stride_wq,
                wq_scale_ptr,
                stride_wq_sn,
                stride_wq_sk,
                K,
                BM,
                BLOCK_HP,
                BK,
                PRECISION,
                Q_FORMAT,
                SCALE_BN,
                SCALE_BK,
            )
            a, b = _rotate(
                a * rstd, b * rstd, pos_ptr, cos_ptr, sin_ptr, rows, row_ok, pairs, pair_ok, P // 2
            )
            _store_q_pe(
                a, b, q_pe_ptr, rows, head, pairs, row_ok[:, None] & pair_ok[None, :], HEADS, P
            )


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count
def absorb_kernel(
    q_ptr,  # [M, HEADS * (NOPE + P)] float32: q_proj's rows (down_kernel)
    w_uk_ptr,  # [HEADS, NOPE, R] (strides stride_uk_head, stride_uk_row, 1): W_UK (mla.py up_weights)
    kv_raw_ptr,
    kv_norm_ptr,
    cache_ptr,
    k_scale_ptr,
    slot_ptr,  # as _write_kv_rows's
    pos_ptr,  # [M]
    cos_ptr,
    sin_ptr,  # [max_positions, P // 2] float32
    q_latent_ptr,  # [M, HEADS, R] out: the query latents
    q_pe_ptr,  # [M, HEADS, P] out: rotated
    M,
    kv_eps,
    stride_uk_head,
    stride_uk_row,
    stride_cache_slot,
    HEADS: tl.constexpr,
    NOPE: tl.constexpr,
    P: tl.constexpr,
    R: tl.constexpr,
    R_PARTS: tl.constexpr,
    R_CHUNK: tl.constexpr,  # R columns a program (a multiple of BR)
    PREFETCH_LINES: tl.constexpr,  # max(1, R_CHUNK // 64): 128-byte lines of a W_UK row's chunk
    BLOCK_NOPE: tl.constexpr,
    BLOCK_HP: tl.constexpr,  # all of q_pe's (and k_pe's) rotation pairs
    BLOCK_R: tl.constexpr,
    BR: tl.constexpr,
    BM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program h * R_PARTS + c: head h's query latent in R columns c * R_CHUNK ... (its whole q_nope times
    those columns of W_UK), and for c = 0 the head's rotated q_pe. The last program (HEADS * R_PARTS)
    writes the kv rows into the cache."""
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BM + tl.arange(0, BM)  # the grid's row tile
    row_ok = rows < M
    if pid == HEADS * R_PARTS:
        pdl_enter(PDL)
        _write_kv_rows(
            kv_raw_ptr,
            kv_norm_ptr,
            cache_ptr,
            k_scale_ptr,
            slot_ptr,
            pos_ptr,
            cos_ptr,
            sin_ptr,
            rows,
            row_ok,
            kv_eps,
            stride_cache_slot,
            R,
            P,
            BLOCK_R,
            BLOCK_HP,
            INTERLEAVED,
        )
    else:
        head = pid // R_PARTS
        c = pid % R_PARTS
        j = tl.arange(0, BLOCK_NOPE)
        j_ok = j < NOPE
        w_uk_rows = w_uk_ptr + head * stride_uk_head + j[:, None] * stride_uk_row  # [BLOCK_NOPE, 1]
        if PDL:  # the W_UK columns this program reads, a 128-byte line per 64 of a row's
            lines = c * R_CHUNK + tl.arange(0, PREFETCH_LINES) * 64
            prefetch_l2(
                w_uk_rows + tl.where(j_ok[:, None] & (lines < R)[None, :], lines[None, :], 0)
            )
        pdl_enter(PDL)
        q_row = q_ptr + rows[:, None] * (HEADS * (NOPE + P)) + head * (NOPE + P)  # [BM, 1]
        q_nope = tl.load(q_row + j[None, :], mask=row_ok[:, None] & j_ok[None, :], other=0.0)
        q_nope = q_nope.to(w_uk_ptr.dtype.element_ty)  # [BM, BLOCK_NOPE]
        dst = q_latent_ptr + (rows * HEADS + head)[:, None] * R
        _latent_columns(
            q_nope, w_uk_rows, j_ok, dst, row_ok, c * R_CHUNK, R, R_CHUNK, BR, PRECISION
        )
        if c == 0:
            pairs = tl.arange(0, BLOCK_HP)
            pair_ok = pairs < P // 2
            col_a, col_b = _rope_pairs(pairs, P // 2, INTERLEAVED)
            ok = row_ok[:, None] & pair_ok[None, :]
            a = tl.load(q_row + NOPE + col_a[None, :], mask=ok, other=0.0)  # [BM, BLOCK_HP]
            b = tl.load(q_row + NOPE + col_b[None, :], mask=ok, other=0.0)
            a, b = _rotate(a, b, pos_ptr, cos_ptr, sin_ptr, rows, row_ok, pairs, pair_ok, P // 2)
            _store_q_pe(a, b, q_pe_ptr, rows, head, pairs, ok, HEADS, P)
