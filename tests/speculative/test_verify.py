"""Tests for outpace.speculative.verify.

Hand-made greedy cases, equivalences (greedy rows of the sampling verifiers, chain-shaped
trees), per-request seeds, and the key one: a statistical test that the emitted tokens
have exactly the target's distribution, together with deliberately broken verifiers
(defined here only) that the same test must reject, so it demonstrably has power.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import outpace.speculative.verify as verify_mod
from helpers.stats import chi_square_p_value
from outpace.layers.sampler import SamplingTensors, logits_to_probs, random_keys, sample_from_probs
from outpace.speculative.verify import (
    verify_chain,
    verify_greedy_chain,
    verify_greedy_tree,
    verify_sampling_chain,
    verify_sampling_tree,
    verify_tree,
)


def params(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def logits_for(predict: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """Target logits whose argmax at [b, j] is predict[b][j].  # [batch, positions, vocab]"""
    predict_t = torch.tensor(predict)
    logits = torch.randn(*predict_t.shape, vocab)
    return logits.scatter(-1, predict_t[..., None], 10.0)


# ----------------------------------------------------------------------------------------
# Greedy chain


def test_greedy_chain_all_none_partial():
    torch.manual_seed(0)
    draft = torch.tensor([[3, 1, 4], [3, 1, 4], [3, 1, 4], [3, 1, 4]])
    target = logits_for([[3, 1, 4, 5], [2, 1, 4, 5], [3, 1, 6, 5], [3, 7, 4, 5]])
    res = verify_greedy_chain(draft, target)
    assert res.num_correct_drafts.tolist() == [3, 0, 2, 1]
    assert res.bonus_token_ids.tolist() == [5, 2, 6, 7]
    assert res.output_token_ids.tolist() == [
        [3, 1, 4, 5],
        [2, -1, -1, -1],
        [3, 1, 6, -1],
        [3, 7, -1, -1],
    ]
    assert res.last_correct_step_indices.tolist() == [3, 0, 2, 1]
    assert res.accepted_path.tolist() == [
        [0, 1, 2, 3],
        [0, -1, -1, -1],
        [0, 1, 2, -1],
        [0, 1, -1, -1],
    ]
    assert res.num_accepted_tokens.tolist() == [4, 1, 3, 2]


def test_greedy_chain_no_drafts():
    target = logits_for([[5], [2]])
    res = verify_greedy_chain(torch.zeros(2, 0, dtype=torch.int64), target)
    assert res.output_token_ids.tolist() == [[5], [2]]
    assert res.num_correct_drafts.tolist() == [0, 0]


# ----------------------------------------------------------------------------------------
# Greedy tree
#
#            0 (root)
#        /   |    \
#       1    2     3
#      / \   |
#     4   5  6
#     |
#     7
TREE_PARENT = [-1, 0, 0, 0, 1, 1, 2, 4]
TREE_RANK = [0, 0, 1, 2, 0, 1, 0, 0]  # position among siblings
TREE_DEPTH = 3


def test_greedy_tree_picks_the_matching_branch():
    torch.manual_seed(0)
    parent = torch.tensor([TREE_PARENT] * 5)
    #                    0   1  2  3  4  5  6  7
    tokens = torch.tensor([[0, 10, 11, 12, 20, 21, 22, 30]] * 5)
    tokens[4, 3] = 11  # duplicate sibling token in row 4: the lower index wins
    predict = [
        [11, 0, 22, 0, 0, 0, 9, 0],  # 0 -> 2 -> 6 (leaf), bonus 9 from node 6
        [10, 20, 0, 0, 30, 0, 0, 4],  # 0 -> 1 -> 4 -> 7 (leaf), bonus 4
        [13, 0, 0, 0, 0, 0, 0, 0],  # nothing matches: bonus 13
        [10, 21, 0, 0, 0, 8, 0, 0],  # 0 -> 1 -> 5, bonus 8
        [11, 0, 5, 6, 0, 0, 0, 0],  # 0 -> 2 (not 3), bonus 5
    ]
    res = verify_greedy_tree(parent, tokens, logits_for(predict, vocab=40), max_depth=TREE_DEPTH)
    assert res.num_correct_drafts.tolist() == [2, 3, 0, 2, 1]
    assert res.accepted_path.tolist() == [
        [0, 2, 6, -1],
        [0, 1, 4, 7],
        [0, -1, -1, -1],
        [0, 1, 5, -1],
        [0, 2, -1, -1],
    ]
    assert res.last_correct_step_indices.tolist() == [6, 7, 0, 5, 2]
    assert res.bonus_token_ids.tolist() == [9, 4, 13, 8, 5]
    assert res.output_token_ids.tolist() == [
        [11, 22, 9, -1],
        [10, 20, 30, 4],
        [13, -1, -1, -1],
        [10, 21, 8, -1],
        [11, 5, -1, -1],
    ]
    # Default max_depth = num_nodes - 1 pads further.
    wide = verify_greedy_tree(parent, tokens, logits_for(predict, vocab=40))
    assert wide.output_token_ids.shape == (5, 8)
    assert torch.equal(wide.output_token_ids[:, :4], res.output_token_ids)


