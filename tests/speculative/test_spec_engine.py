"""The speculative loop is lossless whatever the drafts: greedy output with speculation equals
output without it, token for token (fp32, CPU), for chains and trees, mixed prompt lengths,
chunked prefill, requests joining mid-run, and preemption when KV blocks run out."""

import pytest
import torch

from helpers.oracle_proposer import OracleProposer
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.registry import PROPOSERS

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SPECS = {
    "chain": SpeculativeConfig("oracle", None, num_steps=4),
    "tree": SpeculativeConfig("oracle", None, num_steps=4, topk=3, num_draft_tokens=9),
}


def prompts(n):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 200, (3 + 5 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def reference(llama_dir):
    ps = prompts(8)
    outs = LLM(str(llama_dir), block_size=4).generate(ps, GREEDY.replace(max_tokens=60))
    OracleProposer.references = {tuple(p): o.token_ids for p, o in zip(ps, outs)}
    return ps, [o.token_ids[: GREEDY.max_tokens] for o in outs]


@pytest.mark.parametrize("shape", list(SPECS))
@pytest.mark.parametrize("corruption", [0.0, 0.3, 1.0])
def test_greedy_lossless_mixed_batch(llama_dir, reference, shape, corruption, monkeypatch):
    monkeypatch.setattr(OracleProposer, "corruption", corruption)
    ps, expected = reference
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=256, speculative=SPECS[shape])
    outs = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.pool.num_free == 256
    tau = sum(o.spec_metrics.num_accepted_drafts + o.spec_metrics.num_verifies for o in outs) / sum(
        o.spec_metrics.num_verifies for o in outs
    )
    if corruption == 0.0:  # a random tree's planted path is often shallower than 4
        assert tau > (3.5 if shape == "chain" else 2.0), "perfect drafts must be accepted"
    if corruption == 1.0:
        assert tau < 1.3


@pytest.mark.parametrize("shape", list(SPECS))
def test_greedy_lossless_chunked_joining_and_preempted(llama_dir, reference, shape):
    ps, expected = reference
    llm = LLM(
        str(llama_dir),
        block_size=4,
        num_kv_blocks=24,
        max_num_batched_tokens=16,
        speculative=SPECS[shape],
    )
    engine, done = llm.engine, {}
    ids = {}
    step = 0
    while len(done) < len(ps):
        if step % 2 == 0 and len(ids) < len(ps):
            ids[engine.add_request(ps[len(ids)], GREEDY)] = len(ids)
        for out in engine.step():
            done[ids[out.request_id]] = out
        step += 1
    assert [done[i].token_ids for i in range(len(ps))] == expected
    assert sum(o.metrics.num_preemptions for o in done.values()) > 0, (
        "the pool was meant to force preemption"
    )
    assert engine.pool.num_free == 24


def test_sampling_runs_and_seeds_reproduce(llama_dir, reference):
    ps, _ = reference
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=i, ignore_eos=True)
        for i in range(4)
    ]
    llm = LLM(str(llama_dir), block_size=4, speculative=SPECS["chain"])
    first = [o.token_ids for o in llm.generate(ps[:4], params)]
    again = [
        o.token_ids
        for o in LLM(str(llama_dir), block_size=4, speculative=SPECS["chain"]).generate(
            ps[:4], params
        )
    ]
    assert first == again and all(len(t) == 16 for t in first)


def test_spec_metrics(llama_dir, reference):
    ps, _ = reference
    out = LLM(str(llama_dir), block_size=4, speculative=SPECS["chain"]).generate(ps[:1], GREEDY)[0]
    m = out.spec_metrics
    assert m.num_verifies > 0 and len(m.acceptance_rate_per_position) == 4
    assert sum(m.histogram) == m.num_verifies
    assert m.num_accepted_drafts == sum(m.accepted_per_position)
    # every committed token after the first came from a verify: accepted drafts + one bonus each
    assert len(out.token_ids) - 1 <= m.num_accepted_drafts + m.num_verifies


@pytest.mark.parametrize("shape", list(SPECS))
def test_abort_mid_speculation_frees_everything(llama_dir, reference, shape):
    ps, expected = reference
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=64, speculative=SPECS[shape])
    engine = llm.engine
    ids = [engine.add_request(p, GREEDY) for p in ps[:4]]
    for _ in range(3):
        engine.step()
    assert engine.abort_request(ids[1]).finish_reason == "abort"
    done = {}
    while engine.has_unfinished_requests:
        done.update({o.request_id: o.token_ids for o in engine.step()})
    assert done == {ids[i]: expected[i] for i in (0, 2, 3)}
    assert engine.pool.num_free == 64
