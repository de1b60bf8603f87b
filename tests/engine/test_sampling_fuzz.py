"""Sampling parameters at their edges, through the offline API as a vLLM user passes them: what vLLM accepts is
accepted with vLLM's meaning (``stop=None`` and ``stop_token_ids=None``: none), what is not (a flag that is not a
bool, a stop list that is not a list) is refused by SamplingParams naming the field; extreme values that float32
cannot hold apart (a temperature beyond its range or of 1e6, a repetition_penalty of 1e-38) still sample only the
tokens the request allows and its filters keep, plain and speculative."""

import pytest

from helpers.zoo_drafters import zoo_drafters, zoo_llm
from outpace import SamplingParams
from outpace.validation import ConfigError

EOS = 0  # zoo/tinypy's eos_token_id
PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def push(self, x):\n"]


def test_none_stop_lists_mean_no_stops():
    """vLLM's SamplingParams takes None for ``stop`` and ``stop_token_ids`` (its defaults)."""
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert params.stop == () and params.stop_token_ids == ()


REFUSED = [
    ("stop", 5),
    ("stop", b"ab"),
    ("stop_token_ids", 5),
    ("stop_token_ids", "12"),
    ("allowed_token_ids", 5),
    ("ignore_eos", 1),
    ("ignore_eos", "no"),
    ("ignore_eos", None),
]


@pytest.mark.parametrize("field,value", REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_values_of_the_wrong_type_are_refused_by_name(field, value):
    with pytest.raises(ConfigError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("drafter", [None, "eagle3-chain"])
def test_a_temperature_beyond_float32_keeps_to_the_allowed_tokens(drafter):
    """1e300 is a finite temperature (vLLM: any >= 0) that float32 rounds to infinity; the tokens a request bans
    (-inf logits: allowed_token_ids, min_tokens' end of sequence) must stay banned, not turn the row into NaN."""
    spec = None if drafter is None else zoo_drafters(4, (3, 2, 6))[drafter]
    llm = zoo_llm(spec)
    for seed in (None, 3):
        allowed = llm.generate(
            PROMPTS,
            SamplingParams(temperature=1e300, allowed_token_ids=[5, 6, 7], max_tokens=6, seed=seed),
        )
        assert all(set(o.token_ids) <= {5, 6, 7} for o in allowed), [o.token_ids for o in allowed]
        biased = SamplingParams(
            temperature=1e300, min_tokens=4, max_tokens=4, logit_bias={EOS: 100.0}, seed=seed
        )
        assert all(
            len(o.token_ids) == 4 and EOS not in o.token_ids for o in llm.generate(PROMPTS, biased)
        )


@pytest.mark.parametrize("drafter", [None, "eagle3-chain"])
def test_a_tiny_repetition_penalty_samples_the_seen_tokens(drafter):
    """vLLM takes any repetition_penalty > 0: at 1e-38 a seen token's positive logit divided by it is +inf in
    float32, so a sampled token is one of the seen tokens (never NaN's arbitrary pick), seeded the same with and
    without speculation."""
    spec = None if drafter is None else zoo_drafters(4, (3, 2, 6))[drafter]
    llm, plain = zoo_llm(spec), zoo_llm()
    for seed in (None, 5):
        params = SamplingParams(
            temperature=0.7, repetition_penalty=1e-38, max_tokens=6, ignore_eos=True, seed=seed
        )
        outs = llm.generate(PROMPTS, params)
        for o in outs:
            assert all(t in o.prompt_token_ids + o.token_ids[:i] for i, t in enumerate(o.token_ids))
        if seed is not None:
            assert [o.token_ids for o in outs] == [
                o.token_ids for o in plain.generate(PROMPTS, params)
            ]


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_filters_keep_the_most_likely_token_at_any_temperature(drafter):
    """top_k=1, a tiny top_p and min_p=1 keep only the most likely token (vLLM filters the scaled logits), however
    high the temperature: at 1e6 float32's softmax rounds the probabilities into ties, which must not widen them."""
    spec = None if drafter is None else zoo_drafters(4, (3, 2, 6))[drafter]
    llm = zoo_llm(spec)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
    for filters in ({"top_k": 1}, {"top_p": 1e-9}, {"min_p": 1.0}):
        for seed in (None, 2):
            params = greedy.replace(temperature=1e6, seed=seed, **filters)
            assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want, (filters, seed)
