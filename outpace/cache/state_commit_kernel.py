"""One Triton launch that commits a verify's recurrent states in every state tensor of a model
(cache/recurrent_states.py ``RecurrentStates.commit``): row indices[r] of each state tensor receives its snapshot
row rows[r], unless that is the row the verify left in the state row itself (``held_row``). A gather and an index_copy per tensor took 4 launches a layer: 378 us of the widened Qwen3.5's
batch-1 verify step and 500 us of Nemotron-H-8B's on the H200, against about 20 us of bytes
(benchmarks/scripts/verify_timeline.py, gpu_2026-11-30d call 2).

The tensors are reached through tables of their base addresses (as cache/row_move_kernel.py reaches the KV
caches): program (t, r, c) copies words c * BLOCK .. of request r's row in tensor t, a row being the state of
one request, contiguous, and its snapshot rows [max_verify_rows, row] contiguous behind it. Rows are copied as
32-bit words, so any state dtype takes the same kernel (a row's bytes are a multiple of 4: checked)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 2048  # words a program copies


@triton.jit
def _commit_kernel(
    state_bases,  # [tensors] int64: each state tensor's address ([slots, row words])
    snapshot_bases,  # [tensors] int64: its snapshots' ([slots, max_verify_rows, row words])
    row_words,  # [tensors] int64: 32-bit words of one request's state
    indices,  # [b] int64: the requests' state rows
    rows,  # [b] int64: the snapshot row each commits
    max_verify_rows,
    held_row,  # a snapshot row the state rows already hold (not copied), or -1
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    r = tl.program_id(1)
    start = tl.program_id(2) * BLOCK
    words = tl.load(row_words + t)
    if start < words and tl.load(rows + r) != held_row:
        state = tl.load(state_bases + t).to(tl.pointer_type(tl.int32))
        snapshots = tl.load(snapshot_bases + t).to(tl.pointer_type(tl.int32))
        slot = tl.load(indices + r)
        offs = start + tl.arange(0, BLOCK)
        ok = offs < words
        src = snapshots + (slot * max_verify_rows + tl.load(rows + r)) * words + offs
        tl.store(state + slot * words + offs, tl.load(src, mask=ok), mask=ok)


class StateCommit:
    """The tables of ``_commit_kernel`` for fixed state and snapshot tensors (allocated once at start-up)."""

    def __init__(self, states: list[torch.Tensor], snapshots: list[torch.Tensor]) -> None:
        """states[i] [slots, ...] and snapshots[i] [slots, max_verify_rows, ...], each contiguous."""
        words = []
        for state, snaps in zip(states, snapshots, strict=True):
            row_bytes = state[0].numel() * state.element_size()
            if not (state.is_contiguous() and snaps.is_contiguous()) or row_bytes % 4:
                raise ValueError(f"state rows of {row_bytes} bytes are not contiguous 32-bit words")
            words.append(row_bytes // 4)
        device = states[0].device
        self.max_verify_rows = snapshots[0].shape[1]
        self.state_bases = torch.tensor([s.data_ptr() for s in states], device=device)
        self.snapshot_bases = torch.tensor([s.data_ptr() for s in snapshots], device=device)
        self.row_words = torch.tensor(words, device=device)
        self.chunks = triton.cdiv(max(words), _BLOCK)

    def __call__(self, indices: torch.Tensor, rows: torch.Tensor, held_row: int = -1) -> None:
        """indices, rows [b] int64 (device tensors: capturable); a request whose row is ``held_row`` is not
        copied (its state row already holds that state)."""
        grid = (self.row_words.numel(), indices.numel(), self.chunks)
        _commit_kernel[grid](
            self.state_bases,
            self.snapshot_bases,
            self.row_words,
            indices,
            rows,
            self.max_verify_rows,
            held_row,
            BLOCK=_BLOCK,
        )
