"""Argmax over a vocabulary-wide last dimension, as ``x.argmax(-1)`` returns it (the first index of the
maximum; a NaN counts as the maximum), in two Triton launches on the GPU.

torch's CUDA argmax of a few rows reduces each row in one thread block: on the H200 a batch-1 step of
DeepSeek-V2-Lite spent 30.7 us on the argmax of its 102,400 logits (benchmarks/results/gpu_2026-11-30b,
call 1). Cutting each row into pieces for torch's reductions (a max over the pieces, an argmax of their
maxima, a gather and an add) still took five launches and about 17 us after the 262k-row head of Gemma 4 at
batch 1 (gpu_2026-12-01b, call 3). Here the first launch gives each (row, piece of ``PIECE`` columns) a
program that finds its piece's maximum and the first index of it; the second, one program a row, picks the
first piece holding the row's maximum. Pieces are taken in column order, so the first index overall is
the first index in that piece: the result is ``argmax``'s to the bit, ties and NaN alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options

PIECE = 2048  # columns a first-launch program reduces
_MIN_WIDTH = 8192  # narrower rows: torch's argmax, already one cheap launch


@triton.jit
def _first_max(values, index, NONE: tl.constexpr):
    """(maximum, first index of it) of ``values`` [B] at ``index`` [B]; a NaN is the maximum, and entries
    at index NONE never win over a real one."""
    nan = values != values
    first_nan = tl.min(tl.where(nan, index, NONE), axis=0)
    best = tl.max(tl.where(nan, float("-inf"), values), axis=0)
    first_best = tl.min(tl.where(values == best, index, NONE), axis=0)
    has_nan = first_nan < NONE
    return tl.where(has_nan, float("nan"), best), tl.where(has_nan, first_nan, first_best)


@triton.jit
def _piece_max_kernel(
    x, row_stride, width, piece_best, piece_where, num_pieces, B: tl.constexpr, PDL: tl.constexpr
):
    row, piece = tl.program_id(0), tl.program_id(1)
    pdl_enter(PDL)
    cols = piece * B + tl.arange(0, B)
    values = tl.load(
        x + row.to(tl.int64) * row_stride + cols, mask=cols < width, other=float("-inf")
    ).to(tl.float32)
    # (columns past the row read -inf; a real -inf at a lower index wins their tie)
    best, where = _first_max(values, tl.where(cols < width, cols, 2**31 - 1), 2**31 - 1)
    tl.store(piece_best + row * num_pieces + piece, best)
    tl.store(piece_where + row * num_pieces + piece, where)


@triton.jit
def _row_max_kernel(piece_best, piece_where, out, num_pieces, P: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    pdl_enter(PDL)
    p = tl.arange(0, P)
    real = p < num_pieces
    best = tl.load(piece_best + row * num_pieces + p, mask=real, other=float("-inf"))
    where = tl.load(piece_where + row * num_pieces + p, mask=real, other=2**31 - 1)
    _, first = _first_max(best, where, 2**31 - 1)
    tl.store(out + row, first.to(tl.int64))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [R, V] (unit stride along V; any float dtype) -> [R] int64: ``x.argmax(-1)`` in two launches (any
    device Triton runs on: the interpreter's on a CPU)."""
    rows, width = x.shape
    assert x.stride(1) == 1 and width < 2**31 - 1
    pieces = triton.cdiv(width, PIECE)
    piece_best = torch.empty(rows, pieces, dtype=torch.float32, device=x.device)  # [R, pieces]
    piece_where = torch.empty(rows, pieces, dtype=torch.int32, device=x.device)  # [R, pieces]
    out = torch.empty(rows, dtype=torch.int64, device=x.device)  # [R]
    pdl = pdl_available(x.device)
    _piece_max_kernel[(rows, pieces)](
        x,
        x.stride(0),
        width,
        piece_best,
        piece_where,
        pieces,
        B=PIECE,
        PDL=pdl,
        **pdl_launch_options(pdl),
    )
    _row_max_kernel[(rows,)](
        piece_best,
        piece_where,
        out,
        pieces,
        P=triton.next_power_of_2(pieces),
        PDL=pdl,
        **pdl_launch_options(pdl),
    )
    return out


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> [...] int64: the first index of each row's maximum."""
    if not x.is_cuda or x.shape[-1] < _MIN_WIDTH:
        return x.argmax(dim=-1)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return argmax_rows(rows).view(x.shape[:-1])
