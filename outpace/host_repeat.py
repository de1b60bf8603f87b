"""Each value repeated its count times, on the host, without torch's thread team.

torch's CPU ``repeat_interleave`` hands every call to ``at::parallel_for`` with a grain of one element
(aten/src/ATen/native/Repeat.cpp ``compute_cpu``), so even 32 counts wake the whole OpenMP team and wait for its
slowest thread. In a batch-32 prefill step on an H100 host those calls took 1.6 to 8.8 ms now and then, where they
need microseconds (closed_batch_rounds.py's first steps under torch.profiler, benchmarks/results/gpu_2026-12-06h).
numpy's ``repeat`` runs on the calling thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def repeat_counts(
    values: Sequence[int] | torch.Tensor, counts: Sequence[int] | torch.Tensor
) -> torch.Tensor:
    """[sum(counts)] int64 host tensor: ``values[i]`` ``counts[i]`` times, in order (``values`` and ``counts`` of one
    length, on the host)."""
    if isinstance(values, torch.Tensor):
        values = values.numpy()
    if isinstance(counts, torch.Tensor):
        counts = counts.numpy()
    return torch.from_numpy(
        np.repeat(np.asarray(values, dtype=np.int64), np.asarray(counts, dtype=np.int64))
    )


def run_positions(
    counts: Sequence[int] | torch.Tensor, starts: Sequence[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """[sum(counts)] int64 host tensor: starts[i] .. starts[i] + counts[i] - 1 for each i in turn (each value's place
    in its run, from 0 without ``starts``)."""
    counts = torch.as_tensor(counts, dtype=torch.int64)
    firsts = counts.cumsum(0) - counts
    places = torch.arange(int(counts.sum())) - repeat_counts(firsts, counts)
    return places if starts is None else places + repeat_counts(starts, counts)
