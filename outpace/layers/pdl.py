"""Programmatic dependent launch (Hopper and newer): a kernel launched with it may start while the
kernel before it in the stream drains, do work that needs none of its results (prefetching weights),
and then wait for it (``griddepcontrol.wait``). Inside a CUDA graph this removes most of the gap
between consecutive kernels, which at batch 1 is a few percent of a decode step.

Every kernel launched this way calls ``pdl_enter`` before its first read of a previous kernel's output
and before its first write: it then completes only after its predecessor, so the chain of waits
orders every kernel after all earlier ones, as plain stream order does.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def pdl_available(device: torch.device) -> bool:
    """Hopper or newer, and a Triton that exposes the instructions; OUTPACE_PDL=0 turns it off (to
    measure what it gives)."""
    return (
        os.environ.get("OUTPACE_PDL", "1") != "0"
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] >= 9
        and hasattr(tl.extra.cuda, "gdc_wait")
    )


def pdl_launch_options(enabled: bool) -> dict:
    """Extra launch keyword arguments for a kernel that calls ``pdl_enter(enabled)``."""
    return {"launch_pdl": True} if enabled else {}


@triton.jit
def pdl_enter(ENABLED: tl.constexpr):
    """Let the next kernel start launching, then wait until the previous one's results are visible."""
    if ENABLED:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def prefetch_l2(ptrs):
    """Ask for the 128-byte lines at ``ptrs`` to be brought into L2 (no registers are written): what a
    kernel does with inputs that no earlier kernel still writes, before ``pdl_enter``. Only a hint:
    L2 is where global memory is coherent, so a line a later write changes is never read stale.
    Asking a whole weight in ahead, beyond a kernel's own first lines, lost: o_proj's 33.5 MB brought into L2 on
    a side stream (Hopper's bulk prefetch) while Llama-3.1-8B's attention ran made its batch-1 step 2.5% and 3.9%
    slower in two runs and its batch-8 step 3.9% and 4.4%; a quarter of it cost 3.6% at batch 1, the side
    stream's fork and join alone 0.2% (H100, benchmarks/results/gpu_2026-12-07c calls 2 and 3)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
