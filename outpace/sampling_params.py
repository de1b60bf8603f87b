"""What a request asks of decoding: ``SamplingParams`` (vLLM's names, defaults and meanings) and the
``StructuredOutputsParams`` constraint it may carry. Both check themselves at construction; an invalid
value raises ``ConfigError`` naming the field (outpace/validation.py), before the engine sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from outpace.validation import (
    ConfigError,
    is_finite_number,
    is_int,
    is_int64,
    require,
    require_positive_int,
)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on a request's output, compiled into a token mask by outpace/structured/ (names as
    vLLM's ``StructuredOutputsParams``). Exactly one field is set:

    ``json``: a JSON schema (a dict or its JSON text); ``json_object``: any JSON object; ``regex``: a
    regular expression the whole output matches; ``choice``: one of these strings; ``grammar``: an EBNF
    grammar (GBNF, the form xgrammar reads, rule ``root`` first).

    ``starts_after``: the constraint holds from the end of this text in the output on, the output before it
    free (a reasoning model's "</think>": the server sets it with ``--reasoning-parser``, as vLLM constrains
    only the answer); None: from the first token."""

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    starts_after: str | None = None

    def __post_init__(self) -> None:
        o = "StructuredOutputsParams"
        if self.choice is not None:
            require(
                o,
                "choice",
                self.choice,
                _is_list(self.choice)
                and len(self.choice) > 0
                and all(isinstance(c, str) and c for c in self.choice),
                "a non-empty list of non-empty strings",
            )
            object.__setattr__(self, "choice", tuple(self.choice))
        require(
            o,
            "json",
            self.json,
            self.json is None or isinstance(self.json, (str, dict)),
            "a JSON schema: a dict or its JSON text",
        )
        for name in ("regex", "grammar", "starts_after"):
            value = getattr(self, name)
            require(
                o,
                name,
                value,
                value is None or (isinstance(value, str) and value.strip() != ""),
                "a non-empty string",
            )
        require(
            o,
            "json_object",
            self.json_object,
            self.json_object is None or isinstance(self.json_object, bool),
            "a bool",
        )
        chosen = [
            name
            for name in ("json", "regex", "choice", "grammar")
            if getattr(self, name) is not None
        ]
        chosen += ["json_object"] if self.json_object else []
        if len(chosen) != 1:
            raise ConfigError(
                f"{o} needs exactly one of json, regex, choice, grammar, json_object; "
                f"got {', '.join(chosen) or 'none'}"
            )

    @property
    def kind(self) -> str:
        """Which constraint is set: json, regex, choice, grammar or json_object (an empty schema ``{}`` is set)."""
        return next(
            (n for n in ("json", "regex", "choice", "grammar") if getattr(self, n) is not None),
            "json_object",
        )


def _is_list(value: Any) -> bool:
    """A list of values (a list, tuple, set...), not one value, nor a string or bytes (a collection of characters
    or byte values)."""
    return isinstance(value, Collection) and not isinstance(value, (str, bytes, dict))


# What SamplingParams' stop fields take (each also None: none)
_STOP_LISTS = {
    "stop": "None, a non-empty string or a list of them",
    "stop_token_ids": "None or a list of non-negative integers (int64)",
}

