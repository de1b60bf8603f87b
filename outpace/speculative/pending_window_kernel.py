"""The pending windows' bookkeeping (speculative/proposer.py ``PendingRows``) in single Triton launches, each the
eager torch form's result to the bit:

- ``take_verified`` (its docstring has the rule): the row's kept pending rows moved to the front of its window,
  the verify's committed rows written after them, state and next token, then its start and count.
- ``window``: a draft's inputs, the batch's windows gathered (states, tokens, start, count) with each row's
  positions, which rows are pending, and the flat index of its last pending row (the torch form: eleven launches or so).
- ``layer_tokens``: the tokens MTP layer k reads over a window, token t + k + 1 of [pending, drafts] (the torch
  form: nine launches a layer).
- ``append``: a held step's committed row after each row's pending ones (the torch form: seven launches, on
  every held step of EAGLE3 and MTP).

The update's form is a chain of some
twenty small torch kernels (gathers, wheres, index copies): on the H200 an MTP step of the widened Qwen3.5 spent
about 70 us of its 4.66 ms in the update's (benchmarks/results/gpu_2026-12-02, call 2). A module of its own: Triton
is a GPU dependency, absent from CPU-only installs.

``take_verified`` and ``window`` take a program for each (batch row, chunk of ``BLOCK_STATE`` state columns): one
program a batch row walked a window's chunks in turn, 6.9 and 5.2 us at the widened Qwen3.5's batch 1 on the H200
(12 rows of 4096 columns; gpu_2026-12-02 call 15's step timeline) where the bytes take a fraction of that. The
window is rewritten in place: a program loads the kept rows its chunk reads (which may be rows the same chunk
writes), meets a barrier, then stores the chunk; no other program touches those columns. The row's start, count
and tokens, which every program of the row reads first, are written by its last program to arrive (an arrival
counter, acq_rel at gpu scope, left zero: layers/zeroed_scratch.py). Rows of a batch that share the padding index
race on that index's window, which no request reads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.layers.zeroed_scratch import zeroed_scratch

BLOCK_STATE = 256  # state columns a chunk (a program's)


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
    arrivals_ptr,  # [b] int32 zeros, left zero
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
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # this program's state columns
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
        hidden_ptr + (window + w)[:, None] * H + c[None, :], values, mask=in_window[:, None] & in_h
    )
    tl.debug_barrier()  # every thread's reads of the row's count and tokens before the count
    arrivals = arrivals_ptr + i
    if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
        tl.store(tokens_ptr + window + w, tl.where(is_old, old_token, after), mask=in_window)
        tl.store(start_ptr + r, length - kept)
        tl.store(count_ptr + r, kept + accepted + 1)
        tl.atomic_xchg(arrivals, 0)  # zero again for the next launch


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
    block = min(BLOCK_STATE, triton.next_power_of_2(size))
    arrivals = zeroed_scratch(  # [b] one a batch row
        "speculative/pending_window_kernel.py: take_verified's arrival counters",
        hidden.device,
        b,
        torch.int32,
    )
    _take_verified_kernel[(b, triton.cdiv(size, block))](
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
        arrivals,
        state.shape[0] // b,
        path.shape[1],
        size,
        W=width,
        KEEP=keep,
        ROWS=rows,
        BLOCK_W=triton.next_power_of_2(width),
        BLOCK_H=block,
    )


@triton.jit
def _window_kernel(
    hidden_ptr,  # [indices, W, H]
    tokens_ptr,  # [indices, W] int64
    start_ptr,  # [indices] int64
    count_ptr,  # [indices] int64
    req_ptr,  # [b] int64
    hidden_out,  # [b * C, H]
    tokens_out,  # [b, C] int64
    start_out,  # [b] int64
    count_out,  # [b] int64
    positions_out,  # [b * C] int64: start + 0 .. C - 1
    last_out,  # [b] int64: i * C + count - 1
    live_out,  # [b * C] bool: column < count
    H,
    W: tl.constexpr,  # the windows' width
    C: tl.constexpr,  # the leading columns read (<= W)
    BLOCK_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i = tl.program_id(0)
    r = tl.load(req_ptr + i).to(tl.int64)
    w = tl.arange(0, BLOCK_W)
    in_window = w < C
    row = i.to(tl.int64) * C
    if (
        tl.program_id(1) == 0
    ):  # the row's bookkeeping, by its first chunk's program (written to new tensors)
        start = tl.load(start_ptr + r)
        count = tl.minimum(tl.load(count_ptr + r), C)  # (the padding row's may be more)
        tokens = tl.load(tokens_ptr + r * W + w, mask=in_window)
        tl.store(tokens_out + row + w, tokens, mask=in_window)
        tl.store(positions_out + row + w, start + w, mask=in_window)
        tl.store(live_out + row + w, w < count, mask=in_window)
        tl.store(start_out + i, start)
        tl.store(count_out + i, count)
        tl.store(last_out + i, row + count - 1)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # this program's state columns
    inside = in_window[:, None] & (c < H)[None, :]
    values = tl.load(hidden_ptr + (r * W + w)[:, None] * H + c[None, :], mask=inside)
    tl.store(hidden_out + (row + w)[:, None] * H + c[None, :], values, mask=inside)


def window(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    start: torch.Tensor,
    count: torch.Tensor,
    req_indices: torch.Tensor,
    columns: int,
) -> tuple[torch.Tensor, ...]:
    """``PendingRows.window`` on its tensors over the windows' first ``columns`` columns (C): (states [b * C,
    H], tokens [b, C], start [b], count [b], positions [b * C], last [b], live [b * C]), in one launch."""
    b, (_, window_width, size) = req_indices.shape[0], hidden.shape
    assert hidden.is_contiguous() and tokens.is_contiguous() and columns <= window_width
    dev = hidden.device
    out = (
        torch.empty(b * columns, size, dtype=hidden.dtype, device=dev),
        torch.empty(b, columns, dtype=torch.int64, device=dev),
        torch.empty(b, dtype=torch.int64, device=dev),
        torch.empty(b, dtype=torch.int64, device=dev),
        torch.empty(b * columns, dtype=torch.int64, device=dev),
        torch.empty(b, dtype=torch.int64, device=dev),
        torch.empty(b * columns, dtype=torch.bool, device=dev),
    )
    block = min(BLOCK_STATE, triton.next_power_of_2(size))
    _window_kernel[(b, triton.cdiv(size, block))](
        hidden,
        tokens,
        start,
        count,
        req_indices,
        *out,
        size,
        W=window_width,
        C=columns,
        BLOCK_W=triton.next_power_of_2(columns),
        BLOCK_H=block,
    )
    return out


@triton.jit
def _layer_tokens_kernel(
    tokens_ptr,  # [b, W] int64 the window's tokens
    count_ptr,  # [b] int64
    drafts_ptr,  # [b, D] int64 the drafts so far
    out_ptr,  # [b * W] int64
    k,
    D,
    W: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    i = tl.program_id(0)
    count = tl.load(count_ptr + i)
    w = tl.arange(0, BLOCK_W)
    in_window = w < W
    read = w + k  # token t + k + 1 of [pending, drafts]
    pending = tl.load(tokens_ptr + i * W + tl.minimum(read, W - 1), mask=in_window)
    # (no drafts yet, D = 0: every row reads a pending token, as the torch form does)
    drafted = tl.minimum(tl.maximum(read - count, 0), D - 1)
    draft = tl.load(drafts_ptr + i * D + drafted, mask=in_window & (D > 0), other=0)
    tl.store(
        out_ptr + i * W + w, tl.where((read < count) | (D == 0), pending, draft), mask=in_window
    )


def layer_tokens(
    tokens: torch.Tensor, count: torch.Tensor, drafts: torch.Tensor, k: int
) -> torch.Tensor:
    """``PendingRows.layer_tokens``: tokens [b, W] and count [b] of ``window``, drafts [b, D] int64 -> [b * W]
    int64, in one launch."""
    b, width = tokens.shape
    drafts = drafts.contiguous()
    out = torch.empty(b * width, dtype=torch.int64, device=tokens.device)
    _layer_tokens_kernel[(b,)](
        tokens,
        count,
        drafts,
        out,
        k,
        drafts.shape[1],
        W=width,
        BLOCK_W=triton.next_power_of_2(width),
    )
    return out


@triton.jit
def _append_kernel(
    hidden_ptr,  # [indices, W, H] the windows' states
    tokens_ptr,  # [indices, W] int64 the token after each
    count_ptr,  # [indices] int64, read and written
    req_ptr,  # [b] int64 each batch row's index
    state_ptr,  # [b, H] the row each appends
    after_ptr,  # [b] int64 the token after it
    H,
    W: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i = tl.program_id(0)
    r = tl.load(req_ptr + i).to(tl.int64)
    count = tl.load(count_ptr + r)
    column = tl.minimum(count, W - 1)  # (the padding row, which padded rows share, may count W)
    dst = hidden_ptr + (r * W + column) * H
    src = state_ptr + i.to(tl.int64) * H
    # one program walks its row's states (the row is one column of one window)
    for c0 in range(0, H, BLOCK_H):
        c = c0 + tl.arange(0, BLOCK_H)
        tl.store(dst + c, tl.load(src + c, mask=c < H).to(hidden_ptr.dtype.element_ty), mask=c < H)
    tl.store(tokens_ptr + r * W + column, tl.load(after_ptr + i))
    tl.store(count_ptr + r, tl.minimum(count + 1, W))


def append(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    count: torch.Tensor,
    req_indices: torch.Tensor,
    state: torch.Tensor,
    after: torch.Tensor,
) -> None:
    """``PendingRows.append`` on its tensors (hidden [indices, W, H], tokens [indices, W], count [indices];
    req_indices and after [b], state [b, H] contiguous), in one launch."""
    b, (_, width, size) = req_indices.shape[0], hidden.shape
    assert hidden.is_contiguous() and state.is_contiguous() and state.shape == (b, size)
    _append_kernel[(b,)](
        hidden,
        tokens,
        count,
        req_indices,
        state,
        after,
        size,
        W=width,
        BLOCK_H=min(1024, triton.next_power_of_2(size)),
    )
