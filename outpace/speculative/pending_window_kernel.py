"""speculative/proposer.py ``PendingRows.take_verified`` in one Triton launch (its docstring has the rule): one
program a batch row moves the row's kept pending rows to the front of its window and writes the verify's
committed rows after them, state and next token, then its start and count. The eager form is a chain of some
twenty small torch kernels (gathers, wheres, index copies): on the H200 an MTP step of the widened Qwen3.5 spent
about 70 us of its 4.66 ms in the update's (benchmarks/results/gpu_2026-12-02, call 2). A module of its own: Triton
is a GPU dependency, absent from CPU-only installs.

The window is rewritten in place: a program loads, chunk of state columns by chunk, the kept rows it reads (which
may be rows the same chunk writes), meets a barrier, then stores the whole window's chunk. Rows of a batch that
share the padding index race on that index's window, which no request reads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_STATE = 256  # state columns a chunk


@triton.jit
def _take_verified_kernel(
    hidden_ptr,  # [indices, W, H] the windows' states, rewritten
    tokens_ptr,  # [indices, W] int64 the token after each, rewritten
    start_ptr,  # [indices] int64, written
    count_ptr,  # [indices] int64, read and written
    req_ptr,  # [b] int64 each batch row's index
    lengths_ptr,  # [b] int64 each row's length L before the verify (0: a padding row)
    correct_ptr,  # [b] int64 accepted drafts a
    bonus_ptr,  # [b] int64
    path_ptr,  # [b, depth + 1] int64 committed nodes, then -1
    path_stride,
    out_ptr,  # [b, depth + 1] int64 the token after each committed node, then -1
    out_stride,
    state_ptr,  # [b * nodes, H] every verify row's state
    nodes,
    depth1,  # depth + 1: the path's and the tokens' width
    H,
    W: tl.constexpr,
    KEEP: tl.constexpr,
    ROWS: tl.constexpr,  # committed rows a window takes at most (padded with the last)
    BLOCK_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i = tl.program_id(0)
    r = tl.load(req_ptr + i)
    count = tl.load(count_ptr + r)
    length = tl.load(lengths_ptr + i)
    accepted = tl.load(correct_ptr + i)
    kept = tl.minimum(count, length)
    kept = tl.where(
        kept < KEEP, kept, KEEP
    )  # the last min(count, KEEP) rows; none before position 0
    w = tl.arange(0, BLOCK_W)  # [BLOCK_W] window columns
    in_window = w < W
    is_old = w < kept
    old_col = tl.minimum(count - kept + w, W - 1)  # the kept rows: the last ones
    j = tl.minimum(tl.maximum(w - kept, 0), ROWS - 1)  # committed row j of the verify
    node = tl.load(path_ptr + i * path_stride + j, mask=j < depth1, other=-1)
    last = tl.load(path_ptr + i * path_stride + accepted)
    node = tl.where(node >= 0, node, last)
    src = (i * nodes + node).to(tl.int64)  # [BLOCK_W] its row of the verify's states
    after = tl.load(out_ptr + i * out_stride + j, mask=j < depth1, other=-1)
    after = tl.where(after >= 0, after, tl.load(bonus_ptr + i))
    window = r.to(tl.int64) * W
    old_token = tl.load(tokens_ptr + window + old_col, mask=in_window & is_old, other=0)
    cols = tl.arange(0, BLOCK_H)
    for h0 in range(0, H, BLOCK_H):
        c = h0 + cols
        in_h = (c < H)[None, :]
        old = tl.load(
            hidden_ptr + (window + old_col)[:, None] * H + c[None, :],
            mask=(in_window & is_old)[:, None] & in_h,
            other=0.0,
        )
        new = tl.load(
            state_ptr + src[:, None] * H + c[None, :],
            mask=(in_window & ~is_old)[:, None] & in_h,
            other=0.0,
        )
        values = tl.where(is_old[:, None], old, new.to(old.dtype))
        tl.debug_barrier()  # every kept row of this chunk read before any is written
        tl.store(
            hidden_ptr + (window + w)[:, None] * H + c[None, :],
            values,
            mask=in_window[:, None] & in_h,
        )
    tl.debug_barrier()
    tl.store(tokens_ptr + window + w, tl.where(is_old, old_token, after), mask=in_window)
    tl.store(start_ptr + r, length - kept)
    tl.store(count_ptr + r, kept + accepted + 1)


def take_verified(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    start: torch.Tensor,
    count: torch.Tensor,
    req_indices: torch.Tensor,
    lengths: torch.Tensor,
    accepted: torch.Tensor,
    bonus: torch.Tensor,
    path: torch.Tensor,
    after: torch.Tensor,
    state: torch.Tensor,
    keep: int,
    rows: int,
) -> None:
    """``PendingRows.take_verified`` on its tensors (hidden [indices, W, H], tokens [indices, W], start and
    count [indices]; req_indices, lengths, accepted, bonus [b]; path and after [b, depth + 1], unit stride
    state [b * nodes, H] contiguous), in one launch."""
    b, (_, width, size) = req_indices.shape[0], hidden.shape
    assert hidden.is_contiguous() and state.is_contiguous() and state.shape[1] == size
    path, after = (t if t.stride(1) == 1 else t.contiguous() for t in (path, after))
    _take_verified_kernel[(b,)](
        hidden,
        tokens,
        start,
        count,
        req_indices,
        lengths,
        accepted,
        bonus,
        path,
        path.stride(0),
        after,
        after.stride(0),
        state,
        state.shape[0] // b,
        path.shape[1],
        size,
        W=width,
        KEEP=keep,
        ROWS=rows,
        BLOCK_W=triton.next_power_of_2(width),
        BLOCK_H=min(BLOCK_STATE, triton.next_power_of_2(size)),
    )
