"""Multi-head latent attention over the paged latent cache, absorbed form, in Triton (CUDA; also in Triton's
interpreter on the CPU, for tests). Capturable: grids fixed by shapes and the metadata's python ints, no
host synchronisation.

Each cached token is one row [c, k_pe] (kv_lora_rank R + rope P values) shared by every head
(layers/mla.py). A head's query is [q_latent, q_pe] (q_latent = W_UK^T q_nope); its score of a row is
q_latent . c + q_pe . k_pe, and its output the softmax-weighted sum of the rows' latents c ([R]: W_UV is
applied after). So all heads of a token read the same rows: a program stacks BLOCK_M (token, head) rows of
one sequence, row m of tile t being flattened index f = t * BLOCK_M + m, query f // heads and head
f % heads, and computes QK^T as two tensor-core dots over a BLOCK_N tile of cache rows (latent part and
rope part), then PV with the latents as values (SGLang's decode_attention.py _fwd_grouped_kernel_stage1
stacks a kv head's query heads and splits the 576-wide MLA key into 512 + 64 the same way). One masked
pass over the tile's rows: causal (a row sees the prefix and the new tokens up to its own), or the
metadata's tree mask (every row before the mask's window, the window as the mask says), as
attention/triton_kernels.py and PagedAttentionMetadata.attn_mask define them.

Grid (row tiles, num_seqs, num_splits): with few programs the KV rows a tile sees are split into
``num_splits`` ranges ("flash decoding"); each split writes its unnormalised partial (running max, sum,
accumulator) and ``_combine_kernel`` merges the splits that ran. The split count follows from static
shapes (about two programs per SM), each split's range from the sequence's own length, so short
sequences in a wide block table still spread over the splits. A sequence's row tiles (its query tokens'
heads, BLOCK_M rows at a time) are consecutive programs that stream the same KV rows together, so a cached
row comes from memory once per sequence, the other tiles' reads of it hitting L2 (a decode step of
DeepSeek-V2-Lite, 16 heads, is one tile; V3's 128 heads are 4).

Two entry points: ``mla_paged_attention`` (the eager layer's: one query latent, attended latents out) and
``mla_attention_up`` (layers/mla_fused.py's: the query latent as a sum of partial products, which the
kernel adds as it loads them; partials always, and the merge takes each head's attended latent through
its W_UV, so the block's value projection costs no launch of its own).

On Hopper both launch with programmatic dependent launch (layers/pdl.py): each waits for the kernel before
it before its first read of an earlier output; the merge loads its W_UV tile (a weight) before the wait, while
the attention kernel drains.

An FP8 latent cache (attention/kv_quant.py) is read in place: the layer's one k scale multiplies the
scores (folded into the softmax scale) and the attended latents.

Batch-invariant mode (EngineConfig.batch_invariant, read through
``outpace.attention.context.batch_invariant``). Above, a row's reduction order follows the batch: BLOCK_M
follows max_query_len (in half precision), the split count the grid and each split's length the
sequence's (its tile's) length. In the mode ``_attend`` launches the same two kernels with parameters
that follow the model's shape and dtype only, as attention/invariant_attention.py's variant does
(its docstring gives the arguments at length):

- Fixed tiles: BLOCK_M 16 in float32 and ``invariant_block_m(heads)`` in half precision whatever the
  query length (the model's heads decide it, never the batch), BLOCK_N, warps, stages and PRECISION by dtype, and no FMA contraction (enable_fp_fusion=False):
  every call runs the same arithmetic, and a row's dots do not depend on the other rows of its tile.
- Fixed partition: MIN_SPLIT = S = ``invariant_split_rows`` (a BLOCK_N multiple) and num_splits =
  cdiv(block-table capacity, S), so ``_split_len`` is S for every kv_end the table can hold: split j
  covers the absolute rows [j * S, (j + 1) * S), walked in BLOCK_N tiles at absolute multiples of
  BLOCK_N in the kernel's one masked pass. A tile's walk stops at its last row's kv_end; the KV rows a
  row does not see (past its own, or past kv_end) get s = -inf, p = 0 exactly and the running max
  stays, so the tiles and columns past the row's visible rows leave its state bit for bit, and a
  split where it sees nothing writes the neutral partial (max -1e30, sum 0, acc 0).
- Logical rows under a tree mask (LOGICAL_ROWS): the partition, the tiles and the causal cut are over a
  row's logical KV sequence, the rows it sees in cache order: the rows before the window, then the window
  rows its mask row shows (a node's ancestors by depth, then itself), logical row window_start + j being
  the (j + 1)-th of them. That is what a chain verifying the node's path, or decoding its token once its
  ancestors are committed, holds at rows 0 .. its position, in the same tiles and splits: walked in place
  its visible keys would sit at other columns of other tiles (attention/invariant_attention.py's
  variant gives the argument at length and walks its tree the same way). The tiles wholly before the
  window are shared by the tile's rows; a tile reaching into the window is gathered once per query token
  of the row tile (its rows; the other rows masked, no-ops for them as above). A row tile's splits run up
  to the sequence's end; those past a node's logical end are neutral for it.
- Always partials, merged by ``_combine_kernel`` (one normalisation, the merge's, whatever the split
  count) in groups of a fixed number of splits from split 0, each group in one reduction, the groups in
  split order: a neutral partial, written or not run, weighs 0 in its group and a neutral group is the
  merge's identity (``merge_partials``), so the splits a row's batch adds past its visible rows change
  none of its bits. With W_UV (``mla_attention_up``) the merge's dot is per (row, split) as well.

So a decode row equals the same token inside a verify chain, a tree node the same token in its path's
chain and decoded alone, in any ragged batch with any table width (tests/kernels/test_mla_kernel.py; on
the GPU this rests on what the other variant rests on: an MMA row's bits do not depend on the other
rows, and an all-zero product leaves its accumulator as is). The fused block (layers/mla_fused.py) is
not taken in the mode. What it costs: a second launch and float32 partials at every call, a decode step
over a short context runs one program per S rows rather than the heuristic's spread, and under a tree
mask the tiles reaching into the window run once per query token of the row tile (one where a token's
heads fill the tile, as V3's 128 heads do).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from outpace.attention.context import batch_invariant, invariant_launch_options
from outpace.attention.invariant_attention import (
    invariant_programs,
    last_logical_rows,
    mask_row,
    merge_partials,
)
from outpace.attention.kernel_parts import (
    LOG2E,
    cache_scales,
    kv_offsets,
    last_dim_contiguous,
    mask_args,
    softmax_step,
    split_partials,
)
from outpace.attention.kv_quant import is_fp8
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options
from outpace.layers.sm_count import num_sms

_PROGRAMS_PER_SM = 2
_MAX_SPLITS = 64
# The merge (``_combine_kernel``): a program's tile is _COMBINE_ROWS (token, split) partials of the whole latent,
# BLOCK_T tokens by BLOCK_S = _COMBINE_ROWS / BLOCK_T splits (with W_UV, a dot's rows: 16 at least, and the
# float32 tile [16, 512] is 64 registers a thread at 4 warps).
_COMBINE_ROWS = tl.constexpr(16)
# BLOCK_T in batch-invariant mode: fixed, so that a row's merge order follows no batch
_INVARIANT_COMBINE_TOKENS = 4
# Merge programs aimed at per SM (the output columns a program takes follow from it), and the least tokens a
# program takes (a power of two <= 16: W_UV read by fewer programs at more tokens, the splits then walked in
# more groups of fewer).
combine_programs_per_sm = 2
combine_block_tokens = 1
# ... and at least about this many (token, head) rows' tokens a program: W_UV ([heads, 128, 512] in bf16, 16 MiB
# at DeepSeek-V3's 128 heads) is read once a program, so once for every 128 / heads tokens. The merge alone
# (benchmarks/scripts/mla_decode_parts.py --sweep combine_tokens, gpu_2026-12-04 call 5; 27 layers in one graph,
# 512 cached rows), us a call at 1 / 2 / 4 / 8 / 16 tokens a program: V3 at batch 8 47.5 / 37.8 / 27.1 / 22.0 / -,
# at batch 32 - / - / 52.6 / 42.6 / 35.2; V2-Lite (16 heads) at batch 8 7.5 / 8.5 / 10.1 / 11.8 / -, at batch 32
# 24.0 / 18.8 / 12.7 / 16.5 / 26.1 (where the splits' groups and the partials each output chunk reloads outweigh
# W_UV). This rule takes the fastest at each of the four (the old rule's 1, 1, 1 and 4 before). The DeepSeek-V3
# slice's decode step (decode_settings.py mla_combine_v3): 4.894 ms at batch 8 as before, 4.808 at 8 tokens a
# program; at batch 32 11.568 and 11.557 at 16.
combine_token_heads = 128
# KV rows a split covers at least (the split-KV heuristic's; a BLOCK_N multiple): a decode step over a short
# context runs a few splits of several KV blocks rather than one per block, each a program whose fixed cost
# (loading the query latent's parts) outweighs one block, and all of them merged one after the other. On the
# H200, DeepSeek-V2-Lite's decode step at 32 / 64 / 128 / 256: 2.821 / 2.773 / 2.857 / 3.104 ms at batch 1
# over 512 cached tokens, 3.102 / 3.100 / 3.019 / 3.178 over 2048, 6.087 / 5.994 / 6.065 / 6.263 at batch 8
# (benchmarks/scripts/decode_settings.py mla, benchmarks/results/gpu_2026-11-30b call 2).
min_split_rows = 64
# Batch-invariant mode: KV rows per split (split j covers the absolute rows [j * S, (j + 1) * S); a multiple
# of BLOCK_N, as attention/invariant_attention.py's _INVARIANT_SPLIT_ROWS). DeepSeek-V2-Lite's decode over 512 cached
# tokens in the mode at S = 128 / 64 / 32 (16-row tiles, ``invariant_block_m``): 378.5 / 393.7 / 391.3 tokens/s at
# batch 1, 1420.0 / 1432.8 / 1399.1 at batch 8, against 427.7 / 1436.7 on the normal path
# (benchmarks/scripts/batch_invariant_speed.py --split-rows, gpu_2026-12-01b call 3); 512 had been slower still
# (gpu_2026-11-30d call 5: a short context's one split was one program a sequence's heads).
invariant_split_rows = 64
# The attention kernel's launch outside batch-invariant mode, half precision: KV rows a tile (BLOCK_N), software
# pipeline stages, and warps for a 16-row tile (8 for 32 rows). The kernel alone over 512 cached rows, us a call
# (benchmarks/scripts/mla_decode_parts.py, gpu_2026-12-03g call 2; 27 layers in one graph):
#   BLOCK_N, stages, warps   V2-Lite b1   b8      V3 b1   b8
#   32, 2, 4 (as before)     8.89         9.58    12.48   31.11
#   32, 3, 4                 9.37         10.28   12.79   31.78
#   64, 1, 4                 9.00         9.57    10.40   28.06
#   64, 2, 4                 9.45         11.11   10.22   28.15
#   32, 2, 8                 9.06         10.11
#   64, 2, 8                 7.62         8.70    (V3's 32-row tiles run 8 warps)
# In V2-Lite's decode step (decode_settings.py mla_tile, call 3), 64 / 8 against 32 / 4: 2.172 / 2.205 ms at batch 1,
# 5.320 / 5.377 at 8, but 9.462 / 9.283 at 32; so the wide tile only up to ``wide_tile_programs`` row tiles
# (sequences x tiles a sequence), 32 / 4 past them.
half_block_n = 64
attention_stages = 2
attention_warps = 8
wide_tile_programs = 8


def invariant_block_m(heads: int) -> int:
    """The batch-invariant mode's tile rows in half precision: a fact of the model's shape (its heads on this
    rank), so every call of the model runs the same tiles. One token's heads where they fit 16 rows (DeepSeek-V2-
    Lite's 16: a decode row's tile holds no padding rows and runs 4 warps, as the normal path's does), else 32.
    With 32 rows at 8 warps for every model (and 128-row splits) V2-Lite's attention kernel took 18.7 us a layer
    in the mode at batch 1 against 9.3 on the normal path (gpu_2026-12-01b call 2)."""
    return 16 if heads <= 16 else 32


@triton.jit
def _tile_kv_end(
    seq_lens_ptr,
    query_lens_ptr,
    seq,
    tile,
    heads,
    window,
    HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """(kv_end, prefix, seq_len, query_len) of row tile ``tile`` of sequence ``seq``: the tile's rows see
    KV rows below kv_end only (0 for a tile past the sequence's new tokens)."""
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    query_len = tl.load(query_lens_ptr + seq).to(tl.int32)
    prefix = seq_len - query_len
    first_query = tile * BLOCK_M // heads
    last_query = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // heads, query_len - 1)
    if HAS_MASK:
        kv_end = seq_len
    else:
        kv_end = prefix + last_query + 1
    return tl.where(first_query < query_len, kv_end, 0), prefix, seq_len, query_len


@triton.jit
def _split_len(kv_end, num_splits, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr):
    """KV rows a split covers: kv_end / num_splits rounded up to BLOCK_N rows, at least MIN_SPLIT (a
    BLOCK_N multiple). Splits past kv_end do not run, so a short sequence runs fewer, longer splits."""
    return tl.maximum(tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N, MIN_SPLIT)


@triton.jit
def _latent_step(
    q_lat,  # [BLOCK_M, BLOCK_R]
    q_pe,  # [BLOCK_M, BLOCK_P]
    m_i,
    l_i,
    acc,
    cache_ptr,
    rows,  # [BLOCK_N] cache rows of the sequence (those rows_ok real)
    rows_ok,
    bt_ptr,
    stride_cache_slot,
    offs_r,
    r_ok,
    offs_p,
    p_ok,
    visible,  # [BLOCK_M, BLOCK_N]
    score_scale,
    R: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One BLOCK_N tile of the online softmax over latent cache rows: scores q_lat . c + q_pe . k_pe (two
    dots), -inf where not ``visible``, the latents c as values. The same operations for every tile and
    call; only the rows read and ``visible`` differ."""
    lat_offs, lat_ok = kv_offsets(
        rows, rows_ok, bt_ptr, stride_cache_slot, offs_r, r_ok, BLOCK_SIZE
    )
    pe_offs, pe_ok = kv_offsets(
        rows, rows_ok, bt_ptr, stride_cache_slot, R + offs_p, p_ok, BLOCK_SIZE
    )
    # [BLOCK_N, BLOCK_R] and [BLOCK_N, BLOCK_P]
    latent = tl.load(cache_ptr + lat_offs, mask=lat_ok, other=0.0).to(q_lat.dtype)
    k_pe = tl.load(cache_ptr + pe_offs, mask=pe_ok, other=0.0).to(q_pe.dtype)
    s = tl.dot(q_lat, tl.trans(latent), input_precision=PRECISION)
    s = (
        tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PRECISION) * score_scale
    )  # [BLOCK_M, BLOCK_N]
    s = tl.where(visible, s, float("-inf"))
    return softmax_step(s, latent, m_i, l_i, acc, PRECISION)


@triton.jit(
    do_not_specialize=[
        "num_tokens",
        "window",
        "stride_table_seq",
        "stride_bt_seq",
        "stride_mask_seq",
        "stride_mask_q",
        "num_splits",
    ]
)
def _mla_kernel(
    q_latent_ptr,  # [Q_PARTS, num_tokens, heads, R]: the query latent is the sum of the parts
    q_rope_ptr,  # [num_tokens, heads, P]
    cache_ptr,  # [num_blocks * block_size (flat slots), R + P]
    out_ptr,  # [num_tokens, heads, R]; written unless PARTIALS
    part_acc_ptr,  # [num_splits, num_tokens, heads, R] float32 (PARTIALS)
    part_max_ptr,
    part_sum_ptr,  # [num_splits, num_tokens, heads] float32 (PARTIALS)
    token_table_ptr,  # [num_seqs, max_query_len] int32
    block_tables_ptr,  # [num_seqs, max_blocks] int64
    seq_lens_ptr,
    query_lens_ptr,  # [num_seqs] int64
    custom_mask_ptr,  # [num_seqs, max_query_len, window] uint8 (HAS_MASK)
    k_scale_ptr,  # [] float32: an FP8 cache's scale, of the whole row (KV_SCALED)
    qk_scale,  # softmax scale * log2(e)
    num_tokens,
    window,
    stride_qlpart,
    stride_qlt,
    stride_qlh,
    stride_qrt,
    stride_qrh,
    stride_ot,
    stride_oh,
    stride_cache_slot,
    stride_table_seq,
    stride_bt_seq,
    stride_mask_seq,
    stride_mask_q,
    num_splits,
    HEADS: tl.constexpr,
    R: tl.constexpr,
    P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,  # _split_len
    Q_PARTS: tl.constexpr,
    PARTIALS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    LOGICAL_ROWS: tl.constexpr,  # HAS_MASK in batch-invariant mode: the window over each row's logical rows
    BLOCK_W: tl.constexpr,  # the mask's window padded to a power of two (LOGICAL_ROWS)
    PRECISION: tl.constexpr,
    KV_SCALED: tl.constexpr,  # an FP8 cache: rows read as stored * scale
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    # a sequence's row tiles are consecutive programs: they read the same KV rows together
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    # (the metadata and the block tables are complete before the kernel starts: read before the wait)
    kv_end, prefix, seq_len, query_len = _tile_kv_end(
        seq_lens_ptr, query_lens_ptr, seq, tile, HEADS, window, HAS_MASK, BLOCK_M
    )
    # The splits holding rows the tile sees, and split 0 always (every row gets a result), walked by this
    # program from program_id(2) in steps of the grid's last axis: each split's partial is computed alone,
    # whichever program takes it, and no program is spent on splits past the tile's rows.
    split_len = _split_len(kv_end, num_splits, BLOCK_N, MIN_SPLIT)
    live_splits = tl.maximum(tl.cdiv(kv_end, split_len), 1)
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    if tl.program_id(2) < live_splits:  # (the tile's queries, loaded once for the splits it walks)
        flat = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        q_index = flat // HEADS  # [BLOCK_M]
        head = flat % HEADS
        row_ok = q_index < query_len
        token = tl.load(token_table_ptr + seq * stride_table_seq + q_index, mask=row_ok, other=0)
        offs_r = tl.arange(0, BLOCK_R)
        r_ok = offs_r < R
        offs_p = tl.arange(0, BLOCK_P)
        p_ok = offs_p < P
        q_offs = token[:, None] * stride_qlt + head[:, None] * stride_qlh + offs_r[None, :]
        q_ok = row_ok[:, None] & r_ok[None, :]
        q_lat = tl.load(q_latent_ptr + q_offs, mask=q_ok, other=0.0).to(tl.float32)
        for part in range(1, Q_PARTS):
            q_lat += tl.load(q_latent_ptr + part * stride_qlpart + q_offs, mask=q_ok, other=0.0)
        q_lat = q_lat.to(q_latent_ptr.dtype.element_ty)  # [BLOCK_M, BLOCK_R]
        q_pe = tl.load(
            q_rope_ptr + token[:, None] * stride_qrt + head[:, None] * stride_qrh + offs_p[None, :],
            mask=row_ok[:, None] & p_ok[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_P]
        # An FP8 row is stored * scale, key and value alike: the scale folds into the scores and the output.
        k_scale = cache_scales(k_scale_ptr, k_scale_ptr, KV_SCALED)[0]
        score_scale = qk_scale * k_scale
        bt_ptr = block_tables_ptr + seq * stride_bt_seq
        mask_seq = custom_mask_ptr + seq * stride_mask_seq  # (HAS_MASK)
        window_start = seq_len - window
        # [BLOCK_M] each row's last visible (logical) KV row; causal: its own
        own_row = prefix + q_index
        if LOGICAL_ROWS:  # the rows before the window, then the window rows its mask row shows
            own_row = last_logical_rows(
                mask_seq, q_index, row_ok, stride_mask_q, window, window_start, BLOCK_W
            )
        for split in range(tl.program_id(2), live_splits, tl.num_programs(2)):
            kv_lo = split * split_len
            kv_hi = tl.minimum(kv_lo + split_len, kv_end)
            # The running max starts finite: rows with nothing visible yet keep exp2(-inf - max) = 0.
            m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
            shared_hi = kv_hi  # tiles below it: a row's logical rows are the physical rows, read once for the tile
            if LOGICAL_ROWS:
                shared_hi = tl.minimum(tl.maximum(kv_lo, window_start // BLOCK_N * BLOCK_N), kv_hi)
            for start in range(kv_lo, shared_hi, BLOCK_N):
                offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] KV rows
                n_ok = offs_n < kv_hi
                if HAS_MASK and not LOGICAL_ROWS:
                    # in place: rows before the window seen by every row (other=1), the window as the mask says
                    in_window = row_ok[:, None] & (n_ok & (offs_n >= window_start))[None, :]
                    allowed = tl.load(
                        mask_seq
                        + q_index[:, None] * stride_mask_q
                        + (offs_n - window_start)[None, :],
                        mask=in_window,
                        other=1,
                    )
                    visible = row_ok[:, None] & n_ok[None, :] & (allowed != 0)
                else:
                    visible = (
                        row_ok[:, None] & n_ok[None, :] & (offs_n[None, :] <= own_row[:, None])
                    )
                m_i, l_i, acc = _latent_step(
                    q_lat,
                    q_pe,
                    m_i,
                    l_i,
                    acc,
                    cache_ptr,
                    offs_n,
                    n_ok,
                    bt_ptr,
                    stride_cache_slot,
                    offs_r,
                    r_ok,
                    offs_p,
                    p_ok,
                    visible,
                    score_scale,
                    R,
                    BLOCK_SIZE,
                    PRECISION,
                )
            if (
                LOGICAL_ROWS
            ):  # the tiles reaching into the window: per query token, its logical rows
                # query tokens a row tile can span
                BLOCK_Q: tl.constexpr = (BLOCK_M + HEADS - 2) // HEADS + 1
                offs_w = tl.arange(0, BLOCK_W)  # the mask's window columns
                first_query = tile * BLOCK_M // HEADS
                last_query = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // HEADS, query_len - 1)
                for start in range(shared_hi, kv_hi, BLOCK_N):
                    offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical KV rows
                    n_ok = offs_n < kv_hi
                    visible = (
                        row_ok[:, None] & n_ok[None, :] & (offs_n[None, :] <= own_row[:, None])
                    )
                    for t in range(BLOCK_Q):
                        query = first_query + t
                        seen, rank, count = mask_row(
                            mask_seq, query, query <= last_query, stride_mask_q, window, BLOCK_W
                        )
                        if (query <= last_query) & (start < window_start + count):
                            # logical row window_start + j: the window column whose rank is j + 1
                            match = (seen[None, :] != 0) & (
                                rank[None, :] == (offs_n - window_start + 1)[:, None]
                            )  # [BLOCK_N, BLOCK_W]
                            column = tl.sum(
                                tl.where(match, offs_w[None, :], 0), axis=1
                            )  # [BLOCK_N]
                            m_i, l_i, acc = _latent_step(
                                q_lat,
                                q_pe,
                                m_i,
                                l_i,
                                acc,
                                cache_ptr,
                                tl.where(offs_n < window_start, offs_n, window_start + column),
                                n_ok & (offs_n < window_start + count),
                                bt_ptr,
                                stride_cache_slot,
                                offs_r,
                                r_ok,
                                offs_p,
                                p_ok,
                                visible & (q_index == query)[:, None],
                                score_scale,
                                R,
                                BLOCK_SIZE,
                                PRECISION,
                            )
            acc = acc * k_scale
            out_ok = row_ok[:, None] & r_ok[None, :]
            if PARTIALS:
                partial = (split * num_tokens + token) * HEADS + head  # [BLOCK_M]
                tl.store(part_max_ptr + partial, m_i, mask=row_ok)
                tl.store(part_sum_ptr + partial, l_i, mask=row_ok)
                tl.store(part_acc_ptr + partial[:, None] * R + offs_r[None, :], acc, mask=out_ok)
            else:
                out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
                tl.store(
                    out_ptr
                    + token[:, None] * stride_ot
                    + head[:, None] * stride_oh
                    + offs_r[None, :],
                    out.to(out_ptr.dtype.element_ty),
                    mask=out_ok,
                )


@triton.jit(do_not_specialize=["num_tokens", "num_splits", "window"])
def _combine_kernel(
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,  # as _mla_kernel's
    up_ptr,  # UP: [heads, OUT, R] with unit stride along R (W_UV), else unused
    out_ptr,  # [num_tokens, heads, OUT]: OUT = R, or the up projection's rows (UP)
    seq_index_ptr,
    query_index_ptr,  # [num_tokens] int64
    seq_lens_ptr,
    query_lens_ptr,  # [num_seqs] int64
    num_tokens,
    num_splits,
    window,
    stride_up_head,
    stride_up_row,
    stride_ot,
    stride_oh,
    HEADS: tl.constexpr,
    R: tl.constexpr,
    OUT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_T: tl.constexpr,  # tokens a program takes: a power of two <= _COMBINE_ROWS (_combine_launch)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    HAS_MASK: tl.constexpr,
    UP: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    """Program (head, output chunk, block of BLOCK_T tokens): merges the partials of the splits that ran for
    each row's tile (the split geometry recomputed from the metadata) and normalises. Without UP the chunk is
    CHUNK columns of the attended latent; with UP it is CHUNK rows of the head's up projection (W_UV: out =
    attended @ up[head].T), applied to each split's partial before the merge: W_UV is linear, so merging the
    projected partials is projecting the merged one, up to rounding (a split that did not run projects to 0).

    The splits come BLOCK_S at a time (a group), all of a group's loads issued together (W_UV's before the
    metadata's) and merged in one max / exp2 / sum reduction, the groups then merged in split order
    (``merge_partials``). A group of splits that did not run for a row is neutral for it (max -1e30, sum 0,
    values 0: the merge's identity, bit for bit), so the groups a row's block walks past its own splits
    change none of its bits, and in batch-invariant mode (BLOCK_T, so BLOCK_S and the groups, fixed) a row's
    merge follows the fixed partition only. At batch 1 a group holds 16 splits: over 1024 cached rows (the
    heuristic's 64-row splits) the merge is one round of loads, not a chain of one per split."""
    BLOCK_S: tl.constexpr = _COMBINE_ROWS // BLOCK_T
    head = tl.program_id(0)
    chunk = tl.program_id(1)
    tokens = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    t_ok = tokens < num_tokens
    cols = chunk * CHUNK + tl.arange(0, CHUNK)  # [CHUNK]: W_UV rows (UP), else latent columns
    cols_ok = cols < OUT
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    if UP:  # first, before the wait with PDL (a weight: no kernel writes it), so its latency overlaps the
        # attention kernel's tail, or the metadata's, on which the partials' loads wait
        w = tl.load(
            up_ptr + head * stride_up_head + cols[None, :] * stride_up_row + offs_r[:, None],
            mask=r_ok[:, None] & cols_ok[None, :],
            other=0.0,
        )  # [BLOCK_R, CHUNK]: up[head, cols].T
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    seq = tl.load(seq_index_ptr + tokens, mask=t_ok, other=0)
    q_index = tl.load(query_index_ptr + tokens, mask=t_ok, other=0).to(tl.int32)
    kv_end, _, _, _ = _tile_kv_end(
        seq_lens_ptr,
        query_lens_ptr,
        seq,
        (q_index * HEADS + head) // BLOCK_M,
        HEADS,
        window,
        HAS_MASK,
        BLOCK_M,
    )  # [BLOCK_T]
    # Splits that ran for each row's tile: split 0 always (it writes every row), then those starting below
    # kv_end (the ones past it left their partials unwritten).
    split_len = _split_len(kv_end, num_splits, BLOCK_N, MIN_SPLIT)
    splits_ran = tl.where(t_ok, tl.maximum(tl.cdiv(kv_end, split_len), 1), 0)  # [BLOCK_T]
    m_run = tl.full([BLOCK_T, 1], -1.0e30, tl.float32)
    l_run = tl.zeros([BLOCK_T, 1], tl.float32)
    out_run = tl.zeros([BLOCK_T, CHUNK], tl.float32)
    for first in range(0, tl.max(splits_ran, axis=0), BLOCK_S):
        splits = first + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        ran = (splits[None, :] < splits_ran[:, None])[:, :, None]  # [BLOCK_T, BLOCK_S, 1]
        part = ((splits[None, :] * num_tokens + tokens[:, None]) * HEADS + head)[:, :, None]
        m = tl.load(part_max_ptr + part, mask=ran, other=-1.0e30)  # [BLOCK_T, BLOCK_S, 1]
        l = tl.load(part_sum_ptr + part, mask=ran, other=0.0)
        if UP:  # each (token, split) partial through W_UV: one dot of BLOCK_T * BLOCK_S rows
            flat_part = tl.reshape(part, [BLOCK_T * BLOCK_S])
            flat_ran = tl.reshape(ran, [BLOCK_T * BLOCK_S])
            acc = tl.load(
                part_acc_ptr + flat_part[:, None] * R + offs_r[None, :],
                mask=flat_ran[:, None] & r_ok[None, :],
                other=0.0,
            )  # [BLOCK_T * BLOCK_S, BLOCK_R]
            values = tl.dot(acc.to(w.dtype), w, input_precision=PRECISION)
            values = tl.reshape(values, [BLOCK_T, BLOCK_S, CHUNK])
        else:
            values = tl.load(
                part_acc_ptr + part * R + cols[None, None, :],
                mask=ran & cols_ok[None, None, :],
                other=0.0,
            )  # [BLOCK_T, BLOCK_S, CHUNK]
        # a split that did not run weighs exp2(-1e30 - max) = 0
        m_group = tl.max(m, axis=1)  # [BLOCK_T, 1]
        weight = tl.exp2(m - m_group[:, None, :])  # [BLOCK_T, BLOCK_S, 1]
        m_run, l_run, out_run = merge_partials(
            m_run,
            l_run,
            out_run,
            m_group,
            tl.sum(l * weight, axis=1),
            tl.sum(values * weight, axis=1),
        )
    out = out_run / tl.where(l_run > 0, l_run, 1.0)  # [BLOCK_T, CHUNK]
    tl.store(
        out_ptr + tokens[:, None] * stride_ot + head * stride_oh + cols[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=t_ok[:, None] & cols_ok[None, :],
    )


def tile_rows(max_query_len: int, heads: int, fp32: bool) -> int:
    """BLOCK_M of ``_mla_kernel`` (and its merge) outside batch-invariant mode: 16 (token, head) rows where one
    query token's heads fill them (or in float32), else 32."""
    return 16 if fp32 or max_query_len * heads <= 16 else 32


def kv_splits(programs: int, max_kv_rows: int, block_n: int, device: torch.device) -> int:
    """The split-KV heuristic's split count for ``programs`` row tiles over block tables of ``max_kv_rows``
    rows (module docstring): about ``_PROGRAMS_PER_SM`` programs an SM, at most one split a KV tile and
    ``_MAX_SPLITS``; one where the row tiles alone fill the GPU."""
    target = _PROGRAMS_PER_SM * num_sms(device)
    if programs >= target:
        return 1
    return max(1, min(math.ceil(target / programs), math.ceil(max_kv_rows / block_n), _MAX_SPLITS))


def _combine_launch(
    num_tokens: int, heads: int, width: int, num_splits: int, invariant: bool, device: torch.device
) -> tuple[int, int]:
    """(BLOCK_T, CHUNK) of ``_combine_kernel`` for an output ``width`` wide (R, or W_UV's rows). BLOCK_T: as many
    tokens as leave room in the tile for every split of the launch (one group) or 1 past 16 splits, at
    least ``combine_block_tokens`` and ``combine_token_heads`` / heads of the batch's power of two, at most the
    batch's and 16; in batch-invariant mode fixed. CHUNK: about
    ``combine_programs_per_sm`` programs an SM, at least 16 (a dot's columns), at most 64; in the mode from
    the shapes only. Both follow the token count's power of two, not the count: a compile-time value per token
    bucket, which the engine's warm-up meets (engine/warm_up.py)."""
    rows = _COMBINE_ROWS.value
    if invariant:
        block_t = _INVARIANT_COMBINE_TOKENS
        token_blocks = 1
    else:
        bucket = triton.next_power_of_2(num_tokens)
        block_t = max(
            rows // min(triton.next_power_of_2(num_splits), rows),
            combine_block_tokens,
            triton.next_power_of_2(max(1, bucket * heads // combine_token_heads)),
        )
        block_t = min(block_t, bucket, rows)
        token_blocks = bucket // block_t
    chunks = math.ceil(combine_programs_per_sm * num_sms(device) / (heads * token_blocks))
    # (at most 64: on sm_90 at R 512 with W_UV, 71 registers a thread and 48 KiB of shared memory at 16,
    # 127 and 96 KiB at 64, ptxas's counts)
    chunk = min(max(16, triton.next_power_of_2(math.ceil(width / chunks))), 64)
    return block_t, chunk


def mla_paged_attention(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache_rows: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    num_splits: int | None = None,
    k_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q_latent [num_tokens, heads, R] (W_UK^T q_nope per head), q_rope [num_tokens, heads, P] (rotated) over
    the latent cache ``cache_rows`` [num_blocks, block_size, 1, R + P] (contiguous, the new tokens' rows
    already written) -> the attended latents [num_tokens, heads, R] in q_latent's dtype, under the
    metadata's causal or tree mask. ``num_splits`` overrides the split-KV heuristic (tests). An FP8
    cache comes with its ``k_scale`` ([] float32, attention/kv_quant.py) and is read in place. In
    batch-invariant mode the fixed tiles and partition of the module docstring run instead (a tree mask
    over each node's logical rows), and a forced ``num_splits`` is refused."""
    return _attend(
        q_latent.unsqueeze(0), q_rope, cache_rows, meta, scale, None, num_splits, k_scale
    )


def mla_attention_up(
    q_latent_parts: torch.Tensor,
    q_rope: torch.Tensor,
    cache_rows: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    up: torch.Tensor,
    num_splits: int | None = None,
    k_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``mla_paged_attention`` for a query latent given as the sum of parts [parts, num_tokens, heads, R]
    (layers/mla_fused.py: partial products of the absorption), each head's attended latent then taken
    through its up projection ``up`` [heads, OUT, R] (W_UV, unit stride along R) -> [num_tokens, heads,
    OUT]. Two launches at any split count: the attention writes partials, the merge applies ``up``."""
    return _attend(q_latent_parts, q_rope, cache_rows, meta, scale, up, num_splits, k_scale)


def _attend(
    q_parts: torch.Tensor,
    q_rope: torch.Tensor,
    cache_rows: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    up: torch.Tensor | None,
    num_splits: int | None,
    k_scale: torch.Tensor | None,
) -> torch.Tensor:
    if is_fp8(cache_rows.dtype) != (k_scale is not None):
        raise ValueError(
            f"a {cache_rows.dtype} latent cache comes with its k_scale exactly when it is FP8"
        )
    q_parts, q_rope = last_dim_contiguous(q_parts), last_dim_contiguous(q_rope)
    num_parts, num_tokens, heads, rank = q_parts.shape
    rope = q_rope.shape[2]
    device = q_parts.device
    fp32 = max(q_parts.element_size(), cache_rows.element_size()) >= 4
    invariant = batch_invariant()
    if invariant:  # fixed tiles and an absolute partition: see the module docstring
        block_m = 16 if fp32 else invariant_block_m(heads)
    else:
        block_m = tile_rows(meta.max_query_len, heads, fp32)
    tiles = math.ceil(meta.max_query_len * heads / block_m)
    # the normal path's wide KV tile (half precision) where few row tiles run (``wide_tile_programs``)
    wide = not invariant and meta.num_seqs * tiles <= wide_tile_programs
    block_n = 16 if fp32 else (half_block_n if wide else 32)
    max_kv_rows = meta.block_tables.shape[1] * meta.block_size
    mask = meta.custom_mask
    if invariant:
        _check_invariant_call(num_splits, block_n)
        min_split = invariant_split_rows  # _split_len is then S for every kv_end <= max_kv_rows
        num_splits = math.ceil(max_kv_rows / min_split)
    else:
        min_split = block_n  # a caller's num_splits (tests) is taken as given
    if num_splits is None:
        min_split = max(block_n, min_split_rows // block_n * block_n)
        num_splits = kv_splits(meta.num_seqs * tiles, max_kv_rows, block_n, device)
    out_width = rank if up is None else up.shape[1]
    out = torch.empty(num_tokens, heads, out_width, dtype=q_parts.dtype, device=device)
    partials = (
        num_splits > 1 or up is not None or invariant
    )  # (the mode: one normalisation, the merge's)
    if partials:
        part_acc, part_max, part_sum = split_partials(num_splits, num_tokens, heads, rank, device)
    else:  # unused by the kernel
        part_acc = part_max = part_sum = out
    mask_arg, window, mask_strides = mask_args(meta)
    logical_rows = invariant and mask is not None  # a tree walked over each node's logical rows
    token_table = meta.token_table()
    flat_cache = cache_rows.view(-1, rank + rope)
    pdl = pdl_available(device)
    block_r = max(16, triton.next_power_of_2(rank))
    # (the mode's splits cover the block table's capacity: a few programs a tile walk the ones it reaches)
    programs = (
        invariant_programs(num_splits, tiles * meta.num_seqs, device) if invariant else num_splits
    )
    _mla_kernel[(tiles, meta.num_seqs, programs)](
        q_parts,
        q_rope,
        flat_cache,
        out,
        part_acc,
        part_max,
        part_sum,
        token_table,
        meta.block_tables,
        meta.seq_lens,
        meta.query_lens,
        mask_arg,
        flat_cache if k_scale is None else k_scale,  # (unused without a scale)
        scale * LOG2E,
        num_tokens,
        window,
        q_parts.stride(0),
        q_parts.stride(1),
        q_parts.stride(2),
        q_rope.stride(0),
        q_rope.stride(1),
        out.stride(0),
        out.stride(1),
        flat_cache.stride(0),
        token_table.stride(0),
        meta.block_tables.stride(0),
        *mask_strides,
        num_splits,
        HEADS=heads,
        R=rank,
        P=rope,
        BLOCK_R=block_r,
        BLOCK_P=max(16, triton.next_power_of_2(rope)),
        BLOCK_SIZE=meta.block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        MIN_SPLIT=min_split,
        Q_PARTS=num_parts,
        PARTIALS=partials,
        HAS_MASK=mask is not None,
        LOGICAL_ROWS=logical_rows,
        BLOCK_W=max(16, triton.next_power_of_2(window)) if logical_rows else 16,
        PRECISION="ieee" if fp32 else "tf32",
        KV_SCALED=k_scale is not None,
        PDL=pdl,
        num_warps=8 if block_m > 16 else (attention_warps if wide else 4),
        num_stages=2 if invariant else attention_stages,
        **invariant_launch_options(),  # (the mode: the operations as written, in any variant)
        **pdl_launch_options(pdl),
    )
    if partials:
        _combine(
            (part_acc, part_max, part_sum),
            up,
            out,
            meta,
            num_splits,
            block_m,
            block_n,
            min_split,
            invariant,
        )
    return out


def _combine(
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    up: torch.Tensor | None,
    out: torch.Tensor,
    meta: PagedAttentionMetadata,
    num_splits: int,
    block_m: int,
    block_n: int,
    min_split: int,
    invariant: bool,
) -> None:
    """Merges the partials (acc [num_splits, num_tokens, heads, R], max and sum [num_splits, num_tokens, heads],
    float32) that ``_mla_kernel`` wrote under that geometry (tile rows, KV tile, least split rows) into ``out``
    [num_tokens, heads, OUT], through ``up`` [heads, OUT, R] when given."""
    part_acc, part_max, part_sum = partials
    num_tokens, heads, out_width = out.shape
    rank = part_acc.shape[-1]
    mask = meta.custom_mask
    pdl = pdl_available(out.device)
    block_t, chunk = _combine_launch(
        num_tokens, heads, out_width, num_splits, invariant, out.device
    )
    _combine_kernel[(heads, math.ceil(out_width / chunk), math.ceil(num_tokens / block_t))](
        part_acc,
        part_max,
        part_sum,
        out if up is None else up,
        out,
        meta.token_seq_index,
        meta.token_query_index,
        meta.seq_lens,
        meta.query_lens,
        num_tokens,
        num_splits,
        0 if mask is None else mask.shape[2],  # the tree window
        0 if up is None else up.stride(0),
        0 if up is None else up.stride(1),
        out.stride(0),
        out.stride(1),
        HEADS=heads,
        R=rank,
        OUT=out_width,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
        CHUNK=chunk,
        BLOCK_T=block_t,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        MIN_SPLIT=min_split,
        HAS_MASK=mask is not None,
        UP=up is not None,
        PRECISION="ieee" if up is not None and up.element_size() >= 4 else "tf32",  # W_UV's dot
        PDL=pdl,
        num_stages=2,  # (a group's partials loaded while the one before merges)
        **invariant_launch_options(),  # (as _attend's)
        **pdl_launch_options(pdl),
    )


def _check_invariant_call(num_splits: int | None, block_n: int) -> None:
    """Refuses what the batch-invariant mode does not cover: a forced split count (the partition is
    fixed), a split length off the KV tiles."""
    if num_splits is not None:
        raise ValueError(
            "num_splits cannot be forced in batch-invariant mode: the MLA kernel's KV partition is fixed"
        )
    if invariant_split_rows % block_n:
        raise ValueError(
            f"mla_kernels.invariant_split_rows={invariant_split_rows} must be a multiple of the "
            f"{block_n}-row KV tile"
        )
