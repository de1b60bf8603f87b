"""The n-gram drafter's ``update`` (speculative/drafters/ngram.py) in one Triton launch: each row's tokens after
its committed rows written into its history row at L + 1 .. L + width, padded with the bonus token. torch took
about seven launches (an arange, adds, a pad, a compare, a where, an index_put) at every decode step, drafting or
not: what a zero-draft n-gram step cost beyond plain decoding's (0.6% at batch 32 on the H200's widened zoo,
benchmarks/results/gpu_2026-12-01c, call 1)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_history_kernel(
    history,  # [table_rows, max_len] written at each row's L + 1 .. L + width
    req_indices,  # [b]
    lengths,  # [b] L
    tokens,  # [b, out_width] the output tokens, -1 after the bonus (strides token_row, token_col)
    bonus,  # [b] (stride bonus_stride)
    history_stride,
    token_row,
    token_col,
    bonus_stride,
    out_width,
    width,
    W: tl.constexpr,
):
    r = tl.program_id(0)
    req = tl.load(req_indices + r)
    start = tl.load(lengths + r) + 1
    j = tl.arange(0, W)
    out = tl.load(tokens + r * token_row + j * token_col, mask=j < out_width, other=-1)
    out = tl.where(out >= 0, out, tl.load(bonus + r * bonus_stride))
    tl.store(history + req * history_stride + start + j, out, mask=j < width)


def write_history(
    history: torch.Tensor,
    req_indices: torch.Tensor,
    lengths: torch.Tensor,
    tokens: torch.Tensor,
    bonus: torch.Tensor,
    width: int,
) -> None:
    """history[req_indices[s], lengths[s] + 1 + j] = tokens[s, j], or bonus[s] where that is -1 or j is past
    ``tokens``' width, for j < ``width`` (``req_indices``, ``lengths`` [b] contiguous; ``history`` with unit
    column stride)."""
    b, out_width = tokens.shape
    _write_history_kernel[(b,)](
        history,
        req_indices,
        lengths,
        tokens,
        bonus,
        history.stride(0),
        tokens.stride(0),
        tokens.stride(1),
        bonus.stride(0),
        out_width,
        width,
        W=triton.next_power_of_2(width),
    )
