"""The code around CUDA graphs: static buffers, padding to batch buckets, block-table mirroring and
the chain iterations' (EAGLE3, DFlash) state handoff. On the CPU a "replay" re-runs the captured
function eagerly over the same static buffers, so everything but the capture itself is checked
here; the GPU tests (tests/test_gpu.py) check the captured graphs."""
import json
from pathlib import Path

import pytest
import torch

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.engine.cuda_graphs import batch_buckets, bucket_for

ZOO = "zoo/tinypy"
EAGLE3 = SpeculativeConfig(method="eagle3", draft="zoo/tinypy-eagle3", num_steps=4)
DFLASH = SpeculativeConfig(method="dflash", draft="zoo/tinypy-dflash", num_steps=7)  # block size 8
CHAINS = pytest.mark.parametrize("spec", [EAGLE3, DFLASH], ids=["eagle3", "dflash"])


def _prompts(n: int) -> list[list[int]]:
    prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"]
    tok = LLM(ZOO).tokenizer
    return [tok.encode(p)[-40:] for p in prompts[:n]]


def _graphed(spec: SpeculativeConfig | None, max_num_seqs: int = 4, **kw) -> LLM:
    llm = LLM(ZOO, max_num_seqs=max_num_seqs, speculative=spec or SpeculativeConfig(), **kw)
    llm.engine.capture_graphs()
    return llm


def test_buckets():
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 48, 64)
    assert batch_buckets(5) == (1, 2, 4, 5)
    assert bucket_for((1, 2, 4), 3) == 4 and bucket_for((1, 2, 4), 5) is None


@pytest.fixture(scope="module")
def prompts():
    return _prompts(6)


@pytest.fixture(scope="module")
def reference(prompts):
    """Greedy outputs without speculation or graphs, with ragged lengths so the batch changes."""
    llm = LLM(ZOO, max_num_seqs=4)
    params = [SamplingParams(temperature=0, max_tokens=12 + 5 * i, ignore_eos=True) for i in range(len(prompts))]
    return params, [o.token_ids for o in llm.generate(prompts, params)]


def test_graphed_decode_equals_eager(prompts, reference):
    params, expected = reference
    llm = _graphed(None)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


def test_every_bucket_writes_its_logits_into_one_buffer(prompts, reference):
    """The captured forwards of all buckets share one logits buffer (not one per bucket, which for a
    large vocabulary would hold gigabytes): a batch of 1 and one of 3 read the same memory, and
    decoding through buckets 1, 2 and 4 in turn still gives the eager tokens."""
    params, expected = reference
    llm = _graphed(None)
    graph, pool = llm.engine.runner.captured(1, 1), llm.engine.pool
    ptrs = set()
    for n in (1, 3):
        ids = [f"shared-{i}" for i in range(n)]
        for rid in ids:
            pool.grow(rid, 8)
        with torch.inference_mode():
            _, logits = graph.run(ids, [4] * n, torch.zeros(n, dtype=torch.int64), torch.full((n,), 4))
        assert logits.shape == (n, llm.engine.model_config.vocab_size)
        ptrs.add(logits.data_ptr())
        for rid in ids:
            pool.free(rid)
    assert ptrs == {graph.logits.data_ptr()}
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected


def _count_run_ahead_hits(llm: LLM) -> dict:
    """Counts steps whose results came from a step run ahead (engine/runner.py, speculative/chain_graph.py)."""
    spec_runner = llm.engine.spec_runner
    owner = spec_runner.iteration if spec_runner is not None else llm.engine.runner
    hits, take = {"hits": 0}, owner._take_ahead

    def counting(ids, starts):
        launch = take(ids, starts)
        hits["hits"] += launch is not None
        return launch

    owner._take_ahead = counting
    return hits


