"""What fixes a decode step's shapes and host flags: the key of one captured graph (engine/decode_step.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from outpace.layers.sampler import is_greedy, is_seeded
from outpace.speculative.proposer import DraftShape


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


@dataclass(frozen=True)
class LogitsFeatures:
    """What a batch asks of the target's logits beyond sampling (host flags fixed per step):
    ``penalties``: some request has penalties or a logit bias; ``grammar``: some request has a grammar;
    ``logprobs``: the most top log-probabilities a request wants (0: only the chosen token's; None: none)."""

    penalties: bool = False
    grammar: bool = False
    logprobs: int | None = None

    @classmethod
    def of(cls, params: list) -> LogitsFeatures:
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            any(p.penalized for p in params),
            any(p.structured_outputs is not None for p in params),
            max(wanted) if wanted else None,
        )

    @property
    def any(self) -> bool:
        return self.penalties or self.grammar or self.logprobs is not None


@dataclass(frozen=True)
class StepKey:
    """What fixes a step's shapes: one captured graph each (keys with logits features run eagerly)."""

    bucket: int
    shape: DraftShape
    mode: SamplingMode
    features: LogitsFeatures = field(default_factory=LogitsFeatures)
