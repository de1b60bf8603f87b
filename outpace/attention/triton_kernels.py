"""Triton kernels for attention over the paged KV cache, and their launchers.

Three kernels per call, all with grids fixed by tensor shapes and the metadata's python ints, and
no host synchronisation, so a call can be captured in a CUDA graph:

1. ``_write_kv_kernel`` (one program per new token): stores the token's k/v rows into its cache
   slot and records the token's index in ``token_table[seq, query_index]``, which lets the
   attention kernel find a sequence's query rows whatever their order in the batch.
2. ``_attention_kernel``, grid (num_seqs * kv_heads, num_q_tiles, num_splits). A program owns
   one sequence, one kv head, a tile of BLOCK_Q of the sequence's new tokens and one of
   ``num_splits`` contiguous ranges of its KV rows ("flash decoding"). The tile's rows pack the
   query tokens with the GQA group's q heads, row m = (query q_start + m // GROUP, head
   kv_head * GROUP + m % GROUP), so that QK^T and PV are tensor-core ``tl.dot``s with
   M = BLOCK_Q * GROUP even for a single decode token. KV rows are gathered row by row, whatever
   the cache's block size: the physical slot of row r is
   block_tables[seq, r // block_size] * block_size + r % block_size. The range is visited in two
   passes (``_attend``): the rows every row of the tile sees (the cached prefix, or everything
   before the tree window) in BLOCK_N tiles with no per-element mask, then the masked rest (the
   causal diagonal, or the tree window) in small BLOCK_N_TAIL tiles, which keeps the custom
   mask's gather within the registers. Softmax is online in float32, in base 2 (the scale is
   folded with log2(e)).
   Sliding window (a layer's ``sliding_window`` W: a query at position p sees only the KV rows
   r > p - W, transformers' sliding_window_overlay; positions come from the forward's positions
   tensor, since a tree's rows sit at positions other than their KV rows): the tile's KV range
   starts at kv_start, the BLOCK_N tile holding row first_pos - W + 1 of its first query, so the
   rows before every row's window are never read, and a third pass comes first: the rows at the
   window's edge (below kv_end - W, seen by some rows of the tile only), in BLOCK_N tiles masked
   by the window. The two passes above then mask by the window too where a row could fall outside
   it (the masked rest, for windows shorter than the tile). The cache keeps the rows older than
   the window (masked, not freed).
   With one split the program normalises and writes the output; otherwise it writes its
   unnormalised partial (running max, sum and accumulator) for every token and head it owns. A
   split whose range is empty (past the rows its tile sees: most of them for short sequences in a
   grid sized for long ones) returns at once, except split 0, which always writes.
3. ``split_combine_kernel`` (attention/split_combine.py; one program per token and q head, only when
   num_splits > 1): merges the partials of the splits that ran for the token's tile (it recomputes the
   split geometry from the metadata, ``split_geometry``).

FP8 cache (EngineConfig.kv_cache_dtype "fp8", attention/kv_quant.py): the write kernel stores
clamp(x / scale) rounded to e4m3 (``fp8_rows``), and both attention variants load the float8 rows,
convert them in registers and take the layer's scales by pointer (capturable, read once a program):
the k scale multiplies the softmax scale, the v scale the attended values before the output or the
partials are written, so the split geometry, the masks and the batch-invariant walk are unchanged.

Output gate (``paged_attention``'s ``out_gate``: Step-3.5's one logit per head, Qwen3-Next's and Qwen3.5's one
per element, read in place from a packed projection's view): the kernel that stores the output (the attention
kernel with one split, the combine with several, the batch-invariant combine in that mode) stores it rounded
to its dtype times sigmoid(gate) (``_output_values``, with ``_sigmoid_gate_kernel``'s arithmetic
``sigmoid_gated``, layers/fused_kernels.py): what attention followed by ``sigmoid_gate`` computes, for one
launch fewer. In Triton's interpreter and in decode on the H200 the bits are the same; in bf16 verify tiles on
the H200 1 to 3 elements of 131072 differed by one ulp (tests/kernels/test_gated_attention.py; the gated
kernel is another compilation of the attention, where the last bit was not traced further). A constexpr GATE
(0 none, 1 per head, 2 per element) leaves ungated launches compiled as before; split attention kernels get
GATE 0 (their combine gates).

The KV length is read from ``seq_lens`` inside the kernel. The number of splits is chosen from
static shapes so that the grid fills the GPU (about two programs per SM); each program's range is
then a BLOCK_N multiple of ceil((kv_end - kv_start) / num_splits) for its own sequence's length
(and window), so short sequences in a wide block table still spread over every split.

Compiled variants depend only on the model's shape, the block size, the tile rows (16 to 128),
three flags (split or not, custom mask or not, sliding window or not) and the output gate's kind:
integer arguments that change from call to call are marked ``do_not_specialize``, so Triton does not
compile a variant per value class.

The batch-invariant variant (deterministic mode) is attention/invariant_attention.py; ``paged_attention``
runs it in that mode. The building blocks the kernels share with it and with MLA's are attention/kernel_parts.py.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from outpace.attention import kernel_parts
from outpace.attention.backend import KVScales
from outpace.attention.context import batch_invariant
from outpace.attention.invariant_attention import invariant_paged_attention
from outpace.attention.kernel_parts import (
    LOG2E,
    MAX_BLOCK_M,
    LaunchConfig,
    cache_scales,
    fp8_rows,
    gate_args,
    kv_offsets,
    last_dim_contiguous,
    load_queries,
    mask_args,
    output_values,
    query_rows,
    scale_args,
    softmax_step,
    split_geometry,
    split_partials,
)
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.attention.split_combine import combine_splits
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options
from outpace.layers.sm_count import num_sms

_MAX_SPLITS = 64


@triton.jit(do_not_specialize=["stride_table_seq"])
def _write_kv_kernel(
    k_ptr,
    v_ptr,  # [num_tokens, kv_heads, head_dim]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks * block_size (flat slots), kv_heads, head_dim]
    slot_ptr,
    seq_index_ptr,
    query_index_ptr,  # [num_tokens] int64
    token_table_ptr,  # [num_seqs, max_query_len] int32, written here
    k_scale_ptr,
    v_scale_ptr,  # [] float32: an FP8 cache's scales (QUANT)
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,  # an FP8 cache: stores clamp(x / scale) (attention/kv_quant.py)
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_h[:, None] < KV_HEADS) & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_H, BLOCK_D]
    cache_offs = slot * stride_cache_slot + offs_h[:, None] * stride_cache_head + offs_d[None, :]
    k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=ok)
    v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=ok)
    if QUANT:
        k = fp8_rows(k, k_scale_ptr)
        v = fp8_rows(v, v_scale_ptr)
    tl.store(k_cache_ptr + cache_offs, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(v_cache_ptr + cache_offs, v.to(v_cache_ptr.dtype.element_ty), mask=ok)
    seq = tl.load(seq_index_ptr + token)
    query_index = tl.load(query_index_ptr + token)
    tl.store(token_table_ptr + seq * stride_table_seq + query_index, token)


@triton.jit
def _kv_rows(
    start,
    hi,
    bt_ptr,
    stride_cache_slot,
    offs_d,
    d_ok,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """KV rows start .. start + BLOCK_N - 1 (those below ``hi`` are real): each row's cache offsets
    (``kv_offsets``)."""
    offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] KV rows
    n_ok = offs_n < hi
    kv_offs, kv_ok = kv_offsets(offs_n, n_ok, bt_ptr, stride_cache_slot, offs_d, d_ok, BLOCK_SIZE)
    return offs_n, n_ok, kv_offs, kv_ok


@triton.jit
def _kv_range(
    seq_lens_ptr,
    query_lens_ptr,
    window,
    sliding_window,
    num_splits,
    KV_HEADS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The KV rows of program (sequence * KV_HEADS + kv head, query tile, split): its split of the
    rows its query tile can see, kv_lo .. kv_hi - 1; shared_end and prefix (``split_geometry``); and
    slide_end: with a sliding window, rows from it on are inside every row's window (the tile's
    queries sit at positions below kv_end)."""
    kv_start, kv_end, shared_end, prefix, split_len = split_geometry(
        seq_lens_ptr,
        query_lens_ptr,
        tl.program_id(0) // KV_HEADS,
        tl.program_id(1) * BLOCK_Q,
        window,
        sliding_window,
        num_splits,
        HAS_MASK,
        SLIDING,
        BLOCK_Q,
        BLOCK_N,
    )
    kv_lo = kv_start + tl.program_id(2) * split_len
    return kv_lo, tl.minimum(kv_lo + split_len, kv_end), shared_end, prefix, kv_end - sliding_window


