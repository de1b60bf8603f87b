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
3. ``_combine_kernel`` (one program per token and q head, only when num_splits > 1): merges the
   partials of the splits that ran for the token's tile (it recomputes the split geometry from the
   metadata, ``_split_geometry``).

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

Under programmatic dependent launch a program may ask its first KV rows into L2 before it waits on the kernel
before it (``prefetch_kv_rows``, ``cache_row_lines``; MLA's kernel alike): the cached rows and the block table do
not depend on that kernel.

The KV length is read from ``seq_lens`` inside the kernel. The number of splits is chosen from
static shapes so that the grid fills the GPU (about two programs per SM); each program's range is
then a BLOCK_N multiple of ceil((kv_end - kv_start) / num_splits) for its own sequence's length
(and window), so short sequences in a wide block table still spread over every split.

Compiled variants depend only on the model's shape, the block size, the tile rows (16 to 128),
three flags (split or not, custom mask or not, sliding window or not) and the output gate's kind:
integer arguments that change from call to call are marked ``do_not_specialize``, so Triton does not
compile a variant per value class.

Batch-invariant variant (deterministic mode: EngineConfig.batch_invariant, read through
``outpace.attention.context.batch_invariant``). The kernels above reduce a row's KV in an order
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
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from outpace.attention.backend import KVScales
from outpace.attention.context import batch_invariant
from outpace.attention.kv_quant import FP8_KV_MAX, is_fp8
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.layers.fused_kernels import sigmoid_gated
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options, prefetch_l2
from outpace.layers.sm_count import num_sms

_LOG2E = 1.4426950408889634
FP8_MAX = tl.constexpr(FP8_KV_MAX)  # e4m3's largest finite value, 448
# target grid size for split-KV, in programs per streaming multiprocessor. Fewer splits lost in the Llama-3.1-8B
# shape's decode step (benchmarks/scripts/decode_settings.py attention_splits_llama, gpu_2026-12-04g call 3, ms at
# batch 1 over 512 / 2048 cached rows, batch 8 over 512): 2 (8 splits of 64 rows at batch 1 and 512) 4.049 / 4.121
# / 4.280; 0.25 (4 splits) 4.098 / 4.459 / 4.573; 0 (one split: no merge launch) 4.450 / 5.913 / 4.570.
_PROGRAMS_PER_SM = 2
# With programmatic dependent launch, KV rows of its range a program asks into L2 before it waits on the kernel
# before it (``cache_row_lines``; 0: none; MLA's kernel has its own, attention/mla_kernels.py). The cached rows do
# not depend on that kernel, so their HBM reads can overlap its drain, and the first KV tile's loads after the wait
# come from L2. Off until a decode step measures it (benchmarks/scripts/decode_settings.py kv_prefetch_*).
prefetch_kv_rows = 0
_LINE_BYTES = 128  # an L2 line
_MAX_SPLITS = 64
_MAX_BLOCK_M = 128  # tile rows (query tokens x GQA group) per program
_INVARIANT_BLOCK_M = 64  # batch-invariant variant: tile rows, whatever the query length (fp16/bf16)
# Batch-invariant variant: KV rows per split. Gemma-3-12B's decode in the mode against the normal path at
# 512 / 256 / 128: -17.7 / -10.9 / -5.7% at batch 1, -12.0 / -7.1 / -8.7% at batch 8 over 512 cached tokens
# (benchmarks/scripts/batch_invariant_speed.py --split-rows, gpu_2026-11-30e call 1): a short context's few
# splits were few programs.
_INVARIANT_SPLIT_ROWS = 128


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
def fp8_rows(x, scale_ptr):
    """Rows x as an FP8 cache stores them, in float32: clamp(x / scale) to e4m3's range, rounded to the
    nearest e4m3 value (ties to even), so the cast to float8 that follows is exact.

    NOTE: Triton's interpreter casts float32 to float8e4nv without carrying a rounded-up mantissa into
    the exponent (1.98 -> 1.0, where torch and the GPU give 2.0); rounding here first keeps the
    interpreter's cast (the CPU tests) exact too, at a few ALU operations a value on the GPU."""
    # div_rn: IEEE division as torch's x / scale (Triton's "/" may be approximate on the GPU)
    y = tl.clamp(tl.div_rn(x.to(tl.float32), tl.load(scale_ptr).to(tl.float32)), -FP8_MAX, FP8_MAX)
    bits = y.to(tl.int32, bitcast=True)
    magnitude = tl.abs(y)
    # e4m3: 3 mantissa bits, normal from 2^-6, subnormals spaced 2^-9
    exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    ulp = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(exponent - 3)
    # magnitude / ulp < 16: adding and taking away 1.5 * 2^23 rounds it to an integer, ties to even
    rounded = ((tl.div_rn(magnitude, ulp) + 12582912.0) - 12582912.0) * ulp
    sign = (
        bits >> 31
    ) << 31  # y's sign bit (a rounded -0.0 or tiny negative stays -0.0, as torch's cast)
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _query_rows(
    token_table_ptr,
    seq_lens_ptr,
    query_lens_ptr,
    stride_table_seq,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The program's (sequence, kv head, query tile, split) and the rows of its tile: row m is query
    q_start + m // GROUP of the sequence, q head kv_head * GROUP + m % GROUP. Metadata only (no q)."""
    seq = tl.program_id(0) // KV_HEADS
    kv_head = tl.program_id(0) % KV_HEADS
    q_start = tl.program_id(1) * BLOCK_Q
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    query_len = tl.load(query_lens_ptr + seq).to(tl.int32)
    offs_m = tl.arange(0, BLOCK_M)
    q_index = q_start + offs_m // GROUP  # [BLOCK_M]
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M]
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_index < query_len)  # [BLOCK_M]
    token = tl.load(token_table_ptr + seq * stride_table_seq + q_index, mask=row_ok, other=0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    return (
        seq,
        kv_head,
        q_start,
        split,
        seq_len,
        query_len,
        q_index,
        head,
        row_ok,
        token,
        offs_d,
        d_ok,
    )


@triton.jit
def _load_queries(q_ptr, token, head, row_ok, offs_d, d_ok, stride_qt, stride_qh):
    """The tile's queries [BLOCK_M, BLOCK_D] (``_query_rows``)."""
    return tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )


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
    (``_kv_offsets``)."""
    offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] KV rows
    n_ok = offs_n < hi
    kv_offs, kv_ok = _kv_offsets(offs_n, n_ok, bt_ptr, stride_cache_slot, offs_d, d_ok, BLOCK_SIZE)
    return offs_n, n_ok, kv_offs, kv_ok


@triton.jit
def _kv_offsets(rows, ok, bt_ptr, stride_cache_slot, offs_d, d_ok, BLOCK_SIZE: tl.constexpr):
    """The cache offsets [BLOCK_N, BLOCK_D] of KV rows ``rows`` [BLOCK_N] (those ``ok`` are real)
    through the block table, block_tables[row // BLOCK_SIZE] * BLOCK_SIZE + row % BLOCK_SIZE."""
    block = tl.load(bt_ptr + rows // BLOCK_SIZE, mask=ok, other=0)
    slot = block * BLOCK_SIZE + rows % BLOCK_SIZE  # [BLOCK_N] int64
    return slot[:, None] * stride_cache_slot + offs_d[None, :], ok[:, None] & d_ok[None, :]


@triton.jit
def cache_row_lines(
    lo,
    hi,
    bt_ptr,  # the sequence's block table row
    stride_cache_slot,
    ROW_ELEMS: tl.constexpr,  # a row's elements
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    LINES: tl.constexpr,  # a power of two >= the L2 lines a row spans
    LINE_ELEMS: tl.constexpr,  # cache elements a line holds
):
    """[ROWS, LINES] offsets, from a row's first element in the cache, of the L2 lines of cache rows lo ..
    min(hi, lo + ROWS) - 1 (0 past them): what a program about to wait on the kernel before it asks into L2
    (``prefetch_l2`` at each cache's head: ``prefetch_kv_rows``). It reads the block table, which is complete
    before an attention kernel starts (``_attention_kernel``). A row that kernel writes (a new token's) may be
    asked for too: the prefetch is a hint, and L2 is where global memory is coherent."""
    rows = lo + tl.arange(0, ROWS)  # [ROWS]
    lines = tl.arange(0, LINES) * LINE_ELEMS  # [LINES]
    offs, ok = _kv_offsets(
        rows, rows < hi, bt_ptr, stride_cache_slot, lines, lines < ROW_ELEMS, BLOCK_SIZE
    )  # [ROWS, LINES]
    return tl.where(ok, offs, 0)


def prefetch_lines(row_elems: int, cache: torch.Tensor) -> tuple[int, int]:
    """(LINES, LINE_ELEMS) of ``cache_row_lines`` for rows of ``row_elems`` elements of ``cache``."""
    line_elems = _LINE_BYTES // cache.element_size()
    return triton.next_power_of_2(triton.cdiv(row_elems, line_elems)), line_elems


@triton.jit
def _split_geometry(
    seq_lens_ptr,
    query_lens_ptr,
    seq,
    q_start,
    window,
    sliding_window,
    num_splits,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """For the query tile starting at query ``q_start`` of sequence ``seq``: kv_start (a multiple of
    BLOCK_N; rows below it are outside every row's sliding window, 0 without one), kv_end (it sees KV
    rows below it), shared_end (rows below it are seen by every row of the tile, sliding window aside),
    prefix (rows cached before this forward) and split_len (KV rows a split covers from kv_start;
    splits past kv_end are empty)."""
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    query_len = tl.load(query_lens_ptr + seq).to(tl.int32)
    prefix = seq_len - query_len
    if HAS_MASK:
        kv_end = seq_len
        shared_end = seq_len - window  # rows before the mask's window: seen by every row
        first_pos = seq_len - window  # no query of the mask sits before its window
    else:
        kv_end = tl.minimum(seq_len, prefix + q_start + BLOCK_Q)
        shared_end = prefix + q_start + 1  # rows up to the tile's first query: seen by every row
        first_pos = prefix + q_start  # the tile's first query's position
    kv_end = tl.where(q_start < query_len, kv_end, 0)  # a tile past the new tokens: no rows, no KV
    kv_start = 0
    if (
        SLIDING
    ):  # the first query's window starts at first_pos - sliding_window + 1; later ones after it
        kv_start = tl.minimum(
            tl.maximum(first_pos - sliding_window + 1, 0) // BLOCK_N * BLOCK_N, kv_end
        )
    split_len = tl.cdiv(tl.cdiv(kv_end - kv_start, num_splits), BLOCK_N) * BLOCK_N
    return kv_start, kv_end, shared_end, prefix, split_len


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
    rows its query tile can see, kv_lo .. kv_hi - 1; shared_end and prefix (``_split_geometry``); and
    slide_end: with a sliding window, rows from it on are inside every row's window (the tile's
    queries sit at positions below kv_end)."""
    kv_start, kv_end, shared_end, prefix, split_len = _split_geometry(
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
def _softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One KV tile of the online softmax, base 2: masked scores s [BLOCK_M, BLOCK_N] (-inf where not
    visible) and values v [BLOCK_N, BLOCK_D] update the running max m_i, sum l_i [BLOCK_M] and the
    unnormalised output acc [BLOCK_M, BLOCK_D]."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


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
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, PRECISION)
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
    GATE: tl.constexpr,  # an output gate: 0 none, 1 one logit a head, 2 one an element (``_output_values``)
    PREFETCH_ROWS: tl.constexpr,  # (with PDL) KV rows asked into L2 before the wait (``prefetch_kv_rows``)
    LINES: tl.constexpr,
    LINE_ELEMS: tl.constexpr,  # a cache row's L2 lines, and the elements a line holds (PREFETCH_ROWS)
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
    seq, kv_head, _, split, seq_len, _, q_index, head, row_ok, token, offs_d, d_ok = _query_rows(
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
    if PREFETCH_ROWS > 0:
        if kv_lo < kv_hi:
            lines = cache_row_lines(
                kv_lo,
                kv_hi,
                block_tables_ptr + seq * stride_bt_seq,
                stride_cache_slot,
                HEAD_DIM,
                BLOCK_SIZE,
                PREFETCH_ROWS,
                LINES,
                LINE_ELEMS,
            )  # [PREFETCH_ROWS, LINES]
            head_offset = kv_head * stride_cache_head
            prefetch_l2(k_cache_ptr + head_offset + lines)
            prefetch_l2(v_cache_ptr + head_offset + lines)
    pdl_enter(PDL)
    # A split past the rows its tile sees does nothing: the combine reads only the splits that have
    # rows (split 0 always runs, so every row gets a result).
    if (kv_lo < kv_hi) | (tl.program_id(2) == 0):
        q = _load_queries(q_ptr, token, head, row_ok, offs_d, d_ok, stride_qt, stride_qh)
        q_pos = q_index  # unused without SLIDING
        if SLIDING:
            q_pos = tl.load(positions_ptr + token, mask=row_ok, other=0).to(tl.int32)  # [BLOCK_M]
        k_scale, v_scale = _kv_scales(k_scale_ptr, v_scale_ptr, KV_SCALED)
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
def _kv_scales(k_scale_ptr, v_scale_ptr, KV_SCALED: tl.constexpr):
    """An FP8 cache's (k_scale, v_scale) as float32 scalars; (1.0, 1.0) for a cache in the model's dtype."""
    k_scale = 1.0
    v_scale = 1.0
    if KV_SCALED:
        k_scale = tl.load(k_scale_ptr).to(tl.float32)
        v_scale = tl.load(v_scale_ptr).to(tl.float32)
    return k_scale, v_scale


@triton.jit
def _output_values(
    out,  # the normalised attention output, float32: [BLOCK_M, BLOCK_D], or [BLOCK_D] for one row
    out_dtype: tl.constexpr,
    gate_ptr,
    token,
    head,  # the output rows' (token, q head): [BLOCK_M, 1] or scalars
    row_ok,  # [BLOCK_M, 1] or a scalar: the rows that are real
    offs_d,
    d_ok,  # [1, BLOCK_D] or [BLOCK_D]: the columns, those below HEAD_DIM
    stride_gt,
    stride_gh,
    stride_gd,
    GATE: tl.constexpr,
):
    """What the output stores: out rounded to out_dtype; with an output gate (GATE 1: one logit a head
    at gate[token, head], 2: one an element at gate[token, head, d]) that rounded output times the
    sigmoid of its logits (``sigmoid_gated``), rounded again: this attention's output followed by
    ``sigmoid_gate`` (module docstring)."""
    values = out.to(out_dtype)
    if GATE:
        logits_ptr = gate_ptr + token * stride_gt + head * stride_gh
        if GATE == 1:
            logits = tl.load(logits_ptr, mask=row_ok)  # [BLOCK_M, 1] or a scalar
        else:
            logits = tl.load(logits_ptr + offs_d * stride_gd, mask=row_ok & d_ok)
        values = sigmoid_gated(values, logits).to(out_dtype)
    return values


@triton.jit
def _store_output_row(
    out,  # [BLOCK_D] float32: one (token, head)'s normalised output
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
    GATE: tl.constexpr,
):
    """A combine's store of one output row, gated by GATE (``_output_values``)."""
    values = _output_values(
        out,
        out_ptr.dtype.element_ty,
        gate_ptr,
        token,
        head,
        True,
        offs_d,
        d_ok,
        stride_gt,
        stride_gh,
        stride_gd,
        GATE,
    )
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d, values, mask=d_ok)


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
    q [BLOCK_M, BLOCK_D] (rows: ``_query_rows``; positions q_pos, read with SLIDING only). ``qk_scale``
    holds an FP8 cache's k scale, ``v_scale`` (1.0 otherwise) multiplies the attended values. Without
    SPLIT_KV the output is stored gated by GATE (``_output_values``)."""
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
        out = _output_values(
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


@triton.jit(do_not_specialize=["num_tokens", "num_splits", "window", "sliding_window"])
def _combine_kernel(
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
    num_splits,
    window,
    sliding_window,
    stride_ot,
    stride_oh,
    stride_gt,
    stride_gh,
    stride_gd,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
    GATE: tl.constexpr,  # an output gate (``_output_values``)
):
    """Program (token, head): merges the partials of the splits that saw rows for the token's tile, and
    stores the output (gated by GATE).
    Which splits ran follows from the metadata alone (complete before the forward's first kernel):
    worked out before waiting on the attention kernel."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(seq_index_ptr + token)
    q_start = tl.load(query_index_ptr + token).to(tl.int32) // BLOCK_Q * BLOCK_Q
    kv_start, kv_end, _, _, split_len = _split_geometry(
        seq_lens_ptr,
        query_lens_ptr,
        seq,
        q_start,
        window,
        sliding_window,
        num_splits,
        HAS_MASK,
        SLIDING,
        BLOCK_Q,
        BLOCK_N,
    )
    pdl_enter(PDL)
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = (offs_s < num_splits) & (
        (offs_s == 0) | (kv_start + offs_s * split_len < kv_end)
    )  # the splits that ran
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    part = (offs_s * num_tokens + token) * HEADS + head  # [BLOCK_S]
    m = tl.load(part_max_ptr + part, mask=s_ok, other=-1.0e30)
    l = tl.load(part_sum_ptr + part, mask=s_ok, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    weight = tl.exp2(m - tl.max(m, axis=0))  # finite: every max is >= -1e30
    total = tl.sum(l * weight, axis=0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    _store_output_row(
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


# Batch-invariant variant (the deterministic mode) ---------------------------------------------------------------------


@triton.jit
def _invariant_step(q, m_i, l_i, acc, k_base, v_base, kv_offs, kv_ok, visible, qk_scale, PRECISION):
    """One BLOCK_N tile of the batch-invariant walk: the same operations for every tile and call
    (scores, mask, online-softmax update); only the KV rows gathered and ``visible`` differ."""
    k = tl.load(k_base + kv_offs, mask=kv_ok, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    s = tl.where(visible, s, float("-inf"))
    v = tl.load(v_base + kv_offs, mask=kv_ok, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
    return _softmax_step(s, v, m_i, l_i, acc, PRECISION)


@triton.jit
def _invariant_visible(offs_n, n_ok, q_row, q_pos, sliding_window, SLIDING: tl.constexpr):
    """[BLOCK_M, BLOCK_N]: which logical KV rows ``offs_n`` (those ``n_ok`` real) each row sees: those
    up to its own logical row ``q_row``, and with SLIDING those after q_pos - sliding_window."""
    visible = n_ok[None, :] & (offs_n[None, :] <= q_row[:, None])
    if SLIDING:
        visible = visible & (offs_n[None, :] > q_pos[:, None] - sliding_window)
    return visible


@triton.jit
def _mask_row(mask_seq_ptr, query, ok, stride_mask_q, window, BLOCK_W: tl.constexpr):
    """Query ``query``'s custom-mask row (zeros when not ``ok``): (seen [BLOCK_W] int32, rank
    [BLOCK_W]: seen rows up to and including each column, count: its seen rows)."""
    offs_w = tl.arange(0, BLOCK_W)
    seen = tl.load(
        mask_seq_ptr + query * stride_mask_q + offs_w, mask=(offs_w < window) & ok, other=0
    )
    seen = (seen != 0).to(tl.int32)
    return seen, tl.cumsum(seen, axis=0), tl.sum(seen, axis=0)


@triton.jit
def _last_logical_rows(
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
        kv_offs, kv_ok = _kv_offsets(
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
                seen, rank, count = _mask_row(
                    mask_seq_ptr, query, query < query_len, stride_mask_q, window, BLOCK_W
                )
                if (query < query_len) & (start < window_start + count):
                    # logical row window_start + j: the window column whose rank is j + 1
                    match = (seen[None, :] != 0) & (
                        rank[None, :] == (offs_n - window_start + 1)[:, None]
                    )  # [BLOCK_N, BLOCK_W]
                    column = tl.sum(tl.where(match, offs_w[None, :], 0), axis=1)  # [BLOCK_N]
                    rows = tl.where(offs_n < window_start, offs_n, window_start + column)
                    kv_offs, kv_ok = _kv_offsets(
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
    sliding window, started at the tile of the first row any of its rows sees (``_split_geometry``'s kv_start:
    the tiles skipped would leave every row's state as is). Writes nothing when that range is empty for the
    whole tile (no row reads it). Each split's partial is computed alone, from a fresh state, whichever program
    takes it: P changes no bits (``invariant_programs`` picks it), and no program is spent on the splits past
    the tile's rows (a block table's capacity holds hundreds of 128-row splits).
    """
    seq, kv_head, q_start, first, seq_len, query_len, q_index, head, row_ok, token, offs_d, d_ok = (
        _query_rows(
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
    q = _load_queries(q_ptr, token, head, row_ok, offs_d, d_ok, stride_qt, stride_qh)
    q_pos = q_index  # unused without SLIDING
    if SLIDING:
        q_pos = tl.load(positions_ptr + token, mask=row_ok, other=0).to(tl.int32)  # [BLOCK_M]

    kv_start, kv_end, _, prefix, _ = _split_geometry(
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
        q_row = _last_logical_rows(
            mask_seq_ptr, q_index, row_ok, stride_mask_q, window, window_start, BLOCK_W
        )
    k_scale, v_scale = _kv_scales(k_scale_ptr, v_scale_ptr, KV_SCALED)
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
def _merge_partials(m, l, acc, m_j, l_j, acc_j):
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
    GATE: tl.constexpr,  # an output gate (``_output_values``)
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
        m, l, acc = _merge_partials(
            m,
            l,
            acc,
            tl.load(part_max_ptr + pj),
            tl.load(part_sum_ptr + pj),
            tl.load(part_acc_ptr + pj * HEAD_DIM + offs_d, mask=d_ok, other=0.0),
        )
    out = acc / tl.where(l > 0, l, 1.0)
    _store_output_row(
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


@dataclass(frozen=True)
class LaunchConfig:
    """Tile sizes and grid of ``_attention_kernel``: functions of shapes and python ints only."""

    block_q: int  # query tokens per tile: block_m // group
    block_m: int  # tile rows: block_q * group, padded to a power of two >= 16 (tl.dot)
    block_n: int  # KV rows per step over the rows every row of the tile sees
    block_n_tail: int  # KV rows per step over the masked rest (causal diagonal or tree window)
    block_d: int  # head_dim padded to a power of two >= 16
    num_q_tiles: int
    num_splits: int
    num_warps: int
    num_stages: int
    split_rows: int | None = (
        None  # batch-invariant variant: KV rows per split, fixed (split j: [j * S, (j + 1) * S))
    )


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
    would leave SMs idle: into enough splits to reach ~_PROGRAMS_PER_SM programs per SM, at most one
    per BLOCK_N rows of capacity.
    """
    if group > _MAX_BLOCK_M:
        raise ValueError(f"{group} q heads per kv head exceed a {_MAX_BLOCK_M}-row tile")
    fp32 = (
        elem_size >= 4
    )  # tl.dot in float32 runs on FMAs with its operands in registers: smaller tiles
    block_d = max(16, triton.next_power_of_2(head_dim))
    wide = (
        block_d > 256
    )  # Gemma 4's 512-wide global heads: Q, K and V tiles within Hopper's shared memory
    max_block_m = 64 if wide else _MAX_BLOCK_M if not fp32 else 64 if block_d <= 64 else 16
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
        target = _PROGRAMS_PER_SM * num_sms
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


def invariant_programs(num_splits: int, tiles: int, device: torch.device) -> int:
    """Programs a query tile of the batch-invariant variant spreads its splits over (the grid's last axis):
    about ``_PROGRAMS_PER_SM`` programs an SM over ``tiles`` tiles, at most one a split. Which program takes a
    split changes none of its bits (``_invariant_attention_kernel``), so this may follow the batch."""
    return max(1, min(num_splits, math.ceil(_PROGRAMS_PER_SM * num_sms(device) / max(tiles, 1))))


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
    if group > _MAX_BLOCK_M:
        raise ValueError(f"{group} q heads per kv head exceed a {_MAX_BLOCK_M}-row tile")
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


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _scale_args(cache: torch.Tensor, kv_scales: KVScales | None) -> KVScales:
    """The kernels' scale pointers: an FP8 cache's scales, which it must come with; for a cache in the
    model's dtype, any tensor (unused)."""
    if is_fp8(cache.dtype) != (kv_scales is not None):
        raise ValueError(
            f"a {cache.dtype} cache comes with its k/v scales exactly when it is FP8 "
            f"(got {'scales' if kv_scales is not None else 'none'})"
        )
    return kv_scales if kv_scales is not None else (cache, cache)


def _gate_args(
    out_gate: torch.Tensor | None, out: torch.Tensor
) -> tuple[torch.Tensor, tuple[int, int, int], int]:
    """The kernels' output-gate arguments for ``out_gate`` (``paged_attention``) over out [num_tokens, heads,
    head_dim]: (the logits, their token, head and column strides, GATE: 1 one logit a head, 2 one an
    element); without a gate, out, zeros and 0 (unused)."""
    if out_gate is None:
        return out, (0, 0, 0), 0
    if out_gate.dtype not in (torch.float32, out.dtype):
        raise ValueError(f"an output gate is float32 or {out.dtype}, not {out_gate.dtype}")
    if out_gate.shape == out.shape[:2]:
        return out_gate, (*out_gate.stride(), 0), 1
    if out_gate.shape == out.shape:
        return out_gate, out_gate.stride(), 2
    raise ValueError(
        f"an output gate is [num_tokens, heads] or [num_tokens, heads, head_dim] = {list(out.shape)}, "
        f"not {list(out_gate.shape)}"
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
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    token_table = torch.empty(meta.num_seqs, meta.max_query_len, dtype=torch.int32, device=k.device)
    k_scale, v_scale = _scale_args(k_cache, kv_scales)
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
        return _invariant_paged_attention(
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
    q = _last_dim_contiguous(q)
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
    gate, gate_strides, gate_kind = _gate_args(out_gate, out)
    if cfg.num_splits > 1:
        part_acc = torch.empty(
            cfg.num_splits, num_tokens, heads, head_dim, dtype=torch.float32, device=q.device
        )
        part_max = torch.empty(
            cfg.num_splits, num_tokens, heads, dtype=torch.float32, device=q.device
        )
        part_sum = torch.empty(
            cfg.num_splits, num_tokens, heads, dtype=torch.float32, device=q.device
        )
    else:  # unused by the kernel
        part_acc = part_max = part_sum = out
    mask = meta.custom_mask
    if mask is None:
        mask_arg, window, mask_strides = meta.seq_lens, 0, (0, 0)  # unused by the kernel
    else:
        mask_arg = _last_dim_contiguous(mask).view(torch.uint8)
        window, mask_strides = mask.shape[2], (mask_arg.stride(0), mask_arg.stride(1))
    sliding = sliding_window is not None
    k_scale, v_scale = _scale_args(k_cache, kv_scales)
    grid = (meta.num_seqs * kv_heads, cfg.num_q_tiles, cfg.num_splits)
    lines, line_elems = prefetch_lines(head_dim, k_cache)
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
        scale * _LOG2E,
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
        SPLIT_KV=cfg.num_splits > 1,
        HAS_MASK=mask is not None,
        SLIDING=sliding,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PDL=pdl,
        KV_SCALED=kv_scales is not None,
        GATE=0 if cfg.num_splits > 1 else gate_kind,  # split: the combine stores the output
        PREFETCH_ROWS=prefetch_kv_rows if pdl else 0,
        LINES=lines,
        LINE_ELEMS=line_elems,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch_options(pdl),
    )
    if cfg.num_splits > 1:
        _combine_kernel[(num_tokens, heads)](
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
            cfg.num_splits,
            window,
            sliding_window or 0,
            out.stride(0),
            out.stride(1),
            *gate_strides,
            HEADS=heads,
            HEAD_DIM=head_dim,
            BLOCK_S=triton.next_power_of_2(cfg.num_splits),
            BLOCK_D=triton.next_power_of_2(head_dim),
            HAS_MASK=mask is not None,
            SLIDING=sliding,
            BLOCK_Q=cfg.block_q,
            BLOCK_N=cfg.block_n,
            PDL=pdl,
            GATE=gate_kind,
            **pdl_launch_options(pdl),
        )
    return out


def _invariant_paged_attention(
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
    q = _last_dim_contiguous(q)
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
    gate, gate_strides, gate_kind = _gate_args(out_gate, out)
    part_acc = torch.empty(
        cfg.num_splits, num_tokens, heads, head_dim, dtype=torch.float32, device=q.device
    )
    part_max = torch.empty(cfg.num_splits, num_tokens, heads, dtype=torch.float32, device=q.device)
    part_sum = torch.empty(cfg.num_splits, num_tokens, heads, dtype=torch.float32, device=q.device)
    mask = meta.custom_mask
    if mask is None:
        mask_arg, window, mask_strides = meta.seq_lens, 0, (0, 0)  # unused by the kernel
    else:
        mask_arg = _last_dim_contiguous(mask).view(torch.uint8)
        window, mask_strides = mask.shape[2], (mask_arg.stride(0), mask_arg.stride(1))
    sliding = sliding_window is not None
    k_scale, v_scale = _scale_args(k_cache, kv_scales)
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
        scale * _LOG2E,
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
        HAS_MASK=mask is not None,
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
        HAS_MASK=mask is not None,
        SLIDING=sliding,
        GATE=gate_kind,
        enable_fp_fusion=False,
    )
    return out
