"""A request's state as it moves through the engine, and what the user gets back."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from outpace.config import SamplingParams
from outpace.detokenizer import DetokenizerState
from outpace.speculative.metrics import SpecMetrics


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    def tokens_per_s(self, num_tokens: int) -> float | None:
        if self.finished_time is None or self.first_token_time is None:
            return None
        return num_tokens / max(self.finished_time - self.arrival_time, 1e-9)


@dataclass(eq=False)  # requests compare by identity
class Request:
    """``token_ids`` holds prompt then output; ``num_computed_tokens`` of them have KV in the cache."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""
    seed: int = 0  # the request's random stream (layers/sampler.py random_keys): params.seed, or drawn at admission
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))
    spec_metrics: SpecMetrics = field(default_factory=SpecMetrics)
    detokenizer: DetokenizerState = field(default_factory=DetokenizerState)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None
    finished: bool
    metrics: RequestMetrics
    spec_metrics: SpecMetrics

    @property
    def tokens_per_s(self) -> float | None:
        return self.metrics.tokens_per_s(len(self.token_ids))

    @classmethod
    def of(cls, req: Request) -> RequestOutput:
        return cls(req.request_id, req.prompt, req.prompt_token_ids, req.text, req.output_token_ids,
                   req.finish_reason, req.stop_reason, req.finished, req.metrics, req.spec_metrics)


# What a request's random draw at a position is for: the counter of ``random_keys`` is position * DRAWS + purpose.
SAMPLE, VERIFY, DRAFT, DRAWS = 0, 1, 2, 4


def request_keys(requests: list[Request], positions, purpose: int, device) -> torch.Tensor:
    """[n] int64 random keys for drawing, for each request, at ``positions`` [n] (ints or a tensor):
    the position of the token the draw decides (or of the first, for a verify)."""
    from outpace.layers.sampler import random_keys

    seeds = torch.tensor([r.seed for r in requests], dtype=torch.int64, device=device)
    positions = torch.as_tensor(positions, dtype=torch.int64, device=device)
    return random_keys(seeds, positions * DRAWS + purpose)
