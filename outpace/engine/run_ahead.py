"""What running a decode step ahead needs (engine/runner.py): results copied to the host without
blocking the stream, and the KV rows of the step after next reserved before it is launched."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from outpace.cache.block_pool import BlockPool
from outpace.request import Request


class HostCopy:
    """values [n] (device) on their way to a host tensor; ``tolist`` waits only for them, not for
    work queued after them."""

    def __init__(self, values: torch.Tensor) -> None:
        on_gpu = values.is_cuda
        self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=on_gpu)
        self.host.copy_(values, non_blocking=True)
        self.done = None
        if on_gpu:  # on the CPU the copy above was synchronous
            self.done = torch.cuda.Event()
            self.done.record()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def tolist(self) -> list:
        self.wait()
        return self.host.tolist()


def reserve_rows(pool: BlockPool, reqs: Sequence[Request], rows: Sequence[int], limit: int, committed: int) -> bool:
    """Whether a step may run ahead for these requests: none of them surely ends by length with the
    current step, and not every one of them may (the current step commits at most ``committed`` tokens a
    request; a step run ahead of one that all may finish in would likely serve nobody, and the next step
    waits for it: at batch 1 with speculation, one step per request), and each request's table can hold
    ``rows`` [i] KV rows (at most ``limit``, the positions graphs and the model allow); if so the tables
    are grown to that now."""
    if not reqs:
        return False
    left = [r.params.max_tokens - r.num_output_tokens for r in reqs]  # the tokens each request may still produce
    if min(left) <= 1 or max(rows) > limit or max(left) <= committed:
        return False
    missing = [pool.blocks_needed(n) - len(pool.table(r.request_id)) for r, n in zip(reqs, rows)]  # blocks
    if sum(m for m in missing if m > 0) > pool.num_free:
        return False
    for r, n, m in zip(reqs, rows, missing):
        if m > 0:
            pool.grow(r.request_id, n)
    return True
