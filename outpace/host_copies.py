"""Host values to the device without waiting on it.

``torch.tensor(values, device="cuda")`` copies from pageable memory, which torch makes a blocking copy: the host waits
for every kernel already queued on the stream. A prefill step that did that after launching its forward waited for the
forward at each such copy, and every piece of host work after it (sampling's tensors, the request state, the drafter's
absorb) then ran while the GPU idled. Writing one element from the host, ``t[i] = 3`` on a CUDA tensor, is such a copy
too (torch copies a CPU scalar tensor into the 0-d destination: ATen/TensorIndexing.h ``copy_to``): the values go as
one tensor (``to_device``), or by ``fill_`` / ``index_fill_``, which take a number and copy nothing. From page-locked
memory the copy is queued behind the stream's kernels like any launch, and torch keeps the page-locked block from reuse
until the copy has run. On an H100 (widened Llama, closed batches of 8, one round's first step each,
benchmarks/results/gpu_2026-12-06g) the prefill step took 0.5 to 1.6 ms less with these copies for plain decoding and
EAGLE3, but n-gram's 2.4 and 22 ms more; at batch 32 single rounds' first steps moved by 10 to 20 ms. Those moves were
torch's CPU repeat_interleave waking its thread team (outpace/host_repeat.py); since, every drafter's prefill step waits
once, for the first tokens the host reads (``benchmarks/scripts/prefill_waits.py``, gpu_2026-12-06h).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pinned(
    values: Sequence, device: torch.device, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """A host tensor of ``values``, page-locked when it is bound for a CUDA device (asynchronous copies)."""
    return torch.tensor(values, dtype=dtype, pin_memory=torch.device(device).type == "cuda")


def to_device(
    values: Sequence | torch.Tensor, device: torch.device | str, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """``values`` (a sequence, or a host tensor) as a ``dtype`` tensor on ``device``, copied there behind the kernels
    queued before it (no wait on a GPU)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if isinstance(values, torch.Tensor):
        host = values.to(dtype)
        host = host.pin_memory() if cuda else host
    else:
        host = pinned(values, device, dtype)
    return host.to(device, non_blocking=cuda)


def pieces_to_device(
    pieces: Sequence[torch.Tensor], device: torch.device | str
) -> list[torch.Tensor]:
    """Host int64 tensors on ``device`` in one copy (``to_device``), each as it was shaped: views of one buffer, every
    piece starting on a 16-byte boundary (Triton specializes a kernel on a pointer's 16-byte alignment: an unaligned
    view would compile it again)."""
    flat = [p.reshape(-1).to(torch.int64) for p in pieces]
    # each piece's start in the buffer: the pieces before it, each rounded up to two values (16 bytes)
    spans = [p.numel() + p.numel() % 2 for p in flat]
    host = torch.zeros(sum(spans), dtype=torch.int64)
    at = 0
    for p, span in zip(flat, spans):
        host[at : at + p.numel()] = p
        at += span
    buffer = to_device(host, device)
    views, at = [], 0
    for piece, p, span in zip(pieces, flat, spans):
        views.append(buffer[at : at + p.numel()].view(piece.shape))
        at += span
    return views
