"""Split-KV's merge of the paged attention kernel's partials (attention/triton_kernels.py): by a launch of its own,
``split_combine_kernel`` (one program a token and q head), or inside the attention kernel
(``merge_splits_in_kernel``): the last split of a query tile to finish merges the tile's partials and stores
its output.

The merge inside the kernel follows the pattern of the other "last program finishes" kernels
(layers/fused_rows_kernel.py ``_sum_k_splits``, layers/moe_routing_kernel.py's layout): a program writes its
partials, its threads meet at a barrier, and one thread takes the tile's ticket, an atomic add, acq_rel at gpu
scope, which releases the program's writes; the program that draws the last ticket has acquired every other
split's, reads them past L1 (``.cg``: L1 is not coherent across SMs), merges, and zeroes the ticket for the
next launch (layers/zeroed_scratch.py). Only the splits that have KV rows take a ticket
(``splits_that_run``): the others return at once, as they do when the combine merges.

The merge is the combine's arithmetic over the same partials (the largest running max, each split's sum and
accumulator weighed by exp2 of its max minus it, one normalisation), summed split after split here where the
combine sums a tile of them: the same to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.attention.kernel_parts import (
    LaunchConfig,
    split_geometry,
    store_output_row,
    store_output_tile,
)
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.layers.pdl import pdl_enter, pdl_launch_options
from outpace.layers.zeroed_scratch import zeroed_scratch

# The paged kernel merges its splits itself, without the combine's launch (module docstring). Off until a decode
# step measures it (benchmarks/scripts/decode_settings.py merge_in_kernel_*): the merge then waits on the slowest
# split where the combine waits on the whole grid, and the last split's program reads every partial alone.
merge_splits_in_kernel = False
# query tiles (sequence x kv head x query tile) one launch may merge this way: the ticket buffer's size. A split
# launch has fewer programs than the GPU's SMs times ``kernel_parts.programs_per_sm`` before its splits, so this
# bounds it with room; a launch with more tiles (a forced split count) merges in the combine.
MAX_MERGE_TILES = 4096


def merge_tickets(device: torch.device) -> torch.Tensor:
    """[MAX_MERGE_TILES] int32 tickets, one a query tile, zero between launches (layers/zeroed_scratch.py)."""
    return zeroed_scratch(
        "attention/split_merge.py: the split merge's tickets", device, MAX_MERGE_TILES, torch.int32
    )


@triton.jit
def splits_that_run(kv_start, kv_end, split_len):
    """How many splits of a query tile have KV rows (at least one: split 0 always runs, to write the rows of
    a tile that sees none); split s covers kv_start + s * split_len on (``split_geometry``)."""
    return tl.maximum(tl.cdiv(kv_end - kv_start, tl.maximum(split_len, 1)), 1)


@triton.jit
def merge_at_last_split(
    part_acc_ptr,  # [num_splits, num_tokens, heads, HEAD_DIM] float32, this program's split written
    part_max_ptr,
    part_sum_ptr,  # [num_splits, num_tokens, heads] float32
    tickets_ptr,  # [MAX_MERGE_TILES] int32, zero between launches
    out_ptr,  # [num_tokens, heads, head_dim]
    gate_ptr,
    ran,  # the tile's splits that run (``splits_that_run``)
    num_tokens,
    token,
    head,
    row_ok,  # [BLOCK_M] the tile's rows: their token and q head, the real ones
    offs_d,
    d_ok,  # [BLOCK_D]
    stride_ot,
    stride_oh,
    stride_gt,
    stride_gh,
    stride_gd,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GATE: tl.constexpr,
):
    """After a split program's partials are written: its ticket, and, by the tile's last split to take one,
    the merged output of the tile's rows, stored gated by GATE (``store_output_tile``) (module docstring)."""
    tl.debug_barrier()  # every thread's partials before the ticket (one thread takes it for the program)
    ticket = tickets_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == ran - 1:
        top = tl.full([BLOCK_M], -1.0e30, tl.float32)
        for split in range(0, ran):
            part = (split * num_tokens + token) * HEADS + head  # [BLOCK_M]
            top = tl.maximum(
                top, tl.load(part_max_ptr + part, mask=row_ok, other=-1.0e30, cache_modifier=".cg")
            )
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        ok = row_ok[:, None] & d_ok[None, :]
        for split in range(0, ran):
            part = (split * num_tokens + token) * HEADS + head
            weight = tl.exp2(
                tl.load(part_max_ptr + part, mask=row_ok, other=-1.0e30, cache_modifier=".cg") - top
            )  # finite: every max is >= -1e30
            total += weight * tl.load(
                part_sum_ptr + part, mask=row_ok, other=0.0, cache_modifier=".cg"
            )
            acc += weight[:, None] * tl.load(
                part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
                mask=ok,
                other=0.0,
                cache_modifier=".cg",
            )
        store_output_tile(
            acc / tl.where(total > 0, total, 1.0)[:, None],
            out_ptr,
            token,
            head,
            row_ok,
            offs_d,
            d_ok,
            stride_ot,
            stride_oh,
            gate_ptr,
            stride_gt,
            stride_gh,
            stride_gd,
            GATE,
        )
        tl.atomic_xchg(ticket, 0)


@triton.jit(do_not_specialize=["num_tokens", "num_splits", "window", "sliding_window"])
def split_combine_kernel(
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
    GATE: tl.constexpr,  # an output gate (``output_values``)
):
    """Program (token, head): merges the partials of the splits that saw rows for the token's tile, and
    stores the output (gated by GATE).
    Which splits ran follows from the metadata alone (complete before the forward's first kernel):
    worked out before waiting on the attention kernel."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(seq_index_ptr + token)
    q_start = tl.load(query_index_ptr + token).to(tl.int32) // BLOCK_Q * BLOCK_Q
    kv_start, kv_end, _, _, split_len = split_geometry(
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


def combine_splits(
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    gate: tuple[torch.Tensor, tuple[int, int, int], int],
    meta: PagedAttentionMetadata,
    cfg: LaunchConfig,
    window: int,
    sliding_window: int,
    sliding: bool,
    pdl: bool,
) -> None:
    """``split_combine_kernel``'s launch: the splits' ``partials`` (acc, running max, running sum:
    ``kernel_parts.split_partials``) merged into out [num_tokens, heads, head_dim], gated by ``gate`` (the logits,
    their strides and kind: ``kernel_parts.gate_args``); ``cfg``, ``window`` and the sliding window as the
    attention kernel's launch had them."""
    part_acc, part_max, part_sum = partials
    gate_logits, gate_strides, gate_kind = gate
    num_tokens, heads, head_dim = out.shape
    split_combine_kernel[(num_tokens, heads)](
        part_acc,
        part_max,
        part_sum,
        out,
        gate_logits,
        meta.token_seq_index,
        meta.token_query_index,
        meta.seq_lens,
        meta.query_lens,
        num_tokens,
        cfg.num_splits,
        window,
        sliding_window,
        out.stride(0),
        out.stride(1),
        *gate_strides,
        HEADS=heads,
        HEAD_DIM=head_dim,
        BLOCK_S=triton.next_power_of_2(cfg.num_splits),
        BLOCK_D=triton.next_power_of_2(head_dim),
        HAS_MASK=meta.custom_mask is not None,
        SLIDING=sliding,
        BLOCK_Q=cfg.block_q,
        BLOCK_N=cfg.block_n,
        PDL=pdl,
        GATE=gate_kind,
        **pdl_launch_options(pdl),
    )
