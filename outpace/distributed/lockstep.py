"""Every rank's engine in the same state, step after step.

As SGLang runs one scheduler per tensor-parallel rank and has rank 0 broadcast the requests it
received to the others (``broadcast_pyobj`` over the TP CPU group in sglang/srt/managers/scheduler.py
``recv_requests``), every rank here holds a whole engine: scheduler, block pool, indices and drafter
state. Only rank 0 (the driver) talks to the user; at each step it sends the others what changed
since the last one (requests added, requests aborted), and each rank then schedules and runs the
same step: scheduling is a function of that state, and the step's tokens are equal on every rank
(the head gathers the same logits everywhere; sampling draws from each request's seed). The driver
also sends the batch it scheduled, so a rank whose schedule differs fails loudly, naming the
difference, instead of entering mismatched collectives.

The one choice taken from measured time, the adaptive draft length (speculative/adaptive.py), is
rank 0's on every rank (``DriverChoice``).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

from outpace.distributed.collectives import broadcast_from_driver
from outpace.distributed.group import RankGroup


class RankDivergence(RuntimeError):
    """A rank's engine scheduled another batch than rank 0's."""


@dataclass
class StepMessage:
    """What rank 0 sends before each step."""

    ops: list[tuple[str, bytes | str]] = field(
        default_factory=list
    )  # ("add", pickled Request) | ("abort", id)
    schedule: list[tuple[str, int]] = field(
        default_factory=list
    )  # the batch: (request id, new tokens)


def schedule_of(batch) -> list[tuple[str, int]]:
    """A scheduled batch (engine/scheduler.py ScheduledRequest list) as (request id, new tokens)."""
    return [(s.request.request_id, s.num_new_tokens) for s in batch]


class Lockstep:
    def __init__(self, group: RankGroup) -> None:
        self.group = group
        self._ops: list[tuple[str, bytes | str]] = []

    # ---- rank 0 --------------------------------------------------------------------------------
    def added(self, request) -> None:
        """A request was queued on rank 0 (as it is now: before any step ran for it)."""
        self._ops.append(("add", pickle.dumps(request)))

    def aborted(self, request_id: str) -> None:
        self._ops.append(("abort", request_id))

    def lead(self, batch) -> None:
        """Send the others the changes since the last step and the batch rank 0 scheduled."""
        message, self._ops = StepMessage(self._ops, schedule_of(batch)), []
        broadcast_from_driver(message, self.group)

    def stop(self) -> None:
        """Tell the others the engine is closing (their ``receive`` returns None)."""
        broadcast_from_driver(None, self.group)

    # ---- ranks > 0 -----------------------------------------------------------------------------
    def receive(self) -> StepMessage | None:
        """Rank 0's next step (blocks until it sends one); None when the engine closes."""
        return broadcast_from_driver(None, self.group)

    def check(self, batch, message: StepMessage) -> None:
        mine = schedule_of(batch)
        if mine != message.schedule:
            raise RankDivergence(
                f"rank {self.group.rank} scheduled {mine}, rank 0 scheduled {message.schedule}: "
                f"the ranks' engines diverged"
            )


def requests_of(message: StepMessage):
    """The message's operations with requests unpickled: ("add", Request) | ("abort", request id)."""
    return [(op, pickle.loads(arg) if op == "add" else arg) for op, arg in message.ops]


class DriverChoice:
    """An adaptive draft-length chooser (speculative/adaptive.py) whose every ``choose`` returns rank 0's
    choice on every rank; its other methods are the wrapped chooser's (each rank keeps learning from its
    own measurements, only rank 0's decide)."""

    def __init__(self, chooser, group: RankGroup) -> None:
        self._chooser, self._group = chooser, group

    def choose(self, *args, **kwargs):
        return broadcast_from_driver(self._chooser.choose(*args, **kwargs), self._group)

    def __getattr__(self, name: str):
        return getattr(self._chooser, name)