# top_logprobs per position a request may ask for (vLLM's default max_logprobs and OpenAI's limit)
MAX_LOGPROBS = 20
# OpenAI's range for a logit_bias value, either sign (the server refuses beyond it; vLLM clamps)
MAX_LOGIT_BIAS = 100


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters (names, defaults and meanings follow vLLM's SamplingParams).

    temperature 0 means greedy. ``top_k`` 0 or -1 disables top-k; ``top_p`` 1 and ``min_p`` 0
    disable theirs. ``max_tokens`` counts generated tokens. ``seed`` -1 means no seed (as in vLLM).
    ``min_tokens``: no end-of-sequence id (the model's, ``ignore_eos`` or not, as vLLM's ``_all_stop_token_ids``)
    nor ``stop_token_ids`` is sampled as one of the first ``min_tokens`` output tokens (their logits are -inf
    there), and a ``stop`` string counts only where it ends in text of the tokens after them (vLLM's detokenizer
    checks stop strings once the output holds more than ``min_tokens`` tokens).
    ``stop`` (a string or a list of them) and ``stop_token_ids``: None means none, as in vLLM.
    ``include_stop_str_in_output``: a matched ``stop`` string stays at the end of the text.
    ``skip_special_tokens``: special tokens are left out of the text (False: decoded like any other).

    ``n`` completions are returned per prompt, the best ``n`` of ``best_of`` sampled ones by cumulative
    log-probability (``LLM.generate`` fans them out; an engine request is one sequence).
    Penalties act on the target's logits at every position (a verified draft prefix counting as
    committed): ``repetition_penalty`` divides positive logits (multiplies negative ones) of tokens
    seen in the prompt or the output; ``frequency_penalty`` subtracts itself times a token's count in
    the output, ``presence_penalty`` itself once per token present in it. ``logit_bias`` adds to
    given token ids' logits (before the penalties, as vLLM orders them); ``allowed_token_ids``: every other
    token's logit is -inf.
    ``logprobs`` k: each output token's log-probability, its rank and the k most likely tokens';
    ``prompt_logprobs`` k: the same for every prompt token but the first (offline API). They are the
    target's raw log-probabilities (log-softmax of the logits before any processing: vLLM's default
    ``raw_logprobs`` mode), identical with and without speculation.
    ``structured_outputs``: the output must follow a JSON schema, a regex, a choice or a grammar.
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        o = "SamplingParams"
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        for name, allowed in _STOP_LISTS.items():  # None: none (vLLM's default)
            value = getattr(self, name)
            require(o, name, value, value is None or _is_list(value), allowed)
            object.__setattr__(self, name, tuple(value or ()))
        if self.seed == -1 and is_int(self.seed):  # vLLM's "no seed"
            object.__setattr__(self, "seed", None)
        require_positive_int(o, "n", self.n)
        require(
            o,
            "best_of",
            self.best_of,
            self.best_of is None or (is_int64(self.best_of) and self.best_of >= self.n),
            f"None or an integer >= n={self.n}",
        )
        require(
            o,
            "temperature",
            self.temperature,
            is_finite_number(self.temperature) and self.temperature >= 0,
            "a finite number >= 0",
        )
        require(
            o,
            "top_p",
            self.top_p,
            is_finite_number(self.top_p) and 0 < self.top_p <= 1,
            "in (0, 1]",
        )
        require(
            o,
            "top_k",
            self.top_k,
            is_int64(self.top_k) and self.top_k >= -1,
            "-1 or 0 (disabled) or a positive integer",
        )
        require(
            o,
            "min_p",
            self.min_p,
            is_finite_number(self.min_p) and 0 <= self.min_p <= 1,
            "in [0, 1]",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            require(o, name, value, is_finite_number(value) and -2 <= value <= 2, "in [-2, 2]")
        require(
            o,
            "repetition_penalty",
            self.repetition_penalty,
            is_finite_number(self.repetition_penalty) and self.repetition_penalty > 0,
            "a finite number > 0",
        )
        if self.logit_bias is not None:
            require(
                o,
                "logit_bias",
                self.logit_bias,
                isinstance(self.logit_bias, dict)
                and all(
                    is_int64(t) and t >= 0 and is_finite_number(b) and abs(b) <= MAX_LOGIT_BIAS
                    for t, b in self.logit_bias.items()
                ),
                f"a dict of token id (int >= 0) -> bias in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]",
            )
            object.__setattr__(
                self, "logit_bias", {int(t): float(b) for t, b in self.logit_bias.items()} or None
            )
        if self.allowed_token_ids is not None:
            listed = _is_list(self.allowed_token_ids)
            if listed:
                object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
            require(
                o,
                "allowed_token_ids",
                self.allowed_token_ids,
                listed
                and bool(self.allowed_token_ids)
                and all(is_int64(t) and t >= 0 for t in self.allowed_token_ids),
                "None or a non-empty list of non-negative integers (int64)",
            )
        require_positive_int(o, "max_tokens", self.max_tokens)
        require(
            o,
            "min_tokens",
            self.min_tokens,
            is_int64(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
            f"an integer in [0, max_tokens={self.max_tokens}]",
        )
        for name in ("include_stop_str_in_output", "skip_special_tokens", "ignore_eos"):
            value = getattr(self, name)
            require(o, name, value, isinstance(value, bool), "a bool")
        require(
            o,
            "stop",
            self.stop,
            all(isinstance(s, str) and s for s in self.stop),
            _STOP_LISTS["stop"],
        )
        require(
            o,
            "stop_token_ids",
            self.stop_token_ids,
            all(is_int64(t) and t >= 0 for t in self.stop_token_ids),
            _STOP_LISTS["stop_token_ids"],
        )
        require(
            o,
            "seed",
            self.seed,
            self.seed is None or (is_int64(self.seed) and self.seed >= 0),
            "None, -1 (no seed) or an integer in [0, 2**63 - 1]",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            require(
                o,
                name,
                value,
                value is None or (is_int(value) and 0 <= value <= MAX_LOGPROBS),
                f"None or an integer in [0, {MAX_LOGPROBS}]",
            )
        require(
            o,
            "structured_outputs",
            self.structured_outputs,
            self.structured_outputs is None
            or isinstance(self.structured_outputs, StructuredOutputsParams),
            "None or a StructuredOutputsParams",
        )
        if self.structured_outputs is not None:
            # NOTE: the grammar ends at its stop token (an eos id); past it nothing may be committed.
            require(
                o,
                "ignore_eos",
                self.ignore_eos,
                not self.ignore_eos,
                "False with structured_outputs (the grammar ends with an end-of-sequence token)",
            )
            require(
                o,
                "min_tokens",
                self.min_tokens,
                self.min_tokens == 0,
                "0 with structured_outputs (the grammar decides where the output ends)",
            )
            require(
                o,
                "allowed_token_ids",
                self.allowed_token_ids,
                self.allowed_token_ids is None,
                "None with structured_outputs (the grammar decides the tokens allowed)",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the logits are changed before sampling (penalties, logit_bias, allowed_token_ids or
        min_tokens)."""
        return (
            bool(self.logit_bias)
            or self.allowed_token_ids is not None
            or self.min_tokens > 0
            or self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)
