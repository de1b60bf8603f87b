"""Weights brought into L2 on a side stream while latency-bound kernels run (few-row decode and verify).

At batch 1 a decoder layer alternates between kernels bound by the bytes of their weights (the projections, the
experts) and kernels bound by latency (attention over a short cache and its split merge), which leave the memory
idle for microseconds: on an H100 the Llama-3.1-8B shape's attention and merge take 8.2 us a layer for 0.7 us of
bytes (benchmarks/results/gpu_2026-12-06 call 30), and o_proj after them reads 33.5 MB. ``issue`` starts a kernel on
a side stream of the device, after the work the current stream has queued so far, that asks for a weight's bytes
to be brought into L2 (layers/l2_prefetch_kernel.py: ``cp.async.bulk.prefetch.L2``, sm_90, one instruction a 16 KB
chunk, no register written, nothing waited on); the projection after the attention then finds its weight there, or on its way.

Nothing on the current stream waits for these kernels until the end of the ``prefetching`` block, whose exit
joins the side stream back, so they add no step to the critical path: they only move reads earlier, into time
the memory had free. A prefetch is a hint: a line L2 drops before its use is read from memory as before, and every
result is the same bits either way.

Inside a CUDA graph capture the fork and the join are graph edges (torch's ``wait_stream`` records an event that
the capture turns into a dependency), so each captured step holds its prefetches. Off (``enabled`` False, or
OUTPACE_L2_PREFETCH=0) ``issue`` does nothing; so it does outside a ``prefetching`` block, and on a device without
the instruction (before Hopper) or off CUDA.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

# the decode settings' knob (benchmarks/scripts/decode_settings.py); OUTPACE_L2_PREFETCH=0 turns it off
enabled = os.environ.get("OUTPACE_L2_PREFETCH", "1") != "0"
# the share of each span's bytes asked for (decode_settings' knob: 0 leaves the side stream's fork and join alone)
fraction = 1.0
# the issued prefetches' count of the innermost open ``prefetching`` block (None: no block open)
_block: ContextVar[list[int] | None] = ContextVar("l2_prefetch_block", default=None)


@functools.cache
def _supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's prefetch stream (one per device, made on first use)."""
    return torch.cuda.Stream(device)


@contextmanager
def prefetching(device: torch.device) -> Iterator[None]:
    """A block within which ``issue`` prefetches on ``device``'s side stream; at its end the current stream waits
    for every prefetch it issued (the join a CUDA graph capture needs before it ends)."""
    if not (enabled and _supported(device)):
        yield
        return
    issued: list[int] = []
    token = _block.set(issued)
    try:
        yield
    finally:
        _block.reset(token)
        if issued:
            torch.cuda.current_stream(device).wait_stream(_side_stream(device))


def issue(*weights) -> None:
    """Bring ``weights`` into L2 beside the current stream (module docstring): each a tensor, or a quantized weight
    (``Fp8Weight``, ``Int4Weight``: its ``weight`` and ``scale``), or None (nothing). A tensor whose bytes are not
    one contiguous, 16-byte aligned span is left out. Nothing happens outside a ``prefetching`` block."""
    issued = _block.get()
    if issued is None:
        return
    spans = [t for w in weights for t in _tensors(w) if _whole_span(t)]
    if not spans:
        return
    from outpace.layers.l2_prefetch_kernel import prefetch_span  # Triton: a GPU dependency

    device = spans[0].device
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for t in spans:
            prefetch_span(t, fraction)
    issued.append(len(spans))


def _tensors(weight) -> list[torch.Tensor]:
    if weight is None:
        return []
    if isinstance(weight, torch.Tensor):
        return [weight]
    return [weight.weight, weight.scale]


def _whole_span(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.numel() > 0 and t.data_ptr() % 16 == 0
