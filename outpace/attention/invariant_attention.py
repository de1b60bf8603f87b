"""Paged attention's batch-invariant variant (attention/triton_kernels.py ``paged_attention`` runs it in the
mode), and the pieces of it MLA's kernels share (attention/mla_kernels.py).

The deterministic mode: EngineConfig.batch_invariant, read through
``outpace.attention.context.batch_invariant``. The fast path's kernels reduce a row's KV in an order
that depends on the batch: BLOCK_M follows max_query_len, the boundary between the unmasked and the
masked pass follows the query length, and the split count and ranges follow the grid size and the
sequence's length. A row at position p is thus rounded differently in a decode step (query_len 1)
and inside a verify forward (query_len 1 + k), and greedy speculation drifts from plain decoding in
bf16. In that mode ``paged_attention`` runs ``_invariant_attention_kernel`` then
``_invariant_combine_kernel`` instead, where a row's result depends only on its own q, the KV rows
it sees and their absolute positions:

- Fixed tiles: BLOCK_M (64 rows in fp16/bf16, whatever the query length), BLOCK_N, warps and stages
  depend on the model's shape and dtype only, so every call runs the same compiled arithmetic, and
  a row's QK^T and PV results do not depend on the other rows of its tile.
- Fixed partition: split j covers the absolute KV rows [j * S, (j + 1) * S), S = 128 (a multiple of
  BLOCK_N), walked in BLOCK_N tiles at absolute multiples of BLOCK_N, in one masked pass: the same
  code for every tile, which updates the row's softmax state tile after tile in increasing order.
  Calls differ only in where a split's walk stops (the last row its query tile may see), and in
  which rows of a tile are masked for the other rows. A KV row the row does not see gets s = -inf,
  so p = 0 exactly and the running max keeps its value: alpha = exp2(0) = 1, l * 1 + 0 = l and
  acc * 1 + 0 * v = acc, so the tiles past the row's visible rows leave its state bit for bit as is.
- Logical rows: the partition, the tiles and the causal cut are over a row's logical KV sequence,
  the rows it sees in cache order (``_attend_invariant``). Without a custom mask those are the
  physical rows 0 .. p. Under a tree mask a node sees the rows before the window, then its
  ancestors and itself, which sit at scattered window rows among siblings it does not see: walked
  in place, its visible keys would land at other columns of other tiles than in plain decoding,
  where the same keys are rows prefix .. p (a tile's row sum and the PV product add them in
  another order). So logical row window_start + j is the (j + 1)-th window row its mask row shows,
  and the node runs exactly plain decoding's arithmetic for its token. The tiles wholly before the
  window are shared by the tile's rows; a tile reaching into the window is gathered once per query
  token of the tile (its rows, the other rows masked: no-ops for them, as above).
- Split count: cdiv(block-table capacity, S), a static grid dimension (the decode and verify graphs
  share one table width). It does not change a row's bits either: the combine folds the row's
  partials in split order 0, 1, ... up to the split holding the last row it may see (its own row
  when causal, the sequence's last row under a tree mask), and a neutral partial (a split where the
  row sees nothing: max -1e30, sum 0, acc 0) is the identity of the merge: the max stays,
  exp2(-1e30 - m) = 0 and exp2(0) = 1 exactly, 0 * x + y = y. Programs whose range is empty for the
  whole query tile write nothing (no row reads them).
- Sliding window: a program walks its split from the fast path's kv_start (whole BLOCK_N tiles
  before it are invisible to every row of the tile: skipping them leaves each row's state as is),
  and the combine starts its fold at the split holding the first row the tile's walk may start at
  (``_invariant_combine_kernel``): the splits before a row's window are neutral for it, so where
  the fold and the walk start does not change its bits.
- One normalisation, in the combine, for every call (one split or many), and no FMA contraction in
  these two kernels (enable_fp_fusion=False): each kernel rounds exactly the operations written.

Two calls that give a row the same q and the same visible KV (same contents, in the same order)
thus run the same floating-point operations on the same operands for it, e.g. a decode row at
position p, the same row inside a verify forward over p - 2 .. p + 3, and a tree node whose path
holds the same tokens, in any ragged batch and with any block-table width. On the GPU this rests on what the batch-invariant linear rests on too:
an MMA or a row reduction gives a row the same bits wherever the row sits in its tile, and an MMA
whose products are all zero returns its accumulator unchanged (tests/kernels/test_triton_attention.py checks
it in bf16 on the GPU). Not so for float32 on the GPU: there a row under a tree mask came out 1 ulp
apart between a decode and a verify call (H100, tests/kernels/test_triton_attention.py's interpreter shapes
run on the GPU, with the tree walked in place, before logical rows); causal rows matched. Not
investigated yet: the mode's bit-exactness is established for bf16/fp16 on the GPU and for every
dtype in the interpreter.

What it costs against the fast path: every call goes through split partials and a second launch,
with a buffer of 4 * cdiv(capacity, S) * num_tokens * heads * (head_dim + 2) bytes (Llama-8B shape,
8192-row tables: about 17 MB for a 64-sequence decode step, 545 MB for a 2048-token prefill chunk),
though only the splits up to each row's last visible row are written and read; decode tiles are
mostly padding (BLOCK_M 64 for 1 token x GQA group), prefill tiles half the fast path's 128 rows
(KV read twice as often); a sequence gets one program per S rows of its length, fewer than the fast
path's split heuristic gives a small decode batch over short contexts; the tree mask's gather runs
only on the tiles reaching into the window, but there once per query token of the tile (BLOCK_Q
tile steps instead of one: 16 at the 8B shape); no FMA contraction.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from outpace.attention import kernel_parts
from outpace.attention.backend import KVScales
from outpace.attention.kernel_parts import (
    LOG2E,
    MAX_BLOCK_M,
    LaunchConfig,
    cache_scales,
    gate_args,
    kv_offsets,
    last_dim_contiguous,
    load_queries,
    mask_args,
    query_rows,
    scale_args,
    softmax_step,
    split_geometry,
    split_partials,
    store_output_row,
)
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.layers.sm_count import num_sms

_INVARIANT_BLOCK_M = 64  # batch-invariant variant: tile rows, whatever the query length (fp16/bf16)
# Batch-invariant variant: KV rows per split. Gemma-3-12B's decode in the mode against the normal path at
# 512 / 256 / 128: -17.7 / -10.9 / -5.7% at batch 1, -12.0 / -7.1 / -8.7% at batch 8 over 512 cached tokens
# (benchmarks/scripts/batch_invariant_speed.py --split-rows, gpu_2026-11-30e call 1): a short context's few
# splits were few programs.
_INVARIANT_SPLIT_ROWS = 128


@triton.jit
def _invariant_step(q, m_i, l_i, acc, k_base, v_base, kv_offs, kv_ok, visible, qk_scale, PRECISION):
    """One BLOCK_N tile of the batch-invariant walk: the same operations for every tile and call
    (scores, mask, online-softmax update); only the KV rows gathered and ``visible`` differ."""
    k = tl.load(k_base + kv_offs, mask=kv_ok, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    s = tl.where(visible, s, float("-inf"))
    v = tl.load(v_base + kv_offs, mask=kv_ok, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
    return softmax_step(s, v, m_i, l_i, acc, PRECISION)


@triton.jit
def _invariant_visible(offs_n, n_ok, q_row, q_pos, sliding_window, SLIDING: tl.constexpr):
    """[BLOCK_M, BLOCK_N]: which logical KV rows ``offs_n`` (those ``n_ok`` real) each row sees: those
    up to its own logical row ``q_row``, and with SLIDING those after q_pos - sliding_window."""
    visible = n_ok[None, :] & (offs_n[None, :] <= q_row[:, None])
    if SLIDING:
        visible = visible & (offs_n[None, :] > q_pos[:, None] - sliding_window)
    return visible


@triton.jit
def mask_row(mask_seq_ptr, query, ok, stride_mask_q, window, BLOCK_W: tl.constexpr):
    """Query ``query``'s custom-mask row (zeros when not ``ok``): (seen [BLOCK_W] int32, rank
    [BLOCK_W]: seen rows up to and including each column, count: its seen rows)."""
    offs_w = tl.arange(0, BLOCK_W)
    seen = tl.load(
        mask_seq_ptr + query * stride_mask_q + offs_w, mask=(offs_w < window) & ok, other=0
    )
    seen = (seen != 0).to(tl.int32)
    return seen, tl.cumsum(seen, axis=0), tl.sum(seen, axis=0)


@triton.jit
def last_logical_rows(
    mask_seq_ptr, q_index, row_ok, stride_mask_q, window, window_start, BLOCK_W: tl.constexpr
):
    """[BLOCK_M] each query row's last visible logical KV row under a custom mask: the rows before the window,
    then as many as its mask row shows (its own logical position)."""
    offs_w = tl.arange(0, BLOCK_W)
    seen = tl.load(
        mask_seq_ptr + q_index[:, None] * stride_mask_q + offs_w[None, :],
        mask=row_ok[:, None] & (offs_w < window)[None, :],
        other=0,
    )  # [BLOCK_M, BLOCK_W]
    return window_start + tl.sum((seen != 0).to(tl.int32), axis=1) - 1


@triton.jit
def _attend_invariant(
    q,  # [BLOCK_M, BLOCK_D] queries
    lo,
    hi,  # logical KV rows lo .. hi - 1; lo a multiple of BLOCK_N
    bt_ptr,  # the sequence's block table row
    k_base,
    v_base,  # cache pointers at slot 0 of this kv head
    stride_cache_slot,
    offs_d,
    d_ok,
    qk_scale,
    q_row,  # [BLOCK_M] each row's logical position (its last visible logical KV row)
    q_index,  # [BLOCK_M] each row's query index in its sequence
    q_start,
    query_len,
    mask_seq_ptr,  # the sequence's custom mask [max_query_len, window] (HAS_MASK)
    stride_mask_q,
    window,
    window_start,  # the mask window's first KV row (HAS_MASK)
    q_pos,
    sliding_window,  # [BLOCK_M] the rows' positions; their window (SLIDING)
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_W: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax from a fresh state over the logical KV rows lo .. hi - 1, in BLOCK_N tiles at
    absolute multiples of BLOCK_N: every tile runs ``_invariant_step``, a row seeing the logical
    rows up to its own (causal on logical rows). A row's logical KV sequence is the rows it sees, in
    cache order: without a custom mask, the physical rows; under one, the rows before the window,
    then the window rows its mask row shows (a tree node's ancestors by depth, then itself): logical
    row window_start + j is the (j + 1)-th of them. That is the sequence plain decoding holds at the
    node's position, in the same tiles: so the node gets the bits decoding would give its token.
    Tiles wholly before the window are shared by the tile's rows; a tile reaching into it is walked
    once per query token of the tile, with that token's rows gathered and the other rows masked.
    A KV row a row does not see gets s = -inf, so p = 0 exactly and the row's running max keeps
    its value (exp2(0) = 1 rescales nothing): a tile the row sees nothing of leaves its state as is."""
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    shared_hi = hi  # tiles below it: logical rows are physical rows, gathered once for the tile
    if HAS_MASK:
        shared_hi = tl.minimum(tl.maximum(lo, window_start // BLOCK_N * BLOCK_N), hi)
    for start in range(lo, shared_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical KV rows
        n_ok = offs_n < hi
        kv_offs, kv_ok = kv_offsets(
            offs_n, n_ok, bt_ptr, stride_cache_slot, offs_d, d_ok, BLOCK_SIZE
        )
        m_i, l_i, acc = _invariant_step(
            q,
            m_i,
            l_i,
            acc,
            k_base,
            v_base,
            kv_offs,
            kv_ok,
            _invariant_visible(offs_n, n_ok, q_row, q_pos, sliding_window, SLIDING),
            qk_scale,
            PRECISION,
        )
    if HAS_MASK:  # the tiles reaching into the window: per query token, its own logical rows
        offs_w = tl.arange(0, BLOCK_W)
        for start in range(shared_hi, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical KV rows
            n_ok = offs_n < hi
            visible = _invariant_visible(offs_n, n_ok, q_row, q_pos, sliding_window, SLIDING)
            for t in range(BLOCK_Q):
                query = q_start + t
                seen, rank, count = mask_row(
                    mask_seq_ptr, query, query < query_len, stride_mask_q, window, BLOCK_W
                )
                if (query < query_len) & (start < window_start + count):
                    # logical row window_start + j: the window column whose rank is j + 1
                    match = (seen[None, :] != 0) & (
                        rank[None, :] == (offs_n - window_start + 1)[:, None]
                    )  # [BLOCK_N, BLOCK_W]
                    column = tl.sum(tl.where(match, offs_w[None, :], 0), axis=1)  # [BLOCK_N]
                    rows = tl.where(offs_n < window_start, offs_n, window_start + column)
                    kv_offs, kv_ok = kv_offsets(
                        rows,
                        n_ok & (offs_n < window_start + count),
                        bt_ptr,
                        stride_cache_slot,
                        offs_d,
                        d_ok,
                        BLOCK_SIZE,
                    )
                    m_i, l_i, acc = _invariant_step(
                        q,
                        m_i,
                        l_i,
                        acc,
                        k_base,
                        v_base,
                        kv_offs,
                        kv_ok,
                        visible & (q_index == query)[:, None],
                        qk_scale,
                        PRECISION,
                    )
    return m_i, l_i, acc


@triton.jit(
    do_not_specialize=[
        "num_tokens",
        "window",
        "sliding_window",
        "stride_table_seq",
        "stride_bt_seq",
        "stride_mask_seq",
        "stride_mask_q",
    ]
)
def _invariant_attention_kernel(
    q_ptr,  # [num_tokens, heads, head_dim]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks * block_size (flat slots), kv_heads, head_dim]
    part_acc_ptr,  # [num_splits, num_tokens, heads, HEAD_DIM] float32
    part_max_ptr,
    part_sum_ptr,  # [num_splits, num_tokens, heads] float32
    token_table_ptr,  # [num_seqs, max_query_len] int32
    block_tables_ptr,  # [num_seqs, max_blocks] int64
    seq_lens_ptr,
    query_lens_ptr,  # [num_seqs] int64
    custom_mask_ptr,  # [num_seqs, max_query_len, window] uint8 (HAS_MASK)
    positions_ptr,  # [num_tokens] int64: each token's position (SLIDING)
    k_scale_ptr,
    v_scale_ptr,  # [] float32: an FP8 cache's scales (KV_SCALED)
    qk_scale,  # softmax scale * log2(e)
    num_tokens,
    window,
    sliding_window,
    stride_qt,
    stride_qh,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    stride_bt_seq,
    stride_mask_seq,
    stride_mask_q,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_W: tl.constexpr,  # the custom mask's window padded to a power of two (HAS_MASK)
    SPLIT_ROWS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
    KV_SCALED: tl.constexpr,  # an FP8 cache: k and v read as stored * scale
):
    """Program (seq * KV_HEADS + kv_head, query tile, p) of P along the grid's last axis: for each split
    p, p + P, ... that the tile reaches, the partial of every row of the tile over the logical KV rows
    [split * SPLIT_ROWS, (split + 1) * SPLIT_ROWS) (``_attend_invariant``; under a custom mask the tile's last
    row is the sequence's, past every row's logical end), cut at the last row the tile can see and, with a
    sliding window, started at the tile of the first row any of its rows sees (``split_geometry``'s kv_start:
    the tiles skipped would leave every row's state as is). Writes nothing when that range is empty for the
    whole tile (no row reads it). Each split's partial is computed alone, from a fresh state, whichever program
    takes it: P changes no bits (``invariant_programs`` picks it), and no program is spent on the splits past
    the tile's rows (a block table's capacity holds hundreds of 128-row splits).
    """
    seq, kv_head, q_start, first, seq_len, query_len, q_index, head, row_ok, token, offs_d, d_ok = (
        query_rows(
            token_table_ptr,
            seq_lens_ptr,
            query_lens_ptr,
            stride_table_seq,
            KV_HEADS,
            GROUP,
            HEAD_DIM,
            BLOCK_Q,
            BLOCK_M,
            BLOCK_D,
        )
    )
    q = load_queries(q_ptr, token, head, row_ok, offs_d, d_ok, stride_qt, stride_qh)
    q_pos = q_index  # unused without SLIDING
    if SLIDING:
        q_pos = tl.load(positions_ptr + token, mask=row_ok, other=0).to(tl.int32)  # [BLOCK_M]

    kv_start, kv_end, _, prefix, _ = split_geometry(
        seq_lens_ptr,
        query_lens_ptr,
        seq,
        q_start,
        window,
        sliding_window,
        1,
        HAS_MASK,
        SLIDING,
        BLOCK_Q,
        BLOCK_N,
    )
    window_start = seq_len - window  # HAS_MASK
    mask_seq_ptr = custom_mask_ptr + seq * stride_mask_seq
    q_row = prefix + q_index  # [BLOCK_M] each row's logical position: causal, its KV row
    if HAS_MASK:  # the rows before the window, and the window rows its mask row shows
        q_row = last_logical_rows(
            mask_seq_ptr, q_index, row_ok, stride_mask_q, window, window_start, BLOCK_W
        )
    k_scale, v_scale = cache_scales(k_scale_ptr, v_scale_ptr, KV_SCALED)
    for split in range(first, tl.cdiv(kv_end, SPLIT_ROWS), tl.num_programs(2)):
        kv_lo = tl.maximum(split * SPLIT_ROWS, kv_start)
        kv_hi = tl.minimum(split * SPLIT_ROWS + SPLIT_ROWS, kv_end)
        m_i, l_i, acc = _attend_invariant(
            q,
            kv_lo,
            kv_hi,
            block_tables_ptr + seq * stride_bt_seq,
            k_cache_ptr + kv_head * stride_cache_head,
            v_cache_ptr + kv_head * stride_cache_head,
            stride_cache_slot,
            offs_d,
            d_ok,
            qk_scale * k_scale,
            q_row,
            q_index,
            q_start,
            query_len,
            mask_seq_ptr,
            stride_mask_q,
            window,
            window_start,
            q_pos,
            sliding_window,
            BLOCK_SIZE,
            BLOCK_M,
            BLOCK_N,
            BLOCK_D,
            BLOCK_Q,
            BLOCK_W,
            HAS_MASK,
            SLIDING,
            PRECISION,
        )

        acc = acc * v_scale  # (an FP8 cache's; 1.0 else)
        written = tl.where(
            kv_lo < kv_hi, row_ok, False
        )  # a row that sees nothing here gets a neutral partial
        part = (split * num_tokens + token.to(tl.int64)) * (KV_HEADS * GROUP) + head  # [BLOCK_M]
        tl.store(part_max_ptr + part, m_i, mask=written)
        tl.store(part_sum_ptr + part, l_i, mask=written)
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
            acc,
            mask=written[:, None] & d_ok[None, :],
        )


@triton.jit
def merge_partials(m, l, acc, m_j, l_j, acc_j):
    """Online-softmax merge of partial j into the running state. A neutral partial (m_j = -1e30,
    l_j = 0, acc_j = 0) is the identity: m_new = m, exp2(0) = 1 and exp2(-1e30 - m) = 0 exactly,
    so l * 1 + 0 * 0 = l and acc * 1 + 0 * 0 = acc."""
    m_new = tl.maximum(m, m_j)
    a = tl.exp2(m - m_new)
    b = tl.exp2(m_j - m_new)
    return m_new, l * a + l_j * b, acc * a + acc_j * b


@triton.jit(do_not_specialize=["num_tokens", "window", "sliding_window"])
def _invariant_combine_kernel(
    part_acc_ptr,  # [num_splits, num_tokens, heads, HEAD_DIM] float32
    part_max_ptr,
    part_sum_ptr,  # [num_splits, num_tokens, heads] float32
    out_ptr,  # [num_tokens, heads, head_dim]
    gate_ptr,  # [num_tokens, heads(, head_dim)]: the output gate's logits (GATE)
    seq_index_ptr,
    query_index_ptr,  # [num_tokens] int64
    seq_lens_ptr,
    query_lens_ptr,  # [num_seqs] int64
    num_tokens,
    window,
    sliding_window,
    stride_ot,
    stride_oh,
    stride_gt,
    stride_gh,
    stride_gd,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    GATE: tl.constexpr,  # an output gate (``output_values``)
):
    """Program (token, head): folds the row's partials in split order, from split 0 (with a sliding
    window: the split holding the first row its tile's walk may start at, see below) up to the split
    holding the last KV row the row may see (its own row under the causal mask; the sequence's
    last row under a custom mask, the splits past its visible rows being neutral), and normalises.
    The first split: under the causal mask the one holding row p - sliding_window + 1 for the row's
    position p, whose tile's walk started at or before it; under a custom mask the one the tile's walk
    started in (every query of the mask's rows shares that bound). Splits before the row's first
    visible row are neutral, so where the fold starts does not change the row's bits. The output is stored
    gated by GATE."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq = tl.load(seq_index_ptr + token)
    seq_len = tl.load(seq_lens_ptr + seq)
    if HAS_MASK:
        kv_end = seq_len
        first_pos = seq_len - window
    else:
        kv_end = seq_len - tl.load(query_lens_ptr + seq) + tl.load(query_index_ptr + token) + 1
        first_pos = kv_end - 1
    first_split = 0
    if SLIDING:
        first_split = tl.maximum(first_pos - sliding_window + 1, 0) // SPLIT_ROWS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    part = token * HEADS + head
    p0 = first_split * num_tokens * HEADS + part
    m = tl.load(part_max_ptr + p0)
    l = tl.load(part_sum_ptr + p0)
    acc = tl.load(part_acc_ptr + p0 * HEAD_DIM + offs_d, mask=d_ok, other=0.0)  # [BLOCK_D]
    for j in range(first_split + 1, tl.cdiv(kv_end, SPLIT_ROWS)):
        pj = j * num_tokens * HEADS + part
        m, l, acc = merge_partials(
            m,
            l,
            acc,
            tl.load(part_max_ptr + pj),
            tl.load(part_sum_ptr + pj),
            tl.load(part_acc_ptr + pj * HEAD_DIM + offs_d, mask=d_ok, other=0.0),
        )
    out = acc / tl.where(l > 0, l, 1.0)
    store_output_row(
        out,
        out_ptr,
        token,
        head,
        stride_ot,
        stride_oh,
        offs_d,
        d_ok,
        gate_ptr,
        stride_gt,
        stride_gh,
        stride_gd,
        GATE,
    )


def invariant_programs(num_splits: int, tiles: int, device: torch.device) -> int:
    """Programs a query tile of the batch-invariant variant spreads its splits over (the grid's last axis):
    about ``kernel_parts.programs_per_sm`` programs an SM over ``tiles`` tiles, at most one a split. Which
    program takes a split changes none of its bits (``_invariant_attention_kernel``), so this may follow the
    batch."""
    return max(
        1,
        min(num_splits, math.ceil(kernel_parts.programs_per_sm * num_sms(device) / max(tiles, 1))),
    )


def invariant_launch_config(
    kv_heads: int,
    group: int,
    head_dim: int,
    elem_size: int,
    max_query_len: int,
    max_kv_rows: int,
    split_rows: int | None = None,
) -> LaunchConfig:
    """Tiles of the batch-invariant variant: block_m, block_n, split_rows, warps and stages depend on
    the model's shape and dtype only, never on the batch; the grid (query tiles, and splits: one per
    ``split_rows`` rows of the block table's capacity ``max_kv_rows``) is the only thing that does."""
    if group > MAX_BLOCK_M:
        raise ValueError(f"{group} q heads per kv head exceed a {MAX_BLOCK_M}-row tile")
    fp32 = elem_size >= 4
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m = max(
        _INVARIANT_BLOCK_M if not fp32 or block_d <= 64 else 16, triton.next_power_of_2(group)
    )
    block_n = 32 if fp32 or block_d > 128 else 64
    split_rows = split_rows or _INVARIANT_SPLIT_ROWS
    if split_rows % block_n:
        raise ValueError(f"split_rows={split_rows} must be a multiple of the {block_n}-row KV tile")
    block_q = block_m // group
    return LaunchConfig(
        block_q=block_q,
        block_m=block_m,
        block_n=block_n,
        block_n_tail=block_n,
        block_d=block_d,
        num_q_tiles=math.ceil(max_query_len / block_q),
        num_splits=max(1, math.ceil(max_kv_rows / split_rows)),
        num_warps=8,
        num_stages=2 if fp32 or block_d > 256 else 3,  # (as launch_config's wide heads)
        split_rows=split_rows,
    )


def invariant_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    token_table: torch.Tensor,
    scale: float,
    split_rows: int | None,
    sliding_window: int | None,
    positions: torch.Tensor | None,
    kv_scales: KVScales | None,
    out_gate: torch.Tensor | None,
) -> torch.Tensor:
    """``paged_attention``'s batch-invariant variant: always split-KV over the fixed partition, then
    the ordered combine (see the module docstring), which applies ``out_gate``."""
    num_tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    q = last_dim_contiguous(q)
    cfg = invariant_launch_config(
        kv_heads,
        heads // kv_heads,
        head_dim,
        max(q.element_size(), k_cache.element_size()),
        meta.max_query_len,
        meta.block_tables.shape[1] * meta.block_size,
        split_rows,
    )
    out = torch.empty(num_tokens, heads, head_dim, dtype=q.dtype, device=q.device)
    gate, gate_strides, gate_kind = gate_args(out_gate, out)
    part_acc, part_max, part_sum = split_partials(
        cfg.num_splits, num_tokens, heads, head_dim, q.device
    )
    mask_arg, window, mask_strides = mask_args(meta)
    sliding = sliding_window is not None
    k_scale, v_scale = scale_args(k_cache, kv_scales)
    # NOTE: no FMA contraction, so every kernel rounds exactly the operations it is written with.
    tiles = meta.num_seqs * kv_heads * cfg.num_q_tiles
    programs = invariant_programs(cfg.num_splits, tiles, q.device)
    _invariant_attention_kernel[(meta.num_seqs * kv_heads, cfg.num_q_tiles, programs)](
        q,
        k_cache,
        v_cache,
        part_acc,
        part_max,
        part_sum,
        token_table,
        meta.block_tables,
        meta.seq_lens,
        meta.query_lens,
        mask_arg,
        positions if sliding else meta.seq_lens,
        k_scale,
        v_scale,
        scale * LOG2E,
        num_tokens,
        window,
        sliding_window or 0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        token_table.stride(0),
        meta.block_tables.stride(0),
        *mask_strides,
        KV_HEADS=kv_heads,
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=meta.block_size,
        BLOCK_Q=cfg.block_q,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_D=cfg.block_d,
        BLOCK_W=max(16, triton.next_power_of_2(window)),
        SPLIT_ROWS=cfg.split_rows,
        HAS_MASK=meta.custom_mask is not None,
        SLIDING=sliding,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_SCALED=kv_scales is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        enable_fp_fusion=False,
    )
    _invariant_combine_kernel[(num_tokens, heads)](
        part_acc,
        part_max,
        part_sum,
        out,
        gate,
        meta.token_seq_index,
        meta.token_query_index,
        meta.seq_lens,
        meta.query_lens,
        num_tokens,
        window,
        sliding_window or 0,
        out.stride(0),
        out.stride(1),
        *gate_strides,
        HEADS=heads,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        SPLIT_ROWS=cfg.split_rows,
        HAS_MASK=meta.custom_mask is not None,
        SLIDING=sliding,
        GATE=gate_kind,
        enable_fp_fusion=False,
    )
    return out
