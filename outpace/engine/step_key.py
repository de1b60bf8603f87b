"""What fixes a decode step's shapes and host flags: the key of one captured graph (engine/decode_step.py),
and the rule that sets its ``hold`` flag.

Holding (speculative/proposer.py's docstring): a zero-draft step whose drafter can hold skips the draft
forward and appends its committed row to each request's pending window, unless that could overflow some
request's window: then it flushes (runs the forward, which empties the windows). Which one a step does is a
host flag of its key (``StepKey.hold``), so both are captured graphs. ``HoldRule`` decides it from a bound
on each decoding request's pending rows kept on the host: after a prefill or a step that ran the forward,
what that step may leave (``Proposer.pending_rows``, whatever the verify accepted: the bound is known when
the step is launched, before its tokens are read, as a step run ahead needs); a held step adds one. The
bound is a function of the schedule and the draft shapes alone, which every tensor-parallel rank shares
(distributed/lockstep.py: rank 0's shapes on every rank), so every rank takes the same flag without
sending it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add

from outpace.layers.sampler import is_greedy, is_seeded
from outpace.sampling_params import MAX_LOGPROBS
from outpace.speculative.proposer import DraftShape, Proposer


class SamplingMode(enum.Enum):
    """What a batch's sampling needs, a host flag fixed per captured step: every request greedy
    (argmax only); some sample from their temperature alone; some also apply top-k, top-p or min-p
    (a sort over the vocabulary per verified row); some are seeded (layers/sampler.py: their noise is
    drawn at every node; the filters are on, as for FILTERED)."""

    GREEDY = "greedy"
    SAMPLE = "sample"
    FILTERED = "filtered"
    SEEDED = "seeded"

    @property
    def greedy(self) -> bool:
        return self is SamplingMode.GREEDY

    @property
    def filtered(self) -> bool:
        return self in (SamplingMode.FILTERED, SamplingMode.SEEDED)

    @property
    def seeded(self) -> bool:
        return self is SamplingMode.SEEDED

    @classmethod
    def of(cls, params: list) -> SamplingMode:
        sampled = [p for p in params if not is_greedy(p)]
        if not sampled:
            return cls.GREEDY
        if any(is_seeded(p) for p in sampled):
            return cls.SEEDED
        filtered = any(
            (p.top_k or 0) > 0
            or (p.top_p if p.top_p is not None else 1.0) < 1.0
            or (p.min_p or 0.0) > 0
            for p in sampled
        )
        return cls.FILTERED if filtered else cls.SAMPLE


# The top log-probabilities a step computes: the most its requests want, rounded up to one of these, so
# that few steps' keys are captured (each request keeps only its own: ``request.position_logprobs``)
LOGPROB_WIDTHS = (0, 1, 5, MAX_LOGPROBS)


@dataclass(frozen=True)
class LogitsFeatures:
    """What a batch asks of the target's logits beyond sampling (host flags fixed per step):
    ``penalties``: some request has penalties, a logit bias, allowed tokens or min_tokens; ``grammar``: some
    request has a grammar; ``logprobs``: the top log-probabilities computed per position, ``LOGPROB_WIDTHS``'
    least that covers every request's (0: only the chosen token's; None: no request wants any)."""

    penalties: bool = False
    grammar: bool = False
    logprobs: int | None = None

    @classmethod
    def of(cls, params: list) -> LogitsFeatures:
        wanted = max((p.logprobs for p in params if p.logprobs is not None), default=None)
        return cls(
            any(p.penalized for p in params),
            any(p.structured_outputs is not None for p in params),
            None if wanted is None else next(w for w in LOGPROB_WIDTHS if w >= wanted),
        )

    @property
    def any(self) -> bool:
        return self.penalties or self.grammar or self.logprobs is not None


@dataclass(frozen=True)
class StepKey:
    """What fixes a step's shapes: one captured graph each (those without logits features captured at start-up,
    the others on first use: ``ModelRunner``).
    ``hold``: a zero-draft step that holds (module docstring) rather than runs the draft forward.
    ``narrow``: a drafting step whose drafter holds and none of whose requests holds rows from held steps: the
    draft forward runs over the narrow windows (speculative/proposer.py ``PendingRows.narrow``)."""

    bucket: int
    shape: DraftShape
    mode: SamplingMode
    features: LogitsFeatures = field(default_factory=LogitsFeatures)
    hold: bool = False
    narrow: bool = False

    def __post_init__(self) -> None:
        if self.hold and self.shape.num_steps:
            raise ValueError(
                f"a step drafting {self.shape.label} cannot hold: only zero-draft steps do"
            )
        if self.narrow and not self.shape.num_steps:
            raise ValueError(
                "a zero-draft step runs over whole windows: only drafting steps narrow"
            )


class HoldRule:
    """Whether a zero-draft step holds or flushes (module docstring), from the host's bound on each decoding
    request's pending drafter rows."""

    def __init__(self, proposer: Proposer | None) -> None:
        self.proposer = proposer
        self.window = proposer.hold_window if proposer is not None else 0  # 0: never holds
        self.narrow_rows = proposer.narrow_window if proposer is not None else 0
        self._bounds: dict[str, int] = {}  # request id -> its bound; absent: fresh from a prefill
        # a request's bound fresh from a prefill
        self._fresh = proposer.pending_rows(DraftShape(0)) if self.window else 0

    def may_hold(self, shape: DraftShape) -> bool:
        """Whether steps of ``shape`` hold where the windows allow (both variants are captured)."""
        return self.window > 0 and shape.num_steps == 0

    def holds(self, request_ids: Sequence[str], shape: DraftShape) -> bool:
        """Whether a step of ``shape`` for these requests holds: every one's window has a row left."""
        return self.may_hold(shape) and max(self._bounds_of(request_ids), default=0) < self.window

    def narrow_variants(self, shape: DraftShape) -> tuple[bool, ...]:
        """The ``StepKey.narrow`` flags of the steps of ``shape`` that run the draft forward (both are
        captured), the narrow one last: drafting steps narrow where the drafter holds. A zero-draft step that
        runs the forward flushes, so some window holds more than the narrow rows."""
        return (False, True) if self.window and self.narrow_rows and shape.num_steps else (False,)

    def narrow(self, request_ids: Sequence[str], shape: DraftShape) -> bool:
        """Whether a drafting step of ``shape`` for these requests runs over the narrow windows: no request
        may hold more pending rows than they have."""
        return (
            self.narrow_variants(shape)[-1]
            and max(self._bounds_of(request_ids), default=0) <= self.narrow_rows
        )

    def advance(self, request_ids: Sequence[str], key: StepKey) -> tuple[int | None, ...]:
        """A step of ``key`` was launched for these requests: their bounds after it. Returns the bounds
        before it (``restore``'s argument should the step be undone)."""
        if not self.window:
            return ()
        before = tuple(map(self._bounds.get, request_ids))
        if key.hold:
            self._bounds.update(zip(request_ids, map(add, self._bounds_of(request_ids), repeat(1))))
        else:
            self._bounds.update(dict.fromkeys(request_ids, self.proposer.pending_rows(key.shape)))
        return before

    def restore(self, request_ids: Sequence[str], before: Sequence[int | None]) -> None:
        """A step launched ahead was undone (engine/run_ahead.py): these requests' bounds before it."""
        for r, bound in zip(request_ids, before):
            if bound is None:
                self._bounds.pop(r, None)
            else:
                self._bounds[r] = bound

    def forget(self, request_id: str) -> None:
        """The request was released or is prefilled again: its window starts afresh."""
        self._bounds.pop(request_id, None)

    def _bounds_of(self, request_ids: Sequence[str]) -> Iterator[int]:
        """Each request's bound (a batch's in C, no call per request: held steps run at every batch size)."""
        return map(self._bounds.get, request_ids, repeat(self._fresh))
