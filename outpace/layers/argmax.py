"""Argmax over a vocabulary-wide last dimension, as ``x.argmax(-1)`` returns it (the first index of the
maximum; a NaN counts as the maximum), in two Triton launches on the GPU
(layers/argmax_kernel.py).

torch's CUDA argmax of a few rows reduces each row in one thread block: on the H200 a batch-1 step of
DeepSeek-V2-Lite spent 30.7 us on the argmax of its 102,400 logits (benchmarks/results/gpu_2026-11-30b,
call 1). Cutting each row into pieces for torch's reductions (a max over the pieces, an argmax of their
maxima, a gather and an add) still took five launches and about 17 us after the 262k-row head of Gemma 4 at
batch 1 (gpu_2026-12-01b, call 3). Here the first launch gives each (row, piece of 2048 columns) a
program that finds its piece's maximum and the first index of it; the second, one program a row, picks the
first piece holding the row's maximum. Pieces are taken in column order, so the first index overall is
the first index in that piece: the result is ``argmax``'s to the bit, ties and NaN alike.
"""

from __future__ import annotations

import torch

_MIN_WIDTH = 8192  # narrower rows: torch's argmax, already one cheap launch


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> [...] int64: the first index of each row's maximum."""
    if not x.is_cuda or x.shape[-1] < _MIN_WIDTH:
        return x.argmax(dim=-1)
    from outpace.layers.argmax_kernel import argmax_rows  # (Triton: a GPU dependency)

    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return argmax_rows(rows).view(x.shape[:-1])