@triton.jit
def _attend(
    q,
    m_i,
    l_i,
    acc,  # [BLOCK_M, BLOCK_D] queries; online softmax state
    lo,
    hi,  # KV rows lo .. hi - 1
    bt_ptr,  # the sequence's block table row
    k_base,
    v_base,  # cache pointers at slot 0 of this kv head
    stride_cache_slot,
    offs_d,
    d_ok,
    qk_scale,
    q_row,
    row_ok,  # [BLOCK_M] each row's own KV row; rows that are real
    mask_rows,
    window_start,  # [BLOCK_M] custom-mask row pointers; the window's first KV row
    q_pos,
    sliding_window,  # [BLOCK_M] each row's position; its window (SLIDING)
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,  # 0: every row sees every KV row, 1: causal, 2: custom mask (every
    # KV row in its window)
    SLIDING: tl.constexpr,  # and, on top: a row at position p sees only rows r > p - sliding_window
    PRECISION: tl.constexpr,
):
    """Online softmax of the tile's rows over KV rows lo .. hi - 1, in BLOCK_N tiles."""
    for start in range(lo, hi, BLOCK_N):
        offs_n, n_ok, kv_offs, kv_ok = _kv_rows(
            start, hi, bt_ptr, stride_cache_slot, offs_d, d_ok, BLOCK_SIZE, BLOCK_N
        )
        k = tl.load(k_base + kv_offs, mask=kv_ok, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if MASK == 0:
            visible = n_ok[None, :]
        elif MASK == 1:
            visible = n_ok[None, :] & (offs_n[None, :] <= q_row[:, None])
        else:
            in_mask = row_ok[:, None] & n_ok[None, :]
            allowed = tl.load(
                mask_rows[:, None] + (offs_n - window_start)[None, :], mask=in_mask, other=0
            )
            visible = in_mask & (allowed != 0)
        if SLIDING:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_base + kv_offs, mask=kv_ok, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, PRECISION)
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
        "num_splits",
    ]
)
def _attention_kernel(
    q_ptr,  # [num_tokens, heads, head_dim]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks * block_size (flat slots), kv_heads, head_dim]
    out_ptr,  # [num_tokens, heads, head_dim]; written unless SPLIT_KV
    gate_ptr,  # [num_tokens, heads(, head_dim)]: the output gate's logits (GATE, unless SPLIT_KV)
    part_acc_ptr,  # [num_splits, num_tokens, heads, HEAD_DIM] float32 (SPLIT_KV)
    part_max_ptr,
    part_sum_ptr,  # [num_splits, num_tokens, heads] float32 (SPLIT_KV)
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
    stride_ot,
    stride_oh,
    stride_gt,
    stride_gh,
    stride_gd,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    stride_bt_seq,
    stride_mask_seq,
    stride_mask_q,
    num_splits,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_N_TAIL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    KV_SCALED: tl.constexpr,  # an FP8 cache: k and v read as stored * scale
    GATE: tl.constexpr,  # an output gate: 0 none, 1 one logit a head, 2 one an element (``output_values``)
):
    # The program's KV rows and query rows come from the metadata, block tables and token table, which
    # kernels launched without PDL wrote (the metadata's builder, or write_kv), so they are complete
    # before this kernel starts: read before waiting on the previous kernel (q and positions come after).
    kv_lo, kv_hi, shared_end, prefix, slide_end = _kv_range(
        seq_lens_ptr,
        query_lens_ptr,
        window,
        sliding_window,
        num_splits,
        KV_HEADS,
        HAS_MASK,
        SLIDING,
        BLOCK_Q,
        BLOCK_N,
    )
    seq, kv_head, _, split, seq_len, _, q_index, head, row_ok, token, offs_d, d_ok = query_rows(
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
    pdl_enter(PDL)
    # A split past the rows its tile sees does nothing: the combine reads only the splits that have
    # rows (split 0 always runs, so every row gets a result).
    if (kv_lo < kv_hi) | (tl.program_id(2) == 0):
        q = load_queries(q_ptr, token, head, row_ok, offs_d, d_ok, stride_qt, stride_qh)
        q_pos = q_index  # unused without SLIDING
        if SLIDING:
            q_pos = tl.load(positions_ptr + token, mask=row_ok, other=0).to(tl.int32)  # [BLOCK_M]
        k_scale, v_scale = cache_scales(k_scale_ptr, v_scale_ptr, KV_SCALED)
        _attention_program(
            q,
            k_cache_ptr,
            v_cache_ptr,
            out_ptr,
            gate_ptr,
            part_acc_ptr,
            part_max_ptr,
            part_sum_ptr,
            block_tables_ptr,
            custom_mask_ptr,
            qk_scale * k_scale,
            v_scale,
            num_tokens,
            window,
            stride_ot,
            stride_oh,
            stride_gt,
            stride_gh,
            stride_gd,
            stride_cache_slot,
            stride_cache_head,
            stride_bt_seq,
            stride_mask_seq,
            stride_mask_q,
            kv_lo,
            kv_hi,
            shared_end,
            prefix,
            slide_end,
            seq,
            kv_head,
            split,
            seq_len,
            q_index,
            head,
            row_ok,
            token,
            q_pos,
            sliding_window,
            offs_d,
            d_ok,
            KV_HEADS,
            GROUP,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_M,
            BLOCK_N,
            BLOCK_N_TAIL,
            BLOCK_D,
            SPLIT_KV,
            HAS_MASK,
            SLIDING,
            PRECISION,
            GATE,
        )


@triton.jit
def _attention_program(
    q,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    gate_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    block_tables_ptr,
    custom_mask_ptr,
    qk_scale,
    v_scale,
    num_tokens,
    window,
    stride_ot,
    stride_oh,
    stride_gt,
    stride_gh,
    stride_gd,
    stride_cache_slot,
    stride_cache_head,
    stride_bt_seq,
    stride_mask_seq,
    stride_mask_q,
    kv_lo,
    kv_hi,
    shared_end,
    prefix,
    slide_end,
    seq,
    kv_head,
    split,
    seq_len,
    q_index,
    head,
    row_ok,
    token,
    q_pos,
    sliding_window,
    offs_d,
    d_ok,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_N_TAIL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
    GATE: tl.constexpr,
):
    """``_attention_kernel``'s work for a program with KV rows kv_lo .. kv_hi - 1 and the tile's queries
    q [BLOCK_M, BLOCK_D] (rows: ``query_rows``; positions q_pos, read with SLIDING only). ``qk_scale``
    holds an FP8 cache's k scale, ``v_scale`` (1.0 otherwise) multiplies the attended values. Without
    SPLIT_KV the output is stored gated by GATE (``output_values``)."""
    # Online softmax state. The running max starts finite, so rows that have seen no visible key
    # yet keep exp2(-inf - max) = 0 and never compute inf - inf.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_ptr = block_tables_ptr + seq * stride_bt_seq
    k_base = k_cache_ptr + kv_head * stride_cache_head
    v_base = v_cache_ptr + kv_head * stride_cache_head
    mask_rows = (
        custom_mask_ptr + seq * stride_mask_seq + q_index * stride_mask_q
    )  # [BLOCK_M] (HAS_MASK)
    # With a sliding window, first the rows below slide_end, at its edge: some rows of the tile see them,
    # others not. They lie before a custom mask's window (it is at most sliding_window wide), so a custom
    # mask needs no mask there, and causal rows only when the window is shorter than the tile.
    edge_end = kv_lo
    if SLIDING:
        edge_end = tl.minimum(kv_hi, tl.maximum(kv_lo, slide_end))
        m_i, l_i, acc = _attend(
            q,
            m_i,
            l_i,
            acc,
            kv_lo,
            edge_end,
            bt_ptr,
            k_base,
            v_base,
            stride_cache_slot,
            offs_d,
            d_ok,
            qk_scale,
            prefix + q_index,
            row_ok,
            mask_rows,
            seq_len - window,
            q_pos,
            sliding_window,
            BLOCK_SIZE,
            BLOCK_N,
            0 if HAS_MASK else 1,
            True,
            PRECISION,
        )
    # Then the rows every row of the tile sees (the long, unmasked part), then the masked rest.
    shared_hi = tl.maximum(edge_end, tl.minimum(kv_hi, shared_end))
    m_i, l_i, acc = _attend(
        q,
        m_i,
        l_i,
        acc,
        edge_end,
        shared_hi,
        bt_ptr,
        k_base,
        v_base,
        stride_cache_slot,
        offs_d,
        d_ok,
        qk_scale,
        prefix + q_index,
        row_ok,
        mask_rows,
        seq_len - window,
        q_pos,
        sliding_window,
        BLOCK_SIZE,
        BLOCK_N,
        0,
        False,
        PRECISION,
    )
    m_i, l_i, acc = _attend(
        q,
        m_i,
        l_i,
        acc,
        shared_hi,
        kv_hi,
        bt_ptr,
        k_base,
        v_base,
        stride_cache_slot,
        offs_d,
        d_ok,
        qk_scale,
        prefix + q_index,
        row_ok,
        mask_rows,
        seq_len - window,
        q_pos,
        sliding_window,
        BLOCK_SIZE,
        BLOCK_N_TAIL,
        2 if HAS_MASK else 1,
        SLIDING,
        PRECISION,
    )

    acc = acc * v_scale  # (an FP8 cache's; 1.0 else)
    out_ok = row_ok[:, None] & d_ok[None, :]
    if not SPLIT_KV:
        out = output_values(
            acc / tl.where(l_i > 0, l_i, 1.0)[:, None],
            out_ptr.dtype.element_ty,
            gate_ptr,
            token[:, None],
            head[:, None],
            row_ok[:, None],
            offs_d[None, :],
            d_ok[None, :],
            stride_gt,
            stride_gh,
            stride_gd,
            GATE,
        )
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out,
            mask=out_ok,
        )
    else:
        part = (split * num_tokens + token) * (KV_HEADS * GROUP) + head  # [BLOCK_M]
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_ok)


