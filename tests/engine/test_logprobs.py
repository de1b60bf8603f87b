"""logprobs, top_logprobs and prompt_logprobs: the target's raw log-probabilities of the committed
tokens, equal (1e-4, fp32) with and without speculation for every drafter, and equal to what the
target gives the same tokens as a prompt."""

import math

import pytest
import torch

from helpers.zoo_drafters import zoo_drafters, zoo_llm
from outpace import SamplingParams
from outpace.validation import ConfigError

DRAFTERS = zoo_drafters(chain_steps=4, tree=(3, 2, 6))
PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def push(self, x):\n",
    "import os\n\nfor name in ",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def plain():
    llm = zoo_llm()
    return llm, llm.generate(PROMPTS, GREEDY)


def assert_same_logprobs(got, want, tol=1e-4):
    assert len(got) == len(want)
    for position, (g, w) in enumerate(zip(got, want)):
        assert list(g) == list(w), (
            position,
            g,
            w,
        )  # the chosen token and the same top tokens, in order
        for token in w:
            assert abs(g[token].logprob - w[token].logprob) < tol, (position, token)
            assert g[token].rank == w[token].rank, (position, token)


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_greedy_logprobs_equal_with_and_without_speculation(plain, drafter):
    _, expected = plain
    outs = zoo_llm(DRAFTERS[drafter]).generate(PROMPTS, GREEDY)
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0
    for out, ref in zip(outs, expected):
        assert out.token_ids == ref.token_ids
        assert_same_logprobs(out.logprobs, ref.logprobs)
        assert abs(out.cumulative_logprob - ref.cumulative_logprob) < 1e-3
        for token, entry in zip(
            out.token_ids, out.logprobs
        ):  # greedy: the chosen token is the most likely
            assert next(iter(entry)) == token and entry[token].rank == 1


@pytest.mark.parametrize("drafter", ["eagle3-chain", "eagle3-tree", "dflash"])
def test_sampled_logprobs_are_the_targets(plain, drafter):
    """A sampled output's log-probabilities equal the target's for the same tokens read as a prompt
    (prompt_logprobs of prompt + output, through a plain engine), with penalties and a filter on:
    raw log-probabilities do not depend on them."""
    llm, _ = plain
    params = SamplingParams(
        temperature=0.9,
        top_k=40,
        seed=7,
        max_tokens=20,
        ignore_eos=True,
        logprobs=2,
        repetition_penalty=1.2,
    )
    outs = zoo_llm(DRAFTERS[drafter]).generate(PROMPTS, params)
    for out in outs:
        ids = out.prompt_token_ids + out.token_ids
        ref = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2))[0]
        assert ref.prompt_logprobs[0] is None and len(ref.prompt_logprobs) == len(ids)
        assert_same_logprobs(out.logprobs, ref.prompt_logprobs[len(out.prompt_token_ids) :])


def test_prompt_logprobs_chunked_equal_whole():
    """Prompt log-probabilities recorded chunk by chunk (a prompt longer than the token budget) equal
    those of one prefill, and the first prompt token has none."""
    whole = zoo_llm().generate(
        PROMPTS[1], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=4)
    )[0]
    chunked = zoo_llm(max_num_batched_tokens=5, block_size=4).generate(
        PROMPTS[1], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=4)
    )[0]
    assert whole.prompt_logprobs[0] is None and chunked.prompt_logprobs[0] is None
    assert len(whole.prompt_logprobs) == len(whole.prompt_token_ids)
    assert_same_logprobs(chunked.prompt_logprobs[1:], whole.prompt_logprobs[1:])
    for token, entry in zip(whole.prompt_token_ids[1:], whole.prompt_logprobs[1:]):
        assert next(iter(entry)) == token
        probs = [math.exp(lp.logprob) for t, lp in entry.items() if t != token or lp.rank <= 4]
        assert sum(probs) <= 1 + 1e-5


def test_logprobs_limits_are_refused_by_name():
    with pytest.raises(ConfigError, match="SamplingParams.logprobs=21"):
        SamplingParams(logprobs=21)
    with pytest.raises(ConfigError, match="SamplingParams.prompt_logprobs=-1"):
        SamplingParams(prompt_logprobs=-1)


def test_top_logprobs_are_sorted_and_ranked(plain):
    _, outs = plain
    for entry in outs[0].logprobs:  # greedy: the chosen token is the top one, so three entries
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2, 3]
        values = [lp.logprob for lp in ranked]
        assert values == sorted(values, reverse=True)
        assert torch.tensor(values).exp().sum() <= 1 + 1e-5


def test_a_request_gets_its_own_top_logprobs_in_any_batch():
    """A step computes its widest request's top log-probabilities (rounded up: engine/step_key.py); each
    request keeps only the top ``logprobs`` it asked for, the same entries as alone."""
    narrow = GREEDY.replace(logprobs=1)
    alone = zoo_llm().generate(PROMPTS[:1], narrow)[0]
    together = zoo_llm().generate(PROMPTS[:2], [narrow, GREEDY.replace(logprobs=4)])
    # greedy: the chosen token is the most likely, so an entry holds the top k alone
    assert [len(entry) for entry in together[0].logprobs] == [1] * 24
    assert [len(entry) for entry in together[1].logprobs] == [4] * 24
    assert_same_logprobs(together[0].logprobs, alone.logprobs)
