"""Speculation on hybrid targets (gated DeltaNet / Mamba2 layers with a recurrent state per request) is
lossless: greedy output with speculation equals output without it, token for token (fp32, CPU), for
chains and trees, whatever the drafts (the oracle drafter plants the true continuation with random
corruptions, so every acceptance length occurs), with chunked prefill, requests joining mid-run and
preemption; sampled tokens follow the target's distribution. The state kept after a verify is the
snapshot at last_correct_step_indices: one row later, or a tree node continued from the previous row
instead of its parent, changes the output. Every state row and KV block returns when requests finish,
abort or are preempted."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.engine_fuzz import request_strategy, run_with_aborts
from helpers.hybrid_models import HYBRIDS, make_hybrid, save_hybrid
from helpers.hybrid_sampling import LENGTH, PROMPT, SAMPLED, TRIALS, VOCAB
from helpers.oracle_proposer import OracleProposer
from helpers.stats import chi_square_p_value, exact_joint
from outpace import LLM, SamplingParams
from outpace.cache.recurrent_states import RecurrentStates
from outpace.config import SpeculativeConfig
from outpace.registry import PROPOSERS

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
SPECS = {
    "chain": SpeculativeConfig("oracle", None, num_steps=4),
    "tree": SpeculativeConfig("oracle", None, num_steps=3, topk=2, num_draft_tokens=7),
}


def prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 131, (2 + 4 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """variant -> (checkpoint directory, prompts, their plain greedy outputs)."""
    out = {}
    for seed, variant in enumerate(
        HYBRIDS
    ):  # (other prompts for each: the oracle knows them all at once)
        path = save_hybrid(make_hybrid(variant), tmp_path_factory.mktemp(variant))
        ps = prompts(5, seed)
        outs = LLM(str(path), block_size=4).generate(ps, GREEDY.replace(max_tokens=48))
        out[variant] = (path, ps, [o.token_ids for o in outs])
    return out


@pytest.fixture
def oracle(targets, monkeypatch):
    """The oracle knows every prompt's plain greedy continuation; returns variant -> (path, prompts,
    the first GREEDY.max_tokens tokens of each)."""
    refs = {tuple(p): o for _, ps, outs in targets.values() for p, o in zip(ps, outs)}
    monkeypatch.setattr(OracleProposer, "references", refs)
    monkeypatch.setattr(OracleProposer, "vocab_size", 131)
    return {
        v: (path, ps, [o[: GREEDY.max_tokens] for o in outs])
        for v, (path, ps, outs) in targets.items()
    }


@pytest.mark.parametrize("variant", list(HYBRIDS))
@pytest.mark.parametrize("shape", list(SPECS))
@pytest.mark.parametrize("corruption", [0.0, 0.3, 1.0])
def test_greedy_lossless(variant, shape, corruption, oracle, monkeypatch):
    monkeypatch.setattr(OracleProposer, "corruption", corruption)
    path, ps, expected = oracle[variant]
    llm = LLM(str(path), block_size=4, num_kv_blocks=128, speculative=SPECS[shape])
    outs = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == expected
    histogram = [
        sum(o.spec_metrics.histogram[i] if i < len(o.spec_metrics.histogram) else 0 for o in outs)
        for i in range(SPECS[shape].num_steps + 1)
    ]
    if corruption == 0.3:  # every acceptance length, none to all, happened
        assert all(histogram), histogram
    if corruption == 1.0:
        assert sum(histogram[1:]) <= 0.05 * sum(histogram), histogram
    if (
        corruption == 0.0 and shape == "chain"
    ):  # (a request's last verify may be cut short by max_tokens)
        assert histogram[0] == 0 and histogram[-1] >= 0.5 * sum(histogram), histogram
    assert llm.engine.pool.num_free == 128


@pytest.mark.parametrize("variant", list(HYBRIDS))
@pytest.mark.parametrize("shape", list(SPECS))
def test_greedy_lossless_chunked_joining_and_preempted(variant, shape, oracle):
    path, ps, expected = oracle[variant]
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=12,
        max_num_batched_tokens=16,
        speculative=SPECS[shape],
    )
    engine, ids, done, step = llm.engine, {}, {}, 0
    while len(done) < len(ps):
        if len(ids) < len(ps):
            ids[engine.add_request(ps[len(ids)], GREEDY)] = len(ids)
        for out in engine.step():
            done[ids[out.request_id]] = out
        step += 1
    assert [done[i].token_ids for i in range(len(ps))] == expected
    assert sum(o.metrics.num_preemptions for o in done.values()) > 0, (
        "the pool was meant to force preemption"
    )
    assert engine.pool.num_free == 12


@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_keeping_the_next_row_changes_the_output(variant, oracle, monkeypatch):
    """The state after a verify must be the snapshot at num_correct_drafts, not one row later."""
    monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    commit = RecurrentStates.commit
    monkeypatch.setattr(
        RecurrentStates,
        "commit",
        lambda self, indices, rows, verified=None: commit(
            self, indices, (rows + 1).clamp(max=self.max_verify_rows - 1), verified
        ),
    )
    path, ps, expected = oracle[variant]
    outs = LLM(str(path), block_size=4, speculative=SPECS["chain"]).generate(ps, GREEDY)
    assert [o.token_ids for o in outs] != expected


@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_tree_nodes_continuing_the_previous_row_change_the_output(variant, oracle, monkeypatch):
    """A tree node's state must continue its parent's, not the previous node's."""
    monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    verify = RecurrentStates.verify
    monkeypatch.setattr(
        RecurrentStates,
        "verify",
        lambda self, indices, lengths, parents, chain_nodes=None: verify(
            self, indices, lengths, None, chain_nodes
        ),
    )
    path, ps, expected = oracle[variant]
    outs = LLM(str(path), block_size=4, speculative=SPECS["tree"]).generate(ps, GREEDY)
    assert [o.token_ids for o in outs] != expected