def launch_config(
    num_seqs: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    elem_size: int,
    max_query_len: int,
    max_kv_rows: int,
    num_sms: int,
    num_splits: int | None = None,
) -> LaunchConfig:
    """Pick tiles for the batch's shape. ``max_kv_rows`` is the block table's capacity in rows;
    ``elem_size`` the bytes of a q or cache element. The tiles were checked (compiled for sm_90)
    to fit the registers without spilling for bf16/fp16 head_dim <= 256 and fp32 head_dim <= 128.

    Without ``num_splits``, the KV is split only when (seq, kv_head, query tile) programs alone
    would leave SMs idle: into enough splits to reach ~``kernel_parts.programs_per_sm`` programs per SM, at
    most one per BLOCK_N rows of capacity.
    """
    if group > MAX_BLOCK_M:
        raise ValueError(f"{group} q heads per kv head exceed a {MAX_BLOCK_M}-row tile")
    fp32 = (
        elem_size >= 4
    )  # tl.dot in float32 runs on FMAs with its operands in registers: smaller tiles
    block_d = max(16, triton.next_power_of_2(head_dim))
    wide = (
        block_d > 256
    )  # Gemma 4's 512-wide global heads: Q, K and V tiles within Hopper's shared memory
    max_block_m = 64 if wide else MAX_BLOCK_M if not fp32 else 64 if block_d <= 64 else 16
    block_m = min(
        max(16, triton.next_power_of_2(max_query_len * group)),
        max(max_block_m, triton.next_power_of_2(group)),
    )
    block_q = (
        block_m // group
    )  # a full tile even for shorter queries: one compiled variant per block_m
    block_n = 32 if fp32 or block_d > 128 else 64
    num_q_tiles = math.ceil(max_query_len / block_q)
    if num_splits is None:
        programs = num_seqs * kv_heads * num_q_tiles
        target = kernel_parts.programs_per_sm * num_sms
        num_splits = (
            1
            if programs >= target
            else max(
                1, min(math.ceil(target / programs), math.ceil(max_kv_rows / block_n), _MAX_SPLITS)
            )
        )
    return LaunchConfig(
        block_q=block_q,
        block_m=block_m,
        block_n=block_n,
        block_n_tail=16,
        block_d=block_d,
        num_q_tiles=num_q_tiles,
        num_splits=num_splits,
        num_warps=8 if fp32 or block_m > 64 else 4,
        num_stages=2 if fp32 or wide or block_m > 64 else 3,
    )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    kv_scales: KVScales | None = None,
) -> torch.Tensor:
    """Store k, v [num_tokens, kv_heads, head_dim] at ``meta.slot_mapping`` in the caches
    ([num_blocks, block_size, kv_heads, head_dim], contiguous); an FP8 cache quantized with its
    ``kv_scales`` (attention/kv_quant.py).

    Returns the token table [num_seqs, max_query_len] int32: the index of each (sequence, query
    index) token in the batch; entries past a sequence's query length are left unset.
    """
    num_tokens, kv_heads, head_dim = k.shape
    k, v = last_dim_contiguous(k), last_dim_contiguous(v)
    token_table = torch.empty(meta.num_seqs, meta.max_query_len, dtype=torch.int32, device=k.device)
    k_scale, v_scale = scale_args(k_cache, kv_scales)
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        meta.slot_mapping,
        meta.token_seq_index,
        meta.token_query_index,
        token_table,
        k_scale,
        v_scale,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        token_table.stride(0),
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        QUANT=kv_scales is not None,
    )
    return token_table


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    token_table: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    split_rows: int | None = None,
    sliding_window: int | None = None,
    positions: torch.Tensor | None = None,
    kv_scales: KVScales | None = None,
    out_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [num_tokens, heads, head_dim] over the caches ([num_blocks, block_size, kv_heads, head_dim],
    already holding the new tokens' KV) -> [num_tokens, heads, head_dim] in q's dtype. An FP8 cache
    comes with its ``kv_scales`` and is read in place (attention/kv_quant.py).
    ``out_gate``: an attention output gate's logits, [num_tokens, heads] (one a head: Step-3.5) or
    [num_tokens, heads, head_dim] (one an element: Qwen3-Next), any strides (a view of a packed projection),
    float32 or q's dtype: the kernel that stores the output (the attention kernel, or the combine after
    split-KV) stores it times sigmoid(gate) as ``sigmoid_gate`` (layers/activation.py) computes it, without
    a launch of its own (the module docstring says where the bits were compared).

    ``token_table`` comes from ``write_kv``. ``num_splits`` overrides the split-KV heuristic.
    In batch-invariant mode (``outpace.attention.context.batch_invariant``) the batch-invariant
    variant runs instead: its partition is fixed, so ``num_splits`` is refused there, and
    ``split_rows`` (tests) overrides its KV rows per split.
    ``sliding_window``: a query at position p (``positions`` [num_tokens]) sees only the KV rows
    r > p - sliding_window (``PagedAttentionMetadata.check_sliding_window``); the KV walk starts at
    the tile holding the first query's first such row. None: no window.
    """
    if sliding_window is not None:
        meta.check_sliding_window(sliding_window, positions)
    if batch_invariant():
        if num_splits is not None:
            raise ValueError(
                "num_splits cannot be forced in batch-invariant mode: the KV partition is fixed"
            )
        return invariant_paged_attention(
            q,
            k_cache,
            v_cache,
            meta,
            token_table,
            scale,
            split_rows,
            sliding_window,
            positions,
            kv_scales,
            out_gate,
        )
    if split_rows is not None:
        raise ValueError("split_rows applies to the batch-invariant variant only")
    num_tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    q = last_dim_contiguous(q)
    pdl = pdl_available(q.device)
    cfg = launch_config(
        meta.num_seqs,
        kv_heads,
        heads // kv_heads,
        head_dim,
        max(q.element_size(), k_cache.element_size()),
        meta.max_query_len,
        meta.block_tables.shape[1] * meta.block_size,
        num_sms(q.device),
        num_splits,
    )
    out = torch.empty(num_tokens, heads, head_dim, dtype=q.dtype, device=q.device)
    gate, gate_strides, gate_kind = gate_args(out_gate, out)
    split = cfg.num_splits > 1
    grid = (meta.num_seqs * kv_heads, cfg.num_q_tiles, cfg.num_splits)
    if split:
        part_acc, part_max, part_sum = split_partials(
            cfg.num_splits, num_tokens, heads, head_dim, q.device
        )
    else:  # unused by the kernel
        part_acc = part_max = part_sum = out
    mask_arg, window, mask_strides = mask_args(meta)
    sliding = sliding_window is not None
    k_scale, v_scale = scale_args(k_cache, kv_scales)
    _attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        gate,
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
        out.stride(0),
        out.stride(1),
        *gate_strides,
        k_cache.stride(1),
        k_cache.stride(2),
        token_table.stride(0),
        meta.block_tables.stride(0),
        *mask_strides,
        cfg.num_splits,
        KV_HEADS=kv_heads,
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=meta.block_size,
        BLOCK_Q=cfg.block_q,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_N_TAIL=cfg.block_n_tail,
        BLOCK_D=cfg.block_d,
        SPLIT_KV=split,
        HAS_MASK=meta.custom_mask is not None,
        SLIDING=sliding,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PDL=pdl,
        KV_SCALED=kv_scales is not None,
        GATE=0 if split else gate_kind,  # split: the combine stores the output
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch_options(pdl),
    )
    if split:
        combine_splits(
            (part_acc, part_max, part_sum),
            out,
            (gate, gate_strides, gate_kind),
            meta,
            cfg,
            window,
            sliding_window or 0,
            sliding,
            pdl,
        )
    return out
