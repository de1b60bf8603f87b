"""layers/argmax.py's argmax in two Triton launches (its module docstring): a program per (row, piece of
``PIECE`` columns) finds the piece's maximum and the first index of it, then one program a row picks the first
piece holding the row's maximum. A module of its own: Triton is a GPU dependency, absent from CPU-only installs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options

PIECE = 2048  # columns a first-launch program reduces


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