def chain_as_tree(draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, num_drafts = draft.shape
    parent = torch.arange(-1, num_drafts).expand(batch, -1)  # [batch, num_drafts + 1]
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), draft], 1)
    return parent, tokens


def same_result(a, b) -> None:
    fields = (
        "output_token_ids",
        "num_correct_drafts",
        "bonus_token_ids",
        "last_correct_step_indices",
        "accepted_path",
    )
    for field in fields:
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_greedy_tree_on_a_chain_equals_greedy_chain():
    torch.manual_seed(0)
    vocab, num_drafts = 3, 4  # tiny vocab: many partial matches
    target = torch.randn(500, num_drafts + 1, vocab)
    draft = torch.randint(0, vocab, (500, num_drafts))
    parent, tokens = chain_as_tree(draft)
    same_result(verify_greedy_tree(parent, tokens, target), verify_greedy_chain(draft, target))


# ----------------------------------------------------------------------------------------
# Sampling verifiers: greedy rows, equivalences, seeds


def test_sampling_verifiers_reduce_to_greedy_for_temperature_zero():
    torch.manual_seed(0)
    batch, num_drafts, vocab = 400, 3, 4
    target_logits = torch.randn(batch, num_drafts + 1, vocab)
    st = SamplingTensors.from_params([params(0.0)] * batch, "cpu")
    target_probs = logits_to_probs(
        target_logits.view(-1, vocab), st.repeat_interleave(num_drafts + 1)
    ).view(batch, num_drafts + 1, vocab)
    draft_probs = torch.softmax(torch.randn(batch, num_drafts, vocab), -1)
    draft = sample_from_probs(draft_probs.view(-1, vocab)).view(batch, num_drafts)
    greedy = verify_greedy_chain(draft, target_logits)
    assert 0 < greedy.num_correct_drafts.float().mean() < num_drafts
    same_result(verify_sampling_chain(draft, draft_probs, target_probs), greedy)
    same_result(verify_sampling_chain(draft, None, target_probs), greedy)

    # Trees: sampled children, then compare with the greedy tree rule.
    parent = torch.tensor([TREE_PARENT] * batch)
    tokens = torch.randint(0, vocab, (batch, len(TREE_PARENT)))
    tree_logits = torch.randn(batch, len(TREE_PARENT), vocab)
    tree_probs = logits_to_probs(
        tree_logits.view(-1, vocab), st.repeat_interleave(len(TREE_PARENT))
    ).view(batch, len(TREE_PARENT), vocab)
    tree_q = torch.softmax(torch.randn(batch, len(TREE_PARENT), vocab), -1)
    greedy = verify_greedy_tree(parent, tokens, tree_logits)
    assert greedy.num_correct_drafts.max() >= 2
    same_result(verify_sampling_tree(parent, tokens, tree_q, tree_probs), greedy)
    same_result(verify_sampling_tree(parent, tokens, None, tree_probs), greedy)
    # The dispatching entry points take the greedy path.
    all_greedy = SamplingTensors.from_params([params(0.0)] * batch, "cpu")
    same_result(verify_tree(parent, tokens, tree_q, tree_logits, all_greedy), greedy)