# one target per mixer (gated DeltaNet packed as Qwen3-Next's and as Qwen3.5's, Mamba2): the n-gram test asks
# that drafts be accepted, which depends on whether a random target's greedy output repeats; the other
# variants reuse these mixers, and the oracle's tests above accept drafts on every variant
MIXERS = ("qwen3_next", "qwen3_5", "nemotron_h")


@pytest.mark.parametrize("variant", MIXERS)
@pytest.mark.parametrize("adaptive", [False, True])
def test_ngram_drafts_are_lossless(variant, adaptive, targets):
    """The n-gram drafter on a hybrid; adaptive: the draft length cycles 0 .. 3 step after step (the snapshot
    rows are sized for the longest)."""
    path, _, _ = targets[variant]
    ps = [[7, 8, 9, 10] * 4 + [7, 8], [1, 2, 3, 1, 2, 3, 1, 2]]
    expected = [o.token_ids for o in LLM(str(path), block_size=4).generate(ps, GREEDY)]
    llm = LLM(
        str(path),
        block_size=4,
        speculative=SpeculativeConfig("ngram", num_steps=3, ngram_min=1, adaptive=adaptive),
    )
    if adaptive:
        shapes, turn = llm.engine.runner.shapes, iter(range(10**6))
        for chooser in llm.engine.choosers.values():
            chooser.choose = lambda bucket, ids, remaining=None: shapes[next(turn) % len(shapes)]
    outs = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == expected
    if adaptive:  # every draft length was verified
        assert all(sum(o.spec_metrics.verifies_by_num_drafts[k] for o in outs) for k in range(4))
    else:  # drafts were accepted (multi-row verifies kept a later snapshot)
        assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0


# ---- accounting: every state row and block comes back --------------------------------------------------
_llm_cache = {}


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(request_strategy, min_size=1, max_size=6),
    st.sampled_from(list(HYBRIDS)),
    st.sampled_from(list(SPECS)),
)
def test_every_slot_and_block_returns(targets, oracle, requests, variant, shape):
    key = (variant, shape)
    if key not in _llm_cache:  # 12 blocks of 4 tokens: a few requests already force preemption
        _llm_cache[key] = LLM(
            str(targets[variant][0]),
            block_size=4,
            num_kv_blocks=12,
            max_num_batched_tokens=16,
            max_num_seqs=4,
            speculative=SPECS[shape],
        )
    engine = _llm_cache[key].engine

    def check() -> None:
        in_use = sum(len(engine.pool.table(r.request_id)) for r in engine.scheduler.running)
        assert engine.pool.num_free + in_use == engine.pool.num_blocks
        # a state row (the request row) only while running
        assert engine.runner.req_table.held_by <= {r.request_id for r in engine.scheduler.running}

    run_with_aborts(
        engine,
        [
            ([(i * 31 + j) % 131 for j in range(plen)], *rest)
            for i, (plen, *rest) in enumerate(requests)
        ],
        check,
    )
    assert engine.pool.num_free == engine.pool.num_blocks
    assert not engine.runner.req_table.held_by
    assert engine.runner.req_table.num_free == engine.config.max_num_seqs


# ---- sampling: the emitted tokens follow the target's distribution --------------------------------------
# one draft deep, so the third token often comes from a second verify, which reads the state the first kept
SAMPLING_SPECS = {
    "chain": SpeculativeConfig("oracle", None, num_steps=1),
    "tree": SpeculativeConfig("oracle", None, num_steps=1, topk=3, num_draft_tokens=4),
}


@pytest.mark.parametrize("shape", list(SAMPLING_SPECS))
def test_sampled_tokens_follow_the_target_distribution(shape, tmp_path, monkeypatch):
    path = save_hybrid(make_hybrid("qwen3_next", vocab_size=VOCAB), tmp_path / "target")
    greedy = (
        LLM(str(path), block_size=4).generate([PROMPT], GREEDY.replace(max_tokens=8))[0].token_ids
    )
    monkeypatch.setattr(OracleProposer, "references", {tuple(PROMPT): greedy})
    monkeypatch.setattr(OracleProposer, "vocab_size", VOCAB)
    monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=4096,
        max_num_seqs=512,
        max_num_batched_tokens=4096,
        seed=7,
        speculative=SAMPLING_SPECS[shape],
    )
    outs = llm.generate([PROMPT] * TRIALS, SAMPLED)
    emitted = torch.tensor([o.token_ids for o in outs])  # [TRIALS, LENGTH]
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]
    p = chi_square_p_value(
        torch.bincount(index, minlength=VOCAB**LENGTH),
        TRIALS * exact_joint(path, PROMPT, SAMPLED, VOCAB),
    )
    assert p > 1e-3, f"{shape}: p = {p:.2e}"
    assert (
        sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0.1 * TRIALS
    )  # speculation really ran
