"""The end of a decode step in one Triton launch (engine/request_table.py ``RequestTable.commit``): each request's
row advanced by what its verify committed (length L -> L + accepted drafts + 1, last token the bonus), the
padding row's length kept 0, and the step's packed output written (each row's output tokens, then each row's
accepted drafts: engine/decode_step.py ``unpack``). torch took an add or two, two index_puts, a fill and a cat
(about 7 us after the head of every captured step on the H200: gpu_2026-12-01b, call 3's Gemma 4 timeline).

Rows of a padded batch that use the padding row write nothing to it but its zero length (real rows are distinct,
so no two programs write one place)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 64  # batch rows a program commits


@triton.jit
def _commit_kernel(
    indices,  # [b] the rows' request rows
    lengths,  # [b] their lengths L before the step
    num_correct,  # [b] accepted drafts (stride correct_stride)
    bonus,  # [b] the bonus tokens (stride bonus_stride)
    tokens,  # [b, width] output tokens (strides token_row, token_col)
    table_lengths,  # [table_rows] written
    table_last_tokens,  # [table_rows] written
    packed,  # [b * width + b] written
    correct_stride,
    bonus_stride,
    token_row,
    token_col,
    padding_index,
    b,
    width,
    R: tl.constexpr,
    W: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * R + tl.arange(0, R)
    live = r < b
    index = tl.load(indices + r, mask=live, other=padding_index)
    real = live & (index != padding_index)
    correct = tl.load(num_correct + r * correct_stride, mask=live, other=0)
    tl.store(table_lengths + index, tl.load(lengths + r, mask=live) + correct + 1, mask=real)
    tl.store(table_last_tokens + index, tl.load(bonus + r * bonus_stride, mask=live), mask=real)
    if pid == 0:
        tl.store(table_lengths + padding_index, 0)
    cols = tl.arange(0, W)
    cell = live[:, None] & (cols[None, :] < width)
    out = tl.load(tokens + r[:, None] * token_row + cols[None, :] * token_col, mask=cell)
    tl.store(packed + r[:, None] * width + cols[None, :], out, mask=cell)
    tl.store(packed + b * width + r, correct, mask=live)


def commit_rows(
    indices: torch.Tensor,
    lengths: torch.Tensor,
    tokens: torch.Tensor,
    num_correct: torch.Tensor,
    bonus: torch.Tensor,
    table_lengths: torch.Tensor,
    table_last_tokens: torch.Tensor,
    padding_index: int,
) -> torch.Tensor:
    """``RequestTable.commit`` in one launch: ``indices``, ``lengths`` [b] contiguous int64; ``tokens`` [b, width],
    ``num_correct`` and ``bonus`` [b], any strides. Returns the packed [b * width + b] int64."""
    b, width = tokens.shape
    packed = torch.empty(b * width + b, dtype=torch.int64, device=tokens.device)
    _commit_kernel[(triton.cdiv(b, ROWS),)](
        indices,
        lengths,
        num_correct,
        bonus,
        tokens,
        table_lengths,
        table_last_tokens,
        packed,
        num_correct.stride(0),
        bonus.stride(0),
        tokens.stride(0),
        tokens.stride(1),
        padding_index,
        b,
        width,
        R=ROWS,
        W=triton.next_power_of_2(width),
    )
    return packed