def test_run_ahead_decode_is_lossless_across_stops_joins_and_preemption(prompts):
    """Greedy decode run ahead: requests stop on a stop token and by length, join mid-run and are
    preempted (a pool too small for the batch); every output equals eager decoding and every block
    returns to the pool."""
    eager = LLM(ZOO, max_num_seqs=4)
    free_run = eager.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=10 + 4 * i, ignore_eos=True,
                             stop_token_ids=[free_run[i].token_ids[6]] if i % 2 else [])
              for i in range(len(prompts))]
    expected = eager.generate(prompts, params)
    assert any(o.finish_reason == "stop" for o in expected) and any(o.finish_reason == "length" for o in expected)
    for kw in ({}, {"num_kv_blocks": 10, "max_num_batched_tokens": 64}):
        llm = _graphed(None, **kw)
        hits = _count_run_ahead_hits(llm)
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
        assert hits["hits"] > 10  # most decode steps came from a step run ahead
        assert llm.engine.pool.num_free == llm.engine.pool.num_blocks
    assert sum(o.metrics.num_preemptions for o in outs) > 0


def test_run_ahead_can_be_turned_off(prompts, reference):
    params, expected = reference
    llm = _graphed(None, run_ahead=False)
    hits = _count_run_ahead_hits(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert hits["hits"] == 0


@CHAINS
def test_chain_iteration_is_lossless_across_batch_changes(prompts, reference, spec):
    """Six requests through four slots: requests join and finish, so the iteration's state moves
    between the captured buffers and the eager proposer many times."""
    params, expected = reference
    llm = _graphed(spec)
    iteration = llm.engine.spec_runner.iteration
    calls = {"run": 0}
    run = iteration.run

    def counting_run(batch):
        calls["run"] += 1
        return run(batch)

    iteration.run = counting_run
    hits = _count_run_ahead_hits(llm)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert calls["run"] > 10  # the captured iteration did the decoding, not the eager path
    assert hits["hits"] > 5  # and most replays were run ahead
    assert sum(o.spec_metrics.acceptance_length for o in outs) / len(outs) > 1.5
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks
    assert not llm.engine.spec_runner.proposer._pending  # nothing left behind for finished requests


@CHAINS
def test_requests_leaving_the_batch_keep_the_others_state_on_the_device(prompts, reference, spec):
    """Four requests of different lengths in four slots: they finish one by one and none joins, so
    after the first import the state never goes back through the eager proposer, and the replay run
    ahead for a batch still serves the requests of it that remain."""
    params, expected = reference
    llm = _graphed(spec)
    iteration = llm.engine.spec_runner.iteration
    calls = {"import": 0, "keep_only": 0}
    for name in calls:
        method = getattr(iteration, f"_{name}")
        setattr(iteration, f"_{name}", lambda *a, name=name, method=method: calls.__setitem__(name, calls[name] + 1)
                or method(*a))
    dropped, take = [], iteration._take_ahead

    def counting_take(ids, starts):
        ahead = iteration._ahead
        replay = take(ids, starts)
        dropped.extend([ids] if ids and ahead is not None and replay is None else [])
        return replay

    iteration._take_ahead = counting_take
    outs = llm.generate(prompts[:4], params[:4])
    assert [o.token_ids for o in outs] == expected[:4]
    assert calls["import"] == 1 and calls["keep_only"] >= 1  # some may leave together in one step
    assert dropped == []  # no step of the batch replayed anew what had run ahead
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


@CHAINS
def test_first_decode_step_after_a_prefill_replays_the_iteration(prompts, reference, spec):
    """The prefill step absorbs a prompt's rows into the draft KV but the last k + 1, so no decode
    step drafts eagerly (40-token prompts: the iteration's buffers hold 5 or 8 rows)."""
    params, expected = reference
    llm = _graphed(spec)
    proposer = llm.engine.spec_runner.proposer
    eager_drafts = []
    propose = proposer.propose
    proposer.propose = lambda requests: eager_drafts.append(len(requests)) or propose(requests)
    outs = llm.generate(prompts[:4], params[:4])
    assert [o.token_ids for o in outs] == expected[:4]
    assert eager_drafts == []


@CHAINS
def test_chain_iteration_matches_the_eager_acceptance(prompts, spec):
    """Same drafts, same acceptance: the captured iteration and the eager proposer agree step by step."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    eager = LLM(ZOO, max_num_seqs=4, speculative=spec).generate(prompts[:3], params)
    graphed = _graphed(spec).generate(prompts[:3], params)
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids
        assert a.spec_metrics.accepted_per_position == b.spec_metrics.accepted_per_position


def test_dflash_padded_context_rows_are_never_read(prompts):
    """The context write covers B rows a request, past the committed ones: those padded rows (NaN
    here) must be overwritten by the block forward before anything reads them."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    eager = LLM(ZOO, max_num_seqs=4, speculative=DFLASH).generate(prompts[:3], params)
    llm = _graphed(DFLASH)
    iteration = llm.engine.spec_runner.iteration
    draft = iteration._draft

    def poisoned(tables, start, count, last):
        features = iteration.pending[0][:len(count)]
        features[torch.arange(features.shape[1]) >= count[:, None]] = float("nan")
        return draft(tables, start, count, last)

    iteration._draft = poisoned
    graphed = llm.generate(prompts[:3], params)
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids
        assert a.spec_metrics.accepted_per_position == b.spec_metrics.accepted_per_position


def test_sampled_requests_fall_back_to_eager_drafting_with_the_captured_verify(prompts):
    params = [SamplingParams(temperature=0.8, max_tokens=16, seed=i, ignore_eos=True) for i in range(3)]
    eager = LLM(ZOO, max_num_seqs=4, speculative=EAGLE3).generate(prompts[:3], params)
    graphed = _graphed(EAGLE3).generate(prompts[:3], params)
    assert [o.token_ids for o in eager] == [o.token_ids for o in graphed]


@pytest.mark.parametrize("spec", [
    SpeculativeConfig(method="eagle3", draft="zoo/tinypy-eagle3", num_steps=3, topk=2, num_draft_tokens=6),
    SpeculativeConfig(method="mtp", num_steps=3),
], ids=["eagle3-tree", "mtp"])
def test_captured_verify_is_lossless(prompts, reference, spec):
    params, expected = reference
    llm = _graphed(spec)
    assert llm.engine.spec_runner.iteration is None
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


@pytest.mark.parametrize("spec, rates", [(EAGLE3, [0.9, 0.6, 0.3, 0.1]),
                                         (DFLASH, [0.9, 0.8, 0.6, 0.5, 0.3, 0.2, 0.1])], ids=["eagle3", "dflash"])
def test_oracle_acceptance_follows_the_rates(prompts, spec, rates):
    llm = LLM(ZOO, max_num_seqs=4, speculative=spec)
    llm.engine.capture_graphs(oracle_rates=rates)
    torch.manual_seed(0)
    outs = llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    steps = sum(o.spec_metrics.num_verifies for o in outs)
    accepted = [sum(o.spec_metrics.accepted_per_position[j] for o in outs) / steps for j in range(len(rates))]
    for rate, seen in zip(rates, accepted):  # binomial, > 150 steps: 4 sigma < 0.17
        assert abs(seen - rate) < 4 * (rate * (1 - rate) / steps) ** 0.5 + 0.02, (rates, accepted)


def test_oracle_needs_a_chain_iteration():
    llm = LLM(ZOO, max_num_seqs=2, speculative=SpeculativeConfig(method="mtp", num_steps=2))
    with pytest.raises(ValueError, match="oracle acceptance needs"):
        llm.engine.capture_graphs(oracle_rates=[0.5, 0.5])


@pytest.mark.parametrize("spec", [EAGLE3, SpeculativeConfig(method="dflash", draft="zoo/tinypy-dflash", num_steps=7)],
                         ids=["eagle3", "dflash"])
def test_captured_iteration_survives_preemption(prompts, reference, spec):
    """A pool too small for the batch: requests are preempted while their state lives in the graph's
    buffers, recomputed eagerly, and rejoin it; output and block accounting stay exact."""
    params, expected = reference
    llm = LLM(ZOO, max_num_seqs=4, num_kv_blocks=14, max_num_batched_tokens=64, speculative=spec)
    llm.engine.capture_graphs()
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert llm.engine.pool.num_free == 14
    assert not llm.engine.spec_runner.proposer._pending
