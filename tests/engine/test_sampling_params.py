"""SamplingParams refuses, naming the field, every value the engine could not hold or would misread:
integers beyond int64 (they overflow the engine's int64 rows inside ``step()``), bools, floats or
strings where an integer is expected, token ids that are not integers, biases beyond OpenAI's
[-100, 100] (issue 42, item 3). A seed of -1 means no seed, as in vLLM."""

import math

import pytest

from outpace.sampling_params import SamplingParams
from outpace.validation import ConfigError

INT64_MAX = 2**63 - 1

REFUSED = [
    ("top_k", 2**63),
    ("top_k", 2.0),
    ("top_k", "5"),
    ("top_k", True),
    ("n", 2**63),
    ("n", True),
    ("n", 2.0),
    ("best_of", 2**63),
    ("best_of", True),
    ("max_tokens", 2**63),
    ("max_tokens", 5.0),
    ("max_tokens", "5"),
    ("max_tokens", True),
    ("seed", 2**63),
    ("seed", -2),
    ("seed", True),
    ("seed", 1.0),
    ("seed", "1"),
    ("logprobs", True),
    ("prompt_logprobs", 1.0),
    ("temperature", 10**400),
    ("temperature", True),
    ("top_p", True),
    ("min_p", False),
    ("presence_penalty", 10**400),
    ("repetition_penalty", True),
    ("stop_token_ids", [2**63]),
    ("stop_token_ids", [1.0]),
    ("stop_token_ids", ["1"]),
    ("stop_token_ids", [True]),
    ("stop_token_ids", [-1]),
    ("logit_bias", {2**63: 1.0}),
    ("logit_bias", {1.0: 1.0}),
    ("logit_bias", {"1": 1.0}),
    ("logit_bias", {True: 1.0}),
    ("logit_bias", {1: math.inf}),
    ("logit_bias", {1: math.nan}),
    ("logit_bias", {1: 1e308}),
    ("logit_bias", {1: -100.5}),
    ("logit_bias", {1: "1"}),
    ("logit_bias", {1: True}),
]


@pytest.mark.parametrize("field,value", REFUSED, ids=[f"{f}={v!r}"[:32] for f, v in REFUSED])
def test_values_the_engine_cannot_hold_are_refused_by_name(field, value):
    with pytest.raises(ConfigError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


def test_the_edges_of_the_ranges_are_accepted():
    p = SamplingParams(
        top_k=INT64_MAX,
        seed=INT64_MAX,
        stop_token_ids=[INT64_MAX],
        logit_bias={INT64_MAX: 100, 0: -100.0},
        max_tokens=INT64_MAX,
    )
    assert p.top_k == p.seed == p.max_tokens == INT64_MAX
    assert p.logit_bias == {INT64_MAX: 100.0, 0: -100.0}


def test_seed_minus_one_means_no_seed_as_in_vllm():
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(seed=0).seed == 0
