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

# Under PDL a few-row projection's programs prefetch the first columns of their weight rows into L2 before they
# wait on their inputs: at least MIN_PREFETCH_COLUMNS (~2 us of reads over a grid), and more, up to whole rows,
# while the grid's prefetch stays within ``prefetch_bytes``. A projection that follows a short, latency-bound
# kernel (o_proj after attention's merge) then reads much of its weight from L2 (``prefetch_columns``).
MIN_PREFETCH_COLUMNS = 512
prefetch_bytes = 8 << 20


def prefetch_columns(rows: int, k: int) -> int:
    """PREFETCH_K of a grid that prefetches ``rows`` weight rows of K ``k`` columns: a power of two, at least
    MIN_PREFETCH_COLUMNS (64 for a narrower K), at most K's power of two, and beyond the least only as far as
    ``prefetch_bytes`` covers the rows. The kernels ask for one 128-byte line every 64 columns (a bf16 row's
    lines; half of a float32 row's, each fp8 line's first half), so a column counts 2 bytes."""
    within = prefetch_bytes // max(1, rows * 2)
    columns = max(
        MIN_PREFETCH_COLUMNS, 1 << max(0, within.bit_length() - 1)
    )  # (a power of two <= within)
    return max(64, min(columns, triton.next_power_of_2(k)))


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
    L2 is where global memory is coherent, so a line a later write changes is never read stale."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
