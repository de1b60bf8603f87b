"""Split-KV's merge inside the attention kernel (attention/triton_kernels.py, ``merge_splits_in_kernel``): the
last split of a query tile to finish merges the tile's partials and stores its output, where otherwise a
``_combine_kernel`` launch of its own does it.

The pattern is the one of the other "last program finishes" kernels (layers/fused_rows_kernel.py
``_sum_k_splits``, layers/moe_routing_kernel.py's layout): a program writes its partials, its threads meet at a
barrier, and one thread takes the tile's ticket, an atomic add, acq_rel at gpu scope, which releases the
program's writes; the program that draws the last ticket has acquired every other split's, reads them past L1
(``.cg``: L1 is not coherent across SMs), merges, and zeroes the ticket for the next launch
(layers/zeroed_scratch.py). Only the splits that have KV rows take a ticket (``splits_that_run``): the others
return at once, as they do when a combine merges.

The merge is the combine's arithmetic over the same partials (the largest running max, each split's sum and
accumulator weighed by exp2 of its max minus it, one normalisation), summed split after split here where the
combine sums a tile of them: the same to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.attention.kernel_parts import store_output_tile
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
