"""Repetition, frequency and presence penalties and logit_bias: vLLM's formulas, applied to the
target's logits at every verified node as if the node's draft path had been committed, so greedy
output is the same with and without speculation, for every drafter."""

import pytest
import torch

from helpers.zoo_drafters import zoo_drafters, zoo_llm
from outpace import SamplingParams
from outpace.layers.logits_processing import Penalties, node_counts
from outpace.speculative.tree import ancestor_mask
from outpace.validation import ConfigError

DRAFTERS = zoo_drafters(chain_steps=4, tree=(3, 2, 6))
PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def push(self, x):\n",
    "import os\n\nfor name in ",
]
PENALIZED = [
    SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, repetition_penalty=1.4),
    SamplingParams(
        temperature=0,
        max_tokens=32,
        ignore_eos=True,
        frequency_penalty=0.8,
        presence_penalty=0.4,
        logit_bias={2355: -100.0},
    ),
    SamplingParams(
        temperature=0, max_tokens=32, ignore_eos=True
    ),  # none: shares the batch with the others
]


@pytest.fixture(scope="module")
def plain():
    return [o.token_ids for o in zoo_llm().generate(PROMPTS, PENALIZED)]


def test_penalties_change_the_output(plain):
    unpenalized = [o.token_ids for o in zoo_llm().generate(PROMPTS, [PENALIZED[2]] * 3)]
    assert plain[0] != unpenalized[0] and plain[1] != unpenalized[1]
    assert plain[2] == unpenalized[2]  # a neighbour's penalties leave a request alone
    assert 2355 in unpenalized[1] and 2355 not in plain[1]  # a -100 bias bans the token


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_penalized_greedy_output_equal_with_and_without_speculation(plain, drafter):
    outs = zoo_llm(DRAFTERS[drafter]).generate(PROMPTS, PENALIZED)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0


def test_penalties_with_chunked_prefill_and_preemption(plain):
    """Counts are rebuilt from a request's output when it is recomputed after preemption."""
    llm = zoo_llm(
        DRAFTERS["eagle3-chain"], num_kv_blocks=24, block_size=4, max_num_batched_tokens=16
    )
    outs = llm.generate(PROMPTS, PENALIZED)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics.num_preemptions for o in outs) > 0


def test_penalties_match_vllms_formulas():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 10, generator=g) * 3  # [b, n, V]
    counts = torch.tensor(
        [[0, 2, 0, 1, 0, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.int32
    )
    prompt = torch.zeros(2, 10, dtype=torch.bool)
    prompt[0, 5] = prompt[1, 2] = True
    bias = torch.zeros(2, 10)
    bias[1, 4] = 2.5
    stops = torch.zeros(2, 10, dtype=torch.bool)
    stops[0, [7, 9]] = stops[1, 7] = True
    pen = Penalties(
        torch.tensor([1.5, 0.7]),
        torch.tensor([0.3, -0.2]),
        torch.tensor([0.5, 1.0]),
        bias,
        prompt,
        counts,
        torch.tensor(
            [12, 20]
        ),  # min_end: row 0's stops banned before position 12, row 1's before 20
        stops,
    )
    positions = torch.tensor([[10, 11, 12], [20, 21, 22]])
    got = pen.apply(logits, positions)
    for s in range(
        2
    ):  # vLLM: bias, then repetition on prompt | output, then frequency, then presence, then min_tokens
        x = logits[s] + bias[s]
        seen = prompt[s] | (counts[s] > 0)
        r = pen.repetition[s]
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
        x = x - pen.frequency[s] * counts[s] - pen.presence[s] * (counts[s] > 0)
        if (
            s == 0
        ):  # nodes 0 and 1 decide positions 10 and 11, before the min_tokens-th output token
            x[:2, [7, 9]] = float("-inf")
        torch.testing.assert_close(got[s], x)


def test_node_counts_count_each_nodes_path():
    parents = torch.tensor([[-1, 0, 0, 1, 3]])  # 0 -> 1 -> 3 -> 4, 0 -> 2
    tokens = torch.tensor([[7, 1, 2, 7, 1]])
    counts = torch.zeros(1, 8, dtype=torch.int32)
    counts[0, 7] = 1
    got = node_counts(counts, tokens, ancestor_mask(parents, 4))
    expected = {0: {7: 2}, 1: {7: 2, 1: 1}, 2: {7: 2, 2: 1}, 3: {7: 3, 1: 1}, 4: {7: 3, 1: 2}}
    for node, want in expected.items():
        row = torch.zeros(8)
        for t, c in want.items():
            row[t] = c
        assert torch.equal(got[0, node], row), node


def test_bad_penalties_are_refused_by_name():
    for field, value in (
        ("repetition_penalty", 0.0),
        ("frequency_penalty", 2.5),
        ("presence_penalty", float("nan")),
        ("logit_bias", {"3": 1.0}),
        ("logit_bias", {3: float("inf")}),
    ):
        with pytest.raises(ConfigError, match=f"SamplingParams.{field}="):
            SamplingParams(**{field: value})
    llm = zoo_llm()
    with pytest.raises(
        ValueError, match=r"logit_bias token ids \[5000\] are outside the vocabulary"
    ):
        llm.generate("x", SamplingParams(logit_bias={5000: 1.0}))
    assert not llm.engine.has_unfinished_requests
