"""Argmax over a vocabulary-wide last dimension, as ``x.argmax(-1)`` returns it (the first index of the
maximum), in two reductions on the GPU.

torch's CUDA argmax of a few rows reduces each row in one thread block: on the H200 a batch-1 step of
DeepSeek-V2-Lite spent 30.7 us on the argmax of its 102,400 logits, 1% of the step
(benchmarks/results/gpu_2026-11-30b, call 1). Here each row is first cut into ``chunks`` equal pieces, each
piece's maximum and its first index found by a reduction spread over many blocks, then the first piece
holding the row's maximum is chosen: the first index of the maximum overall, so the result is
``argmax``'s to the bit (ties and NaN alike: a NaN is the maximum of its piece and of the row).
"""

from __future__ import annotations

import torch

_CHUNKS = 256  # pieces a row is cut into at most (a power of two dividing the width)
_MIN_WIDTH = 8192  # narrower rows: torch's argmax, already cheap


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> [...] int64: the first index of each row's maximum."""
    width = x.shape[-1]
    chunks = _CHUNKS
    while chunks > 1 and width % chunks:
        chunks //= 2
    if not x.is_cuda or width < _MIN_WIDTH or chunks < 16:
        return x.argmax(dim=-1)
    return argmax_in_pieces(x, chunks)


def argmax_in_pieces(x: torch.Tensor, chunks: int) -> torch.Tensor:
    """``argmax_last`` by way of ``chunks`` pieces a row (chunks divides V; any device: tests)."""
    width = x.shape[-1]
    pieces = x.reshape(*x.shape[:-1], chunks, width // chunks)  # [..., chunks, V / chunks]
    best, where = pieces.max(dim=-1)  # [..., chunks]: each piece's maximum, its first index
    piece = best.argmax(dim=-1, keepdim=True)  # [..., 1]: the first piece holding the row's maximum
    return piece.squeeze(-1) * (width // chunks) + where.gather(-1, piece).squeeze(-1)
