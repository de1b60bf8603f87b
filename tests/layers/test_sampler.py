"""Tests for outpace.layers.sampler: filters, per-request seeds, greedy paths."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as hs

from outpace.layers.sampler import (
    Sampler,
    SamplingTensors,
    logits_to_probs,
    random_keys,
    sample,
    sample_from_probs,
)


def params(
    temperature: float = 1.0,
    top_k: int | None = 0,
    top_p: float | None = 1.0,
    min_p: float | None = 0.0,
):
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def kept(probs_row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs_row > 0).flatten().tolist())


# Dyadic probabilities: every partial sum is exact in float32, so top-p boundaries are exact.
# Token ids are scrambled so no rule can lean on id order.
DYADIC = torch.tensor([0.0625, 0.5, 0.125, 0.0625, 0.25])  # ids by prob: 1 > 4 > 2 > 0 = 3
DYADIC_LOGITS = DYADIC.log()[None, :]  # [1, 5]


def filtered(logits: torch.Tensor, **kw) -> set[int]:
    st = SamplingTensors.from_params([params(**kw)], "cpu")
    probs = logits_to_probs(logits, st)  # [1, V]
    assert torch.allclose(probs.sum(-1), torch.ones(1))
    return kept(probs[0])


def test_from_params_conventions():
    st = SamplingTensors.from_params(
        [params(0.0, -1, None, None), params(0.7, 5, 0.9, 0.1), SimpleNamespace(temperature=1.0)],
        "cpu",
    )
    assert st.top_k.tolist() == [0, 5, 0]
    assert st.top_k.dtype == torch.int64 and st.temperature.dtype == torch.float32
    assert st.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0])
    assert st.min_p.tolist() == pytest.approx([0.0, 0.1, 0.0])
    assert st.greedy.tolist() == [True, False, False]
    assert (st.all_greedy, st.need_top_k, st.need_top_p, st.need_min_p) == (False, True, True, True)
    # Filters on greedy rows do not count: they are argmax anyway.
    st = SamplingTensors.from_params([params(0.0, 3, 0.5, 0.5), params(1.0)], "cpu")
    assert (st.all_greedy, st.need_top_k, st.need_top_p, st.need_min_p) == (
        False,
        False,
        False,
        False,
    )
    assert SamplingTensors.from_params([params(0.0), params(0.0)], "cpu").all_greedy


def test_repeat_interleave_keeps_rows_and_flags():
    st = SamplingTensors.from_params([params(0.5, 2), params(0.0)], "cpu")
    rep = st.repeat_interleave(3)
    assert rep.temperature.tolist() == [0.5] * 3 + [0.0] * 3
    assert rep.top_k.tolist() == [2] * 3 + [0] * 3
    assert rep.greedy.tolist() == [False] * 3 + [True] * 3
    assert (rep.all_greedy, rep.need_top_k) == (st.all_greedy, st.need_top_k)
    rep = st.repeat_interleave(torch.tensor([1, 2]), output_size=3)
    assert rep.top_k.tolist() == [2, 0, 0]


def test_temperature_only_is_softmax():
    logits = torch.randn(4, 11)
    st = SamplingTensors.from_params([params(t) for t in (0.3, 1.0, 2.0, 7.0)], "cpu")
    expected = torch.softmax(logits / st.temperature[:, None], dim=-1)
    torch.testing.assert_close(logits_to_probs(logits, st), expected)


def test_top_k_kept_sets():
    assert filtered(DYADIC_LOGITS, top_k=1) == {1}
    assert filtered(DYADIC_LOGITS, top_k=2) == {1, 4}
    assert filtered(DYADIC_LOGITS, top_k=3) == {1, 4, 2}
    # k-th value tied between ids 0 and 3: both kept (ties resolved by value, not id).
    assert filtered(DYADIC_LOGITS, top_k=4) == {0, 1, 2, 3, 4}
    assert filtered(DYADIC_LOGITS, top_k=0) == {0, 1, 2, 3, 4}  # disabled
    assert filtered(DYADIC_LOGITS, top_k=99) == {0, 1, 2, 3, 4}
    st = SamplingTensors.from_params([params(top_k=2)], "cpu")
    torch.testing.assert_close(
        logits_to_probs(DYADIC_LOGITS, st)[0, [1, 4]], torch.tensor([2 / 3, 1 / 3])
    )


def test_top_p_kept_sets():
    # Smallest most-probable set with mass >= top_p; exact dyadic boundaries.
    assert filtered(DYADIC_LOGITS, top_p=0.3) == {1}
    assert filtered(DYADIC_LOGITS, top_p=0.5) == {1}  # 0.5 already reaches 0.5
    assert filtered(DYADIC_LOGITS, top_p=0.51) == {1, 4}
    assert filtered(DYADIC_LOGITS, top_p=0.75) == {1, 4}
    assert filtered(DYADIC_LOGITS, top_p=0.8) == {1, 4, 2}
    assert filtered(DYADIC_LOGITS, top_p=0.875) == {1, 4, 2}
    # 0.9 needs one of the tied 0.0625 tokens; the tie keeps both.
    assert filtered(DYADIC_LOGITS, top_p=0.9) == {0, 1, 2, 3, 4}
    assert filtered(DYADIC_LOGITS, top_p=1.0) == {0, 1, 2, 3, 4}
    assert filtered(DYADIC_LOGITS, top_p=0.0) == {1}  # at least the top token
    # Tokens with zero probability are never revived.
    logits = torch.tensor([[0.0, -math.inf, 0.0, -math.inf]])
    assert filtered(logits, top_p=1.0) == {0, 2}


def test_min_p_kept_sets():
    assert filtered(DYADIC_LOGITS, min_p=0.25) == {1, 4, 2}  # keep p >= 0.125
    assert filtered(DYADIC_LOGITS, min_p=0.3) == {1, 4}
    assert filtered(DYADIC_LOGITS, min_p=0.125) == {0, 1, 2, 3, 4}
    assert filtered(DYADIC_LOGITS, min_p=1.0) == {1}
    assert filtered(DYADIC_LOGITS, min_p=0.0) == {0, 1, 2, 3, 4}


def test_filter_order_top_k_then_top_p_then_min_p():
    # top-k=3 first: renormalised [4/7, 2/7, 1/7]; the mass before the third is 6/7 >= 0.8,
    # so top-p keeps two. (top-p alone would keep three: 0.75 < 0.8.)
    assert filtered(DYADIC_LOGITS, top_p=0.8) == {1, 4, 2}
    assert filtered(DYADIC_LOGITS, top_k=3, top_p=0.8) == {1, 4}
    # top-p before min-p: top-p=0.8 keeps three, min-p=0.2 (threshold 0.1) keeps them.
    # vLLM's min-p-first order would keep two here (renormalised mass before the third 6/7).
    assert filtered(DYADIC_LOGITS, top_p=0.8, min_p=0.2) == {1, 4, 2}
    # Temperature comes first: at T=0.5 the probs are ~[.744, .186, .047, .012, .012]
    # (ids 1, 4, 2, 0, 3), so top_p=0.9 now keeps two.
    assert filtered(DYADIC_LOGITS, temperature=0.5, top_p=0.9) == {1, 4}


def test_rows_are_independent():
    torch.manual_seed(0)
    logits = torch.randn(5, 17)
    plist = [
        params(0.5, 3),
        params(1.0, 0, 0.7),
        params(1.5, 0, 1.0, 0.2),
        params(0.0),
        params(0.8, 5, 0.9, 0.05),
    ]
    batched = logits_to_probs(logits, SamplingTensors.from_params(plist, "cpu"))
    for row, p in enumerate(plist):
        alone = logits_to_probs(logits[row : row + 1], SamplingTensors.from_params([p], "cpu"))
        torch.testing.assert_close(batched[row : row + 1], alone)


def test_greedy_rows_are_one_hot_at_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 5.0]])
    st = SamplingTensors.from_params([params(0.0), params(0.0)], "cpu")
    expected = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(logits_to_probs(logits, st), expected)
    mixed = SamplingTensors.from_params([params(0.0), params(1.0)], "cpu")
    torch.testing.assert_close(logits_to_probs(logits, mixed)[0], expected[0])


def _reference_keep(
    logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[set[int], bool]:
    """Brute force in float64: the kept set, and whether any boundary is too close to call."""
    vocab = len(logits)
    peak = max(logits)
    weights = [math.exp((x - peak) / temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]
    order = sorted(range(vocab), key=lambda i: -probs[i])
    keep = set(range(vocab))
    if 0 < top_k < vocab:
        kth = probs[order[top_k - 1]]
        keep = {i for i in keep if probs[i] >= kth}
    close = False
    if top_p < 1.0:
        mass = sum(probs[i] for i in keep)
        before, last = 0.0, None
        for i in order:
            if i not in keep:
                continue
            close |= abs(before / mass - top_p) < 1e-4
            if before / mass < top_p or last is None:
                last = probs[i]
            before += probs[i]
        keep = {i for i in keep if probs[i] >= last}
    if min_p > 0.0:
        bar = min_p * max(probs)
        close |= any(abs(probs[i] - bar) < 1e-6 for i in keep)
        keep = {i for i in keep if probs[i] >= bar}
    return keep, close


@settings(max_examples=300, deadline=None)
@given(
    logits=hs.lists(hs.integers(-3, 3), min_size=2, max_size=8),
    temperature=hs.sampled_from([0.5, 1.0, 1.7]),
    top_k=hs.integers(0, 9),
    top_p=hs.one_of(hs.just(1.0), hs.floats(0.05, 1.0)),
    min_p=hs.one_of(hs.just(0.0), hs.floats(0.0, 1.0)),
)
def test_filters_match_brute_force(logits, temperature, top_k, top_p, min_p):
    expected, close = _reference_keep([float(x) for x in logits], temperature, top_k, top_p, min_p)
    assume(not close)
    st = SamplingTensors.from_params([params(temperature, top_k, top_p, min_p)], "cpu")
    probs = logits_to_probs(torch.tensor([logits], dtype=torch.float32), st)
    assert kept(probs[0]) == expected
    torch.testing.assert_close(probs.sum(-1), torch.ones(1))


def test_sample_from_probs_distribution():
    torch.manual_seed(1)
    target = torch.tensor([0.05, 0.3, 0.0, 0.15, 0.4, 0.1])
    n = 60_000
    tokens = sample_from_probs(target.expand(n, -1).clone())
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[2] == 0
    expected = n * target.double()
    nonzero = expected > 0
    stat = ((counts[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]).sum()
    p_value = torch.special.gammaincc(torch.tensor(2.0, dtype=torch.float64), stat / 2)  # df = 4
    assert p_value > 1e-3
    # Unnormalised weights are fine: the draw is proportional.
    torch.manual_seed(1)
    assert torch.equal(sample_from_probs(3.0 * target.expand(n, -1).clone()), tokens)


def test_per_request_seeds_reproduce_regardless_of_batch():
    torch.manual_seed(0)
    vocab = 50
    probs_a = torch.softmax(torch.randn(vocab), -1)

    def seeded_tokens(position: int, batch: int, steps: int = 8) -> list[int]:
        out = []
        for step in range(steps):
            probs = torch.softmax(torch.randn(batch, vocab), -1)  # other rows: anything
            probs[position] = probs_a
            seeds = torch.randint(1 << 40, (batch,))  # other rows: any seed
            seeds[position] = 1234
            counters = torch.randint(1 << 20, (batch,))
            counters[position] = step  # e.g. the position the draw decides
            out.append(sample_from_probs(probs, random_keys(seeds, counters))[position].item())
        return out

    reference = seeded_tokens(0, 1)
    assert seeded_tokens(2, 5) == reference
    assert seeded_tokens(6, 7) == reference
    assert len(set(reference)) > 1  # the draws differ from counter to counter


def test_greedy_fast_path_is_argmax_and_draws_nothing():
    torch.manual_seed(0)
    logits = torch.randn(6, 30)
    st = SamplingTensors.from_params([params(0.0)] * 6, "cpu")
    state = torch.get_rng_state()
    assert torch.equal(sample(logits, st), logits.argmax(-1))
    assert torch.equal(Sampler()(logits, st), logits.argmax(-1))
    assert torch.equal(torch.get_rng_state(), state)


def test_greedy_rows_in_mixed_batch():
    torch.manual_seed(0)
    logits = torch.randn(64, 30)
    st = SamplingTensors.from_params(
        [params(0.0) if i % 2 else params(1.0, 5) for i in range(64)], "cpu"
    )
    tokens = sample(logits, st)
    assert torch.equal(tokens[1::2], logits[1::2].argmax(-1))
    # Sampled rows stay inside their top-5.
    top5 = logits[0::2].topk(5, dim=-1).indices
    assert (top5 == tokens[0::2, None]).any(-1).all()
