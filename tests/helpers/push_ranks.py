"""Every rank of a push all-reduce (distributed/push_all_reduce_kernel.py) in one process, under Triton's
interpreter: the ranks' kernels run one after another, so before rank r runs, its buffer is given what the
ranks that have not run yet would have pushed (their bits, -0.0 sent as +0.0); the ranks that ran pushed for
real, and what a later rank pushes into an earlier one's buffer (already summed) is checked and emptied."""

from __future__ import annotations

from collections.abc import Callable

import torch

from outpace.distributed.group import RankGroup
from outpace.distributed.symmetric_all_reduce import BITS, MAX_BYTES, SymmetricAllReduce


class PushRanks:
    """``world`` ranks' buffers and counters in one process (slots of MAX_BYTES, as the GPUs' are)."""

    def __init__(self, world: int, dtype: torch.dtype) -> None:
        bits, self.empty = BITS[dtype]
        self.world, self.dtype = world, dtype
        slot = MAX_BYTES // dtype.itemsize
        self.buffers = tuple(
            torch.full((2, world, slot), self.empty, dtype=bits) for _ in range(world)
        )
        self.addresses = torch.tensor([b.data_ptr() for b in self.buffers], dtype=torch.int64)
        self.epochs = [torch.zeros(1, dtype=torch.int32) for _ in range(world)]
        self.arrivals = [torch.zeros(1, dtype=torch.int32) for _ in range(world)]

    def group(self, rank: int) -> RankGroup:
        """Rank ``rank``'s group, its symmetric path over these buffers."""
        symmetric = SymmetricAllReduce(rank, {self.dtype: self.addresses}, "cpu")
        symmetric.epoch, symmetric.arrivals = self.epochs[rank], self.arrivals[rank]
        return RankGroup(rank, self.world, symmetric=symmetric)

    def sent(self, x: torch.Tensor) -> torch.Tensor:
        """The bits a rank sends for ``x``: its own, with -0.0 as +0.0."""
        bits = x.reshape(-1).view(self.buffers[0].dtype).clone()
        return bits.masked_fill(bits == self.empty, 0)

    def call(self, xs: list[torch.Tensor], run: Callable[[int], object]) -> list:
        """Every rank's call over its ``xs[r]`` (``run(r)`` launches rank r's kernel), rank 0 first; its
        results in rank order. Each rank's buffer is left empty."""
        n = xs[0].numel()
        results = []
        for r in range(self.world):
            phase = int(self.epochs[r]) % 2
            for later in range(r + 1, self.world):  # what the ranks yet to run would have pushed
                self.buffers[r][phase, later, :n] = self.sent(xs[later])
            for earlier in range(
                r
            ):  # (a -0.0 pushed as is would read as empty: r would wait forever)
                pushed = self.buffers[r][phase, earlier, :n]
                assert (pushed != self.empty).all(), "-0.0 pushed as is"
            results.append(run(r))
            for earlier in range(r):  # r's push into a buffer already summed: as delivered
                pushed = self.buffers[earlier][phase, r, :n]
                assert torch.equal(pushed, self.sent(xs[r])), "a rank pushes its bits, -0.0 as +0.0"
                pushed.fill_(self.empty)
            assert (self.buffers[r] == self.empty).all(), f"rank {r} left its buffer's slots filled"
            assert int(self.arrivals[r]) == 0
        return results
