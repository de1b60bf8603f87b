"""The number of streaming multiprocessors, which sizes the GPU kernels' grids."""

from __future__ import annotations

import functools

import torch


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (Triton's interpreter), small enough that
    the tests on the CPU see grids split the way large problems are split on a GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