def test_chain_shaped_tree_equals_chain():
    torch.manual_seed(0)
    batch, num_drafts, vocab = 300, 3, 5
    target_probs = torch.softmax(torch.randn(batch, num_drafts + 1, vocab), -1)
    q = torch.softmax(torch.randn(batch, num_drafts, vocab), -1)
    draft = sample_from_probs(q.view(-1, vocab)).view(batch, num_drafts)
    u = torch.rand(batch, num_drafts)
    parent, tokens = chain_as_tree(draft)
    q_nodes = torch.cat([q, torch.zeros(batch, 1, vocab)], 1)  # q at node j drafted node j + 1
    for q_chain, q_tree in ((q, q_nodes), (None, None)):
        keys = random_keys(torch.arange(batch), torch.zeros(batch, dtype=torch.int64))
        chain = verify_sampling_chain(draft, q_chain, target_probs, keys, uniform_rand=u)
        tree = verify_sampling_tree(parent, tokens, q_tree, target_probs, keys, uniform_rand=u)
        same_result(tree, chain)
        assert len(set(chain.num_correct_drafts.tolist())) == num_drafts + 1  # all outcomes seen


def test_sampling_tree_siblings_by_hand():
    """Root p = [.5, .3, .2, 0]; children 1 (token 0) and 2 (token 1); node 1 has child 3."""
    parent = torch.tensor([[-1, 0, 0, 1]] * 2)
    tokens = torch.tensor([[0, 0, 1, 2]] * 2)
    target = torch.tensor(
        [[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]
    )
    target = target.expand(2, -1, -1)  # [2, 4 nodes, V=4]
    # One-hot proposals: child 1 (token 0) accepted iff u < 0.5. Row 0 rejects it
    # (u = .6); the residual is [0, .6, .4, 0] and child 2 (token 1) is accepted iff u < .6.
    u = torch.tensor([[0.6, 0.55, 0.0], [0.6, 0.65, 0.0]])
    res = verify_sampling_tree(parent, tokens, None, target, uniform_rand=u)
    assert res.accepted_path.tolist() == [[0, 2, -1, -1], [0, -1, -1, -1]]
    assert res.last_correct_step_indices.tolist() == [2, 0]
    # Row 0: node 2's target is one-hot at 3. Row 1: both rejected, residual [0, 0, 1, 0].
    assert res.output_token_ids.tolist() == [[1, 3, -1, -1], [2, -1, -1, -1]]
    # With q at the root = [.25, .5, .25, 0]: child 1 (token 0, p/q = 2) is always
    # accepted, then node 3 (token 2) is accepted iff u * q(2) < p_1(2) = 0: never.
    q = torch.tensor(
        [[0.25, 0.5, 0.25, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    )
    res = verify_sampling_tree(parent, tokens, q.expand(2, -1, -1), target, uniform_rand=u)
    assert res.accepted_path.tolist() == [[0, 1, -1, -1]] * 2
    # Residual at node 1: max(0, onehot(3) - onehot(2)) = onehot(3).
    assert res.output_token_ids.tolist() == [[0, 3, -1, -1]] * 2


def test_verify_sampling_seeded_request_independent_of_batch():
    vocab, num_drafts = 7, 3

    def run(position: int, batch: int, seed_others: bool):
        torch.manual_seed(100 + batch)  # other rows differ between calls
        target = torch.softmax(torch.randn(batch, num_drafts + 1, vocab), -1)
        q = torch.softmax(torch.randn(batch, num_drafts, vocab), -1)
        draft = torch.randint(0, vocab, (batch, num_drafts))
        torch.manual_seed(0)
        target[position] = torch.softmax(torch.randn(num_drafts + 1, vocab), -1)
        q[position] = torch.softmax(torch.randn(num_drafts, vocab), -1)
        draft[position] = torch.tensor([1, 2, 3])
        seeds = torch.arange(batch) + 100 if seed_others else torch.randint(1 << 40, (batch,))
        seeds[position] = 7
        outs = []
        for step in range(20):
            torch.manual_seed(int(torch.randint(0, 1000, ())))  # scramble the default RNG
            counters = torch.full((batch,), step)  # e.g. the verified position, step after step
            res = verify_sampling_chain(draft, q, target, random_keys(seeds, counters))
            outs.append(res.output_token_ids[position].tolist())
        return outs

    reference = run(0, 1, False)
    assert run(3, 6, False) == reference
    assert run(5, 9, True) == reference
    assert len({tuple(o) for o in reference}) > 1


# ----------------------------------------------------------------------------------------
# Lossless statistical tests
#
# The target is a Markov model over a small vocabulary: the distribution of the next token
# is T[previous token], where T = logits_to_probs(random logits, params) (temperature and
# filters included). The drafter proposes from its own table D = logits_to_probs(other
# logits, params). Each trial generates tokens with speculative decoding, verify step after
# verify step (the next step starts from the last emitted token), until it has L = 3 tokens.
# If verification is lossless the first L tokens are a sample of the Markov chain, so the
# L-token joint must be T[s, a] * T[a, b] * T[b, c] (s = start token). All trials run as one
# batch. The joint is compared with a chi-square test (cells expected < 5 merged), and any
# token in a zero-probability cell (something a filter removed) fails outright.

VOCAB = 5
LENGTH = 3
START = 0
NUM_TRIALS = 30_000
ALPHA = 1e-3

CONFIGS = {
    "temperature": params(temperature=0.7),
    "top_k": params(temperature=1.3, top_k=3),
    "top_p": params(temperature=0.9, top_p=0.8),
    "min_p": params(temperature=1.2, min_p=0.15),
    "all_filters": params(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05),
}


def markov_tables(
    config: SimpleNamespace, seed: int = 0, target_params: SimpleNamespace | None = None
):
    """(T, D): target and draft next-token tables, both processed with ``config``.
    ``target_params`` overrides the target's processing (to build broken setups)."""
    g = torch.Generator().manual_seed(seed)
    target_logits = 1.5 * torch.randn(VOCAB, VOCAB, generator=g)
    draft_logits = target_logits + 1.5 * torch.randn(VOCAB, VOCAB, generator=g)
    st_draft = SamplingTensors.from_params([config] * VOCAB, "cpu")
    st_target = SamplingTensors.from_params([target_params or config] * VOCAB, "cpu")
    return logits_to_probs(target_logits, st_target), logits_to_probs(draft_logits, st_draft)


def expected_joint(table: torch.Tensor) -> torch.Tensor:
    """Probability of each 3-token sequence under the Markov chain.  # [V ** 3]"""
    probs = table.double()
    a, b, c = torch.meshgrid(*(torch.arange(VOCAB),) * 3, indexing="ij")
    return (
        probs[START, a] * probs[a, b] * probs[b, c]
    ).flatten()  # [V ** 3], index a*V*V + b*V + c


def joint_p_value(emitted: torch.Tensor, table: torch.Tensor) -> float:
    """Chi-square p-value of the first LENGTH emitted tokens against the Markov joint."""
    assert (emitted >= 0).all()
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]  # [trials]
    counts = torch.bincount(index, minlength=VOCAB**LENGTH)
    return chi_square_p_value(counts, emitted.shape[0] * expected_joint(table))


def append_tokens(emitted, filled, res) -> None:
    """Append each trial's accepted tokens (up to LENGTH) in place."""
    count = res.num_correct_drafts + 1  # [trials]
    rows = torch.arange(emitted.shape[0])
    for c in range(res.output_token_ids.shape[1]):
        position = filled + c
        ok = (c < count) & (position < LENGTH)
        emitted[rows[ok], position[ok]] = res.output_token_ids[ok, c]
    filled += count


def run_chain(
    table, draft_table, mode: str, verifier=None, num_drafts: int = 2, trials: int = NUM_TRIALS
):
    """Speculative generation with a chain drafter. mode: "sampled" (drafts ~ q, q passed
    to the verifier) or "deterministic" (drafts = argmax q, draft_probs=None)."""
    verifier = verifier or verify_sampling_chain
    emitted = torch.full((trials, LENGTH), -1, dtype=torch.int64)
    filled = torch.zeros(trials, dtype=torch.int64)
    previous = torch.full((trials,), START, dtype=torch.int64)
    for _ in range(LENGTH):  # each verify emits >= 1 token
        drafts, qs, token = [], [], previous
        for _ in range(num_drafts):
            q = draft_table[token]  # [trials, V]
            token = sample_from_probs(q) if mode == "sampled" else q.argmax(-1)
            drafts.append(token)
            qs.append(q)
        draft = torch.stack(drafts, 1)  # [trials, num_drafts]
        context = torch.cat([previous[:, None], draft], 1)  # [trials, num_drafts + 1]
        res = verifier(draft, torch.stack(qs, 1) if mode == "sampled" else None, table[context])
        append_tokens(emitted, filled, res)
        previous = res.bonus_token_ids
    return emitted


def run_tree(table, draft_table, mode: str, pass_q: bool | None = None, trials: int = NUM_TRIALS):
    """Speculative generation with the fixed tree TREE_PARENT. mode: "iid" (each node's
    children are i.i.d. samples from q at that node) or "topk" (children are the top
    tokens of q, EAGLE style). ``pass_q`` defaults to mode == "iid"."""
    pass_q = (mode == "iid") if pass_q is None else pass_q
    num_nodes = len(TREE_PARENT)
    parent = torch.tensor([TREE_PARENT] * trials)
    emitted = torch.full((trials, LENGTH), -1, dtype=torch.int64)
    filled = torch.zeros(trials, dtype=torch.int64)
    previous = torch.full((trials,), START, dtype=torch.int64)
    for _ in range(LENGTH):
        tokens = torch.zeros(trials, num_nodes, dtype=torch.int64)
        tokens[:, 0] = previous
        for node in range(1, num_nodes):
            q = draft_table[tokens[:, TREE_PARENT[node]]]  # [trials, V]
            if mode == "iid":
                tokens[:, node] = sample_from_probs(q)
            else:
                tokens[:, node] = torch.sort(q, dim=-1, descending=True, stable=True).indices[
                    :, TREE_RANK[node]
                ]
        draft_probs = draft_table[tokens] if pass_q else None  # [trials, nodes, V]
        res = verify_sampling_tree(parent, tokens, draft_probs, table[tokens], max_depth=TREE_DEPTH)
        append_tokens(emitted, filled, res)
        previous = res.bonus_token_ids
    return emitted


RUNNERS = {
    "chain_sampled": lambda t, d: run_chain(t, d, "sampled"),
    "chain_deterministic": lambda t, d: run_chain(t, d, "deterministic"),
    "tree_iid": lambda t, d: run_tree(t, d, "iid"),
    "tree_topk": lambda t, d: run_tree(t, d, "topk"),
}


def test_markov_joint_is_what_it_claims():
    table, _ = markov_tables(CONFIGS["temperature"])
    joint = expected_joint(table)
    assert joint.sum().item() == pytest.approx(1.0)
    # Plain sampling from the chain passes (sanity of the harness itself).
    torch.manual_seed(0)
    tokens = torch.full((NUM_TRIALS,), START)
    seq = []
    for _ in range(LENGTH):
        tokens = sample_from_probs(table[tokens])
        seq.append(tokens)
    assert joint_p_value(torch.stack(seq, 1), table) > ALPHA


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("runner_name", list(RUNNERS))
def test_lossless(runner_name, config_name):
    table, draft_table = markov_tables(CONFIGS[config_name])
    if config_name != "temperature":
        assert (table == 0).any()  # the filters bite, so the zero-cell check means something
    torch.manual_seed(1)
    emitted = RUNNERS[runner_name](table, draft_table)
    assert joint_p_value(emitted, table) > ALPHA


# ----------------------------------------------------------------------------------------
# Negative checks: broken verifiers the statistical test must reject. They live here only,
# and are injected into the real code path by replacing one primitive at a time.


def broken_recover_from_target(p, q):
    """Bug: the bonus token after a rejection is drawn from p, not from max(0, p - q)."""
    return p


def broken_unnormalised_residual(p, q):
    """Bug: max(0, p - q) is not renormalised. Harmless for a chain's final draw (the
    exponential race is scale-free) but wrong for trees, where the next sibling's
    acceptance ratio reads the residual."""
    return (p - q).clamp(min=0.0)


def broken_keep_rejected_token(p, token):
    """Bug (one-hot proposals): after rejecting x, x is not removed from p."""
    return p


def broken_remove_without_renormalising(p, token):
    """Bug (one-hot proposals): x removed but p not renormalised."""
    return p.scatter(-1, token[:, None], 0.0)


def broken_inverted_ratio(uniform, p_x, q_x):
    """Bug: accept with min(1, q/p) instead of min(1, p/q)."""
    return uniform * p_x < q_x


RESIDUAL, ONE_HOT_RESIDUAL = "_residual_after_rejection", "_residual_after_rejecting_token"
MUTANTS = [
    # (name, primitive replaced, replacement, runner, config)
    (
        "chain: bonus from p after rejection",
        RESIDUAL,
        broken_recover_from_target,
        "chain_sampled",
        "temperature",
    ),
    (
        "chain: inverted acceptance ratio",
        "_accepts",
        broken_inverted_ratio,
        "chain_sampled",
        "top_k",
    ),
    (
        "chain, no q: rejected token kept",
        ONE_HOT_RESIDUAL,
        broken_keep_rejected_token,
        "chain_deterministic",
        "temperature",
    ),
    (
        "tree iid: bonus from p after rejection",
        RESIDUAL,
        broken_recover_from_target,
        "tree_iid",
        "min_p",
    ),
    (
        "tree iid: residual not renormalised",
        RESIDUAL,
        broken_unnormalised_residual,
        "tree_iid",
        "temperature",
    ),
    (
        "tree top-k: rejected token kept",
        ONE_HOT_RESIDUAL,
        broken_keep_rejected_token,
        "tree_topk",
        "top_p",
    ),
    (
        "tree top-k: not renormalised",
        ONE_HOT_RESIDUAL,
        broken_remove_without_renormalising,
        "tree_topk",
        "temperature",
    ),
]


@pytest.mark.parametrize(
    "name,primitive,replacement,runner_name,config_name", MUTANTS, ids=[m[0] for m in MUTANTS]
)
def test_statistical_test_rejects_broken_verifier(
    monkeypatch, name, primitive, replacement, runner_name, config_name
):
    monkeypatch.setattr(verify_mod, primitive, replacement)
    table, draft_table = markov_tables(CONFIGS[config_name])
    torch.manual_seed(1)
    emitted = RUNNERS[runner_name](table, draft_table)
    assert joint_p_value(emitted, table) < ALPHA


def test_statistical_test_rejects_top_p_applied_to_draft_only():
    """Bug: the drafter samples with top_p but the target side is processed without it."""
    config = CONFIGS["top_p"]
    true_table, _ = markov_tables(config)
    unfiltered_target, draft_table = markov_tables(
        config, target_params=params(temperature=config.temperature)
    )
    torch.manual_seed(1)
    emitted = run_chain(unfiltered_target, draft_table, "sampled")
    assert joint_p_value(emitted, true_table) < ALPHA


def test_statistical_test_rejects_q_rule_on_top_k_children():
    """Misuse: EAGLE-style top-k children verified as if they were i.i.d. samples from q."""
    table, draft_table = markov_tables(CONFIGS["temperature"])
    torch.manual_seed(1)
    emitted = run_tree(table, draft_table, "topk", pass_q=True)
    assert joint_p_value(emitted, table) < ALPHA


def test_unnormalised_residual_is_harmless_for_chains(monkeypatch):
    """The chain's residual feeds only the exponential race, which is scale-free, so skipping
    the renormalisation there is not a bug: the test must (and does) still pass."""
    monkeypatch.setattr(verify_mod, "_residual_after_rejection", broken_unnormalised_residual)
    table, draft_table = markov_tables(CONFIGS["all_filters"])
    torch.manual_seed(1)
    emitted = run_chain(table, draft_table, "sampled")
    assert joint_p_value(emitted, table) > ALPHA


# ----------------------------------------------------------------------------------------
# Dispatching entry points


def test_verify_chain_dispatch_matches_parts():
    torch.manual_seed(0)
    batch, num_drafts, vocab = 8, 3, 10
    target_logits = torch.randn(batch, num_drafts + 1, vocab)
    q = torch.softmax(torch.randn(batch, num_drafts, vocab), -1)
    draft = sample_from_probs(q.view(-1, vocab)).view(batch, num_drafts)
    plist = [params(0.8, 5, 0.9) if i % 2 else params(0.0) for i in range(batch)]
    st = SamplingTensors.from_params(plist, "cpu")
    probs = logits_to_probs(
        target_logits.view(-1, vocab), st.repeat_interleave(num_drafts + 1)
    ).view(batch, num_drafts + 1, vocab)
    gens = lambda: random_keys(torch.arange(batch), torch.zeros(batch, dtype=torch.int64))  # noqa: E731
    same_result(
        verify_chain(draft, q, target_logits, st, gens()),
        verify_sampling_chain(draft, q, probs, gens()),
    )
    greedy_rows = torch.arange(0, batch, 2)
    dispatched = verify_chain(draft, q, target_logits, st, gens())
    reference = verify_greedy_chain(draft, target_logits)
    assert torch.equal(
        dispatched.output_token_ids[greedy_rows], reference.output_token_ids[greedy_rows]
    )
    all_greedy = SamplingTensors.from_params([params(0.0)] * batch, "cpu")
    same_result(verify_chain(draft, q, target_logits, all_greedy), reference)
