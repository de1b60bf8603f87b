"""A request's state as it moves through the engine, and what the user gets back."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from outpace.detokenizer import DetokenizerState
from outpace.host_copies import to_device
from outpace.sampling_params import SamplingParams
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


@dataclass
class Logprob:
    """A token's raw log-probability at a position (layers/logits_processing.py), its rank there (1: the
    most likely), and its text alone, ``tokenizer.decode([token_id])`` (vLLM's ``Logprob``): ``LLM.generate`` fills
    it (engine/llm.py ``_decode_logprobs``); None from the engine itself and without a tokenizer."""

    logprob: float
    rank: int
    decoded_token: str | None = None


# One position: the chosen token first, then the top ``logprobs`` tokens (vLLM's dict[int, Logprob]).
PositionLogprobs = dict[int, Logprob]


def position_logprobs(
    k: int, token: int, logprob: float, rank: int, top_ids: list[int], top_logprobs: list[float]
) -> PositionLogprobs:
    """One position's entry for a request that wants the top ``k``, from a step's packed values
    (``TokenLogprobs.unpack_rows``), which hold its batch's widest (engine/step_key.py ``LogitsFeatures``)."""
    entry = {token: Logprob(logprob, rank)}
    for r, (t, lp) in enumerate(zip(top_ids[:k], top_logprobs[:k]), start=1):
        entry.setdefault(t, Logprob(lp, r))
    return entry


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
    error: str | None = None  # why the request failed (finish_reason "error")
    text: str = ""
    # with params.stop: the text searched for stop strings so far ends here (the first min_tokens output tokens'
    # text is never searched); a stop string must end past it (engine.py ``_append_token``)
    stop_search_from: int = 0
    seed: int = 0  # the request's random stream (layers/sampler.py random_keys): params.seed, or drawn at admission
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))
    spec_metrics: SpecMetrics = field(default_factory=SpecMetrics)
    detokenizer: DetokenizerState = field(default_factory=DetokenizerState)
    # With params.logprobs: one entry per output token, and their chosen tokens' sum.
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    # With params.prompt_logprobs: one entry per prompt token, None for the first (nothing predicts it).
    prompt_logprobs: list[PositionLogprobs | None] | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs, self.cumulative_logprob = [], 0.0
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    def record_logprobs(self, entry: PositionLogprobs) -> None:
        """The entry of the output token just appended (its chosen token first)."""
        if self.logprobs is not None:
            self.logprobs.append(entry)
            self.cumulative_logprob += next(iter(entry.values())).logprob

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's ``CompletionOutput``)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None
    stop_reason: str | int | None = None


@dataclass
class RequestOutput:
    """What a request produced. ``outputs`` holds its completions (vLLM's shape: ``n`` of them from
    ``LLM.generate``); ``text``, ``token_ids``, ``logprobs``... are the first one's."""

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
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    error: str | None = (
        None  # why the request failed (finish_reason "error"); no other request is affected
    )

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [
                CompletionOutput(
                    0,
                    self.text,
                    self.token_ids,
                    self.cumulative_logprob,
                    self.logprobs,
                    self.finish_reason,
                    self.stop_reason,
                )
            ]

    @property
    def tokens_per_s(self) -> float | None:
        return self.metrics.tokens_per_s(len(self.token_ids))

    @classmethod
    def of(cls, req: Request) -> RequestOutput:
        logprobs = None if req.logprobs is None else list(req.logprobs)
        return cls(
            req.request_id,
            req.prompt,
            req.prompt_token_ids,
            req.text,
            req.output_token_ids,
            req.finish_reason,
            req.stop_reason,
            req.finished,
            req.metrics,
            req.spec_metrics,
            logprobs,
            req.cumulative_logprob,
            req.prompt_logprobs,
            error=req.error,
        )


# What a request's random draw at a position is for: the counter of ``random_keys`` is position * DRAWS + purpose.
# SAMPLE: the token at the position itself, whoever decides it: a seeded request's Gumbel noise there (the
# prefill's last row, a verify node, a drafter guessing it all use it: layers/sampler.py), an unseeded prefill's
# draw. VERIFY: an unseeded verify's uniforms and bonus draw (position: the first token it decides). DRAFT: an
# unseeded request's sampled draft.
SAMPLE, VERIFY, DRAFT, DRAWS = 0, 1, 2, 4


def request_keys(requests: list[Request], positions, purpose: int, device) -> torch.Tensor:
    """[n] int64 random keys for drawing, for each request, at ``positions`` [n] (ints or a tensor):
    the position of the token the draw decides (or of the first, for a verify). The same counters as
    ``DecodeRows.keys`` (speculative/proposer.py) for the same position: a token sampled at the end of a
    prefill and one decided in a decode step draw from the same key."""
    from outpace.layers.sampler import random_keys

    seeds = to_device([r.seed for r in requests], device)
    positions = (
        positions.to(device, torch.int64)
        if isinstance(positions, torch.Tensor)
        else to_device(positions, device)
    )
    return random_keys(seeds, positions * DRAWS + purpose)
