"""Zeroed scratch: a small buffer of zeros per kernel, device and size that its launches leave zero, for the
"last program to arrive finishes" pattern (arrival counters, tickets, masks set by atomics).

The contract: the buffer is all zeros when a launch starts, and every launch leaves it so (the program that
arrives last resets whatever the launch set), so no launch zeroes it first or allocates it: nothing but one
kernel launch, capturable in a CUDA graph. It is made once, by the first eager call of its owner, device, size
and dtype, and kept for the life of the process, since captured graphs hold its address. The first call must
not come during a capture: a tensor made there comes from the graph's memory pool, and its zero fill is
recorded into the graph rather than run, so eager launches would read garbage before the first replay. The
launches that share a buffer must not overlap (one stream, as the engine runs its steps).
"""

from __future__ import annotations

import torch

# (owner, device, size, dtype) -> the buffer
_BUFFERS: dict[tuple[str, torch.device, int, torch.dtype], torch.Tensor] = {}


def zeroed_scratch(owner: str, device: torch.device, size: int, dtype: torch.dtype) -> torch.Tensor:
    """[size] zeros of ``dtype`` on ``device``, the one buffer of every launch of ``owner`` (a file and what
    the buffer holds, as errors name it) at that size (module docstring: its launches leave it zero). Made
    by the first call, which must be eager: raises RuntimeError inside a CUDA graph capture."""
    key = (owner, device, size, dtype)
    if key not in _BUFFERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{owner} ({size} {dtype} zeros on {device}, allocated once) are made by an eager "
                "call: launch once before capturing"
            )
        _BUFFERS[key] = torch.zeros(size, dtype=dtype, device=device)
    return _BUFFERS[key]
