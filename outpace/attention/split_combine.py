"""Split-KV's merge of the paged attention kernel's partials (attention/triton_kernels.py): with more than one
split, each split of a query tile writes its unnormalised partial (running max, sum and accumulator) and
``split_combine_kernel``, a launch of its own (one program a token and q head), merges the splits that ran
for the token's tile and stores the output.

Merging inside the attention kernel instead, the tile's last split to finish taking a ticket and merging
(the pattern of layers/fused_rows_kernel.py's argmax), lost in the decode step on an H100: Llama-3.1-8B
5.56 / 5.97 / 5.72 ms against 5.45 / 5.52 / 5.72 at batch 1 over 512 and 2048 cached rows and batch 8 over
512, Gemma-3-12B 9.64 / 10.05 / 10.11 against 9.25 / 9.38 / 9.96
(benchmarks/results/gpu_2026-12-05d, calls 9 and 10): the last split then waits on the slowest one and reads
every partial alone, where the launch spreads the merge over the GPU and starts beside the attention's drain.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.attention.kernel_parts import LaunchConfig, split_geometry, store_output_row
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.layers.pdl import pdl_enter, pdl_launch_options


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
