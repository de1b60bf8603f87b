"""A decode step in flight: its key, the requests it ran for, and its outputs on their way to the host."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from outpace.engine.step_key import StepKey

if TYPE_CHECKING:
    from outpace.engine.run_ahead import SavedRows


class HostCopy:
    """values [n] (device) on their way to a host tensor; ``tolist`` waits only for them, not for
    work queued after them. ``spare``: the host tensors and events of steps whose outputs were read, by shape and
    dtype: the copy takes one when it can (on the GPU no page-locked tensor and no event allocated a step), and
    returns its own once read."""

    def __init__(self, values: torch.Tensor, spare: SpareCopies | None = None) -> None:
        self.spare = spare
        kept = spare.get((values.shape, values.dtype)) if spare is not None else None
        if kept:
            self.host, self.done = kept.pop()
        else:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=values.is_cuda)
            self.done = torch.cuda.Event() if values.is_cuda else None
        self.host.copy_(values, non_blocking=True)
        if self.done is not None:  # on the CPU the copy above was synchronous
            self.done.record()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def tolist(self) -> list:
        """The values; read once (the host tensor is then another step's to take)."""
        self.wait()
        values, host = self.host.tolist(), self.host
        if self.spare is not None:
            self.spare.setdefault((host.shape, host.dtype), []).append((host, self.done))
            self.host = self.done = None
        return values


# Host tensors and events of read outputs, by (shape, dtype): ``HostCopy``'s ``spare``.
SpareCopies = dict[
    tuple[torch.Size, torch.dtype], list[tuple[torch.Tensor, "torch.cuda.Event | None"]]
]


class StepTimer:
    """A step's time: on CUDA the GPU's, between events around its launch (read once its outputs are on
    the host, so without a sync of its own); elsewhere the wall time of the (synchronous) call."""

    def __init__(self, device: torch.device) -> None:
        self.events = None
        if device.type == "cuda":
            self.events = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            self.events[0].record()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.events is not None:
            self.events[1].record()
        self.elapsed = time.perf_counter() - self.t0

    def seconds(self) -> float:
        if self.events is None:
            return self.elapsed
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1]) / 1e3


@dataclass
class DecodeLaunch:
    """A decode step in flight."""

    key: StepKey
    request_ids: tuple[str, ...]
    starts: tuple[int, ...]  # each request's length L when the step started
    copy: HostCopy  # its packed outputs on their way to the host
    req_indices: list[int]  # each request's row of the request table
    saved: SavedRows | None = None  # run ahead: its rows' request state before it
    timer: StepTimer | None = None  # the step's time, for the adaptive chooser
    # each request's bound on its drafter's pending rows before the step (engine/step_key.py HoldRule.advance)
    held_before: tuple[int | None, ...] = ()
    # requests that left while it ran ahead for them (engine/run_ahead.py ``RunAhead.forget``): never restored
    left: set[str] = field(default_factory=set)

    def row_of(self, request_ids: tuple[str, ...]) -> list[int]:
        """Each of ``request_ids``' row in this launch's outputs (which may also hold requests gone since)."""
        if request_ids == self.request_ids:
            return list(range(len(request_ids)))
        row = {rid: i for i, rid in enumerate(self.request_ids)}
        return [row[rid] for rid in request_ids]
