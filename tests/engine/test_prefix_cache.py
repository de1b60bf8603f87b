"""Automatic prefix caching (cache/prefix_cache.py, cache/block_pool.py): keys, hits, LRU eviction, exact
block accounting with shared blocks (hypothesis); with every drafter, greedy outputs and acceptance are
those of the cache off on prompts sharing prefixes of many lengths; the hit rate in /metrics."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.engine_fuzz import run_with_aborts
from helpers.zoo_drafters import zoo_drafters
from outpace import LLM, SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import pool_cache_tensors
from outpace.cache.prefix_cache import PrefixCache
from outpace.config import SpeculativeConfig
from outpace.server.metrics import ServerMetrics
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TARGET = str(ZOO / "tinypy")
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
DRAFTERS = {"none": SpeculativeConfig(), **zoo_drafters(chain_steps=5, tree=(4, 3, 10))}


def pool_with_cache(num_blocks: int, block_size: int = 4, reads_ahead: int = 0) -> BlockPool:
    return BlockPool(num_blocks, block_size, PrefixCache(block_size, reads_ahead))


def run(
    pool: BlockPool,
    rid: str,
    tokens: list[int],
    settled: int | None = None,
    tables: dict | None = None,
):
    """A request joins with its longest hit, holds its tokens, publishes its settled rows, and leaves;
    returns the hit (``tables`` receives its whole table)."""
    hit = pool.cached_blocks(rid, tokens, len(tokens) - 1)
    pool.reuse(rid, hit)
    table = list(pool.grow(rid, len(tokens)))
    if tables is not None:
        tables[rid] = table
    pool.publish(rid, tokens, len(tokens) if settled is None else settled)
    pool.free(rid)
    pool.forget(rid)
    return hit


# ---- the pool and the cache -------------------------------------------------------------------------
def test_a_hit_covers_the_longest_published_run_of_full_blocks():
    pool = pool_with_cache(16)
    a, tables = list(range(100, 114)), {}  # 14 tokens: 3 full blocks published
    assert run(pool, "a", a, tables=tables) == []
    assert pool.num_free == 16
    b = a[:10] + [7, 7, 7, 7]  # shares 2.5 blocks
    assert run(pool, "b", b) == tables["a"][:2]
    assert run(pool, "c", a) == run(pool, "d", a)  # the same prompt hits the same blocks
    assert len(run(pool, "e", a[:12])) == 2  # 12 tokens: the last must be forwarded, so 2 blocks
    assert run(pool, "f", [1] + a[1:]) == []  # a different first token changes every key


def test_keys_cover_the_tokens_a_drafter_reads_past_a_block():
    """With reads_ahead 1 (EAGLE3: draft row t reads token t + 1) a block is shared only when the token
    after it matches too."""
    for reads_ahead, expected in ((0, 2), (1, 1)):
        pool = pool_with_cache(16, reads_ahead=reads_ahead)
        a = list(range(100, 114))
        run(pool, "a", a)
        b = a[:8] + [7] * 6  # the same first 2 blocks, another token after them
        assert len(run(pool, "b", b)) == expected, reads_ahead
        c = a[:9] + [7] * 5  # ... and the token after them the same
        assert len(run(pool, "c", c)) == 2


def test_only_settled_rows_are_published():
    pool = pool_with_cache(16)
    a = list(range(100, 114))
    run(pool, "a", a, settled=7)  # one full block settled
    assert len(run(pool, "b", a)) == 1


def test_shared_blocks_are_counted_once_and_return_when_the_last_holder_leaves():
    pool = pool_with_cache(8)
    a = list(range(100, 109))
    run(pool, "a", a)  # blocks of a published, idle
    for rid in ("x", "y"):
        pool.reuse(rid, pool.cached_blocks(rid, a, len(a) - 1))
        pool.grow(rid, len(a))
    held = set(pool.table("x")) | set(pool.table("y"))
    assert pool.table("x")[:2] == pool.table("y")[:2]
    assert pool.num_free + len(held) == 8
    pool.free("x")
    assert pool.num_free + len(set(pool.table("y"))) == 8
    pool.free("y")
    assert pool.num_free == 8


def test_eviction_takes_the_least_recently_used_idle_block_first():
    pool = pool_with_cache(4)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 5, 4, 3, 2, 1]
    run(pool, "a", a)  # 2 published blocks of a (3 held)
    run(pool, "b", b)  # needs 3 blocks: one of a's is evicted (its tail first)
    assert len(run(pool, "a2", a)) == 1
    run(pool, "c", [5] * 16)  # every block taken: nothing of a or b is left
    assert run(pool, "a3", a) == [] and run(pool, "b3", b) == []
    assert pool.num_free == 4


def test_a_pool_without_a_cache_shares_nothing():
    pool = BlockPool(8, 4)
    assert pool.cached_blocks("a", list(range(20)), 19) == []
    pool.publish("a", list(range(20)), 20)  # a no-op
    assert pool.num_free == 8


# ---- engines ------------------------------------------------------------------------------------------
SHARED = (
    7,
    8,
    9,
    15,
    16,
    17,
    23,
    24,
    25,
    40,
)  # shared prefix lengths: block edges of 8 and either side


@pytest.fixture(scope="module")
def shared_prompts():
    """Prompts of the zoo's eval set, each a prefix of one of them (of a length in SHARED) then another's text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET)
    texts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"]
    base = tok.encode(texts[16])
    others = texts[:16] + texts[17:]
    return [base[:49]] + [base[:n] + tok.encode(other)[:12] for other, n in zip(others, SHARED)]


def generate(spec: SpeculativeConfig, prompts, caching: bool):
    """Two waves: the prompts, then (as a chat's next turn) each of the first three with its output and more
    text: its blocks of generated rows were written by decode steps (their draft rows settled later)."""
    llm = LLM(TARGET, block_size=8, max_num_seqs=2, speculative=spec, enable_prefix_caching=caching)
    first = llm.generate(prompts, GREEDY)
    turns = [o.prompt_token_ids + o.token_ids + p[:5] for o, p in zip(first[:3], prompts[3:])]
    return llm, first + llm.generate(turns, GREEDY)


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_outputs_and_acceptance_are_those_of_the_cache_off(method, shared_prompts):
    spec = DRAFTERS[method]
    _, off = generate(spec, shared_prompts, caching=False)
    llm, on = generate(spec, shared_prompts, caching=True)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    stats = llm.engine.pool.prefix_cache.stats
    assert stats.hits >= 8 * 6 + 3 * 40, (
        stats
    )  # most prompts start from cached blocks, the next turns deep
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks
    if spec.enabled:  # every proposal as without the cache: the same drafts accepted at every step
        assert [o.spec_metrics.accepted_per_position for o in on] == [
            o.spec_metrics.accepted_per_position for o in off
        ]


def settled_rows(llm, request_id: str, num_rows: int) -> list:
    """Rows 0 .. num_rows - 1 of the request, in every cache of the pool (the target's, then the drafter's)."""
    pool = llm.engine.pool
    table = torch.tensor(pool.table(request_id))
    rows = torch.arange(num_rows)
    index = table[rows // pool.block_size] * pool.block_size + rows % pool.block_size
    return [t.flatten(0, 1)[index] for t in pool_cache_tensors(pool)]


@pytest.mark.parametrize("method", ["eagle3-chain", "mtp", "draft", "dflash"])
def test_a_hit_gives_the_drafter_the_kv_it_would_have_computed(method, shared_prompts):
    """A chat's next turn starts from blocks its first turn wrote while decoding: once its prompt is in, every
    settled row of the target's and the drafter's caches holds what the cache off computes (the drafter's
    last rows of a finished request are never settled, and a draft row reading the token after its block
    is keyed by it)."""
    spec = DRAFTERS[method]
    rows = {}
    for caching in (False, True):
        llm = LLM(
            TARGET, block_size=8, max_num_seqs=2, speculative=spec, enable_prefix_caching=caching
        )
        first = llm.generate(shared_prompts[:1], GREEDY)[0]
        turn = first.prompt_token_ids + first.token_ids + shared_prompts[3][:5]
        rid = llm.engine.add_request(turn, GREEDY)
        llm.engine.step()
        settled = len(turn) - llm.engine.proposer.unsettled_rows
        rows[caching] = settled_rows(llm, rid, settled)
        if caching:
            assert llm.engine.scheduler.running[0].num_computed_tokens == len(turn)
            assert llm.engine.pool.prefix_cache.stats.hits >= 64
    for off, on in zip(rows[False], rows[True]):
        torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-4)


def test_prompt_logprobs_are_complete_after_a_cached_prompt(llama_dir):
    llm = LLM(str(llama_dir), block_size=4)
    prompt = [(3 * j) % 200 for j in range(14)]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    first = llm.generate([prompt], params)[0]
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))  # cached, and hit
    again = llm.generate([prompt], params)[0]
    assert llm.engine.prefix_cache_stats.hits == 12
    assert len(again.prompt_logprobs) == len(prompt)
    assert [e and list(e) for e in again.prompt_logprobs] == [
        e and list(e) for e in first.prompt_logprobs
    ]


def test_hit_rate_counts_tokens_reused(llama_dir):
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    a = [(7 * j) % 200 for j in range(18)]
    llm.generate([a], params)  # 18 queried, none hit
    llm.generate([a[:13] + [1, 2]], params)  # 15 queried, 3 blocks hit
    llm.generate([a + [5]], params)  # 19 queried, 4 blocks hit (a's 5th block held its output)
    stats = llm.engine.pool.prefix_cache.stats
    assert (stats.queries, stats.hits) == (18 + 15 + 19, 12 + 16)
    assert stats.hit_rate == pytest.approx(28 / 52)


def test_cached_blocks_are_evicted_under_pressure_and_outputs_stay_right(llama_dir):
    """A pool of 16 blocks of 4: earlier requests' blocks are evicted for later ones (least recently used
    first), requests that hit idle blocks join a nearly full pool, and every output equals the cache off's."""
    prompts = [[(i * 13 + j * 7) % 200 for j in range(10 + i % 3)] for i in range(6)]
    prompts += [p[:9] + [1, 2] for p in prompts]  # each shares 2 blocks with an earlier prompt
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = [
        o.token_ids
        for o in LLM(str(llama_dir), block_size=4, enable_prefix_caching=False).generate(
            prompts, params
        )
    ]
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=16, max_num_seqs=3)
    outs = []
    for i in range(0, len(prompts), 3):  # three at a time: the pool holds little more
        outs += llm.generate(prompts[i : i + 3], params)
    assert [o.token_ids for o in outs] == expected
    pool = llm.engine.pool
    assert pool.num_free == 16 and pool.prefix_cache.num_idle == 16 - pool.num_empty
    assert pool.prefix_cache.stats.hits == 0  # the pool held nothing of a prompt three rounds back
    repeat = llm.generate(prompts[-3:], params)  # the most recent ones are still there
    assert [o.token_ids for o in repeat] == expected[-3:]
    assert pool.prefix_cache.stats.hits == 3 * 8


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.integers(1, 14),
            st.integers(1, 10),
            st.one_of(st.none(), st.integers(0, 8)),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_block_accounting_with_shared_blocks(llama_dir, requests, speculative):
    """Requests sharing prefixes (of 3 stems), finishing, aborted and preempted in a pool of 14 blocks of 4:
    at every step each block is free, idle or held, counted once however many tables share it; the tables
    hold as many entries as the blocks' reference counts; everything returns at the end."""
    llm = tight_cached_llm(llama_dir, speculative)
    engine, pool = llm.engine, llm.engine.pool
    blocks = range(1, pool.num_blocks + 1)

    def check() -> None:
        tables = [pool.table(r.request_id) for r in engine.scheduler.running]
        held = {b for t in tables for b in t}
        assert pool.num_free + len(held) == pool.num_blocks
        assert sum(map(len, tables)) == sum(pool.num_holders(b) for b in blocks)
        assert all(pool.num_holders(b) == 0 for b in blocks if pool.is_empty(b))
        assert not any(pool.is_empty(b) for b in held)
        assert engine.runner.req_table.held_by <= {r.request_id for r in engine.scheduler.running}

    run_with_aborts(
        engine,
        [
            ([(stem * 41 + j * 3) % 200 for j in range(plen)] + [i], *rest)
            for i, (stem, plen, *rest) in enumerate(requests)
        ],
        check,
    )
    assert pool.num_free == pool.num_blocks and not any(pool.num_holders(b) for b in blocks)
    assert not engine.runner.req_table.held_by and not pool.held_by


_tight = {}


def tight_cached_llm(llama_dir, speculative: bool):
    if speculative not in _tight:
        spec = (
            SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
            if speculative
            else SpeculativeConfig()
        )
        _tight[speculative] = LLM(
            str(llama_dir),
            block_size=4,
            num_kv_blocks=14,
            max_num_batched_tokens=16,
            speculative=spec,
        )
    return _tight[speculative]


def test_a_recurrent_draft_turns_prefix_caching_off_and_says_why(tmp_path):
    """A hybrid target keeps state checkpoints (tests/engine/test_hybrid_prefix_cache.py); a standalone draft with
    recurrent layers has none, so the cache is off, and demanding it is refused naming the draft."""
    from helpers.hybrid_models import make_hybrid, save_hybrid

    target = str(save_hybrid(make_hybrid("qwen3_5"), tmp_path / "target"))
    draft = str(save_hybrid(make_hybrid("qwen3_5"), tmp_path / "draft"))
    spec = SpeculativeConfig("draft", draft, num_steps=2)
    llm = LLM(target, block_size=4, speculative=spec)
    assert llm.engine.pool.prefix_cache is None
    assert f"the draft {draft} has recurrent layers" in llm.engine.prefix_caching_off_reason
    with pytest.raises(
        ConfigError, match="enable_prefix_caching=True is invalid: the draft .* recurrent layers"
    ):
        LLM(target, block_size=4, speculative=spec, enable_prefix_caching=True)
    metrics = ServerMetrics("m")
    metrics.watch_prefix_cache(lambda: llm.engine.prefix_cache_stats)
    assert 'outpace:prefix_cache_enabled{model_name="m"} 0.0' in metrics.render().decode()


def test_metrics_expose_the_hit_rate(llama_dir):
    from outpace.config import EngineConfig
    from outpace.server.async_engine import AsyncEngine

    metrics = ServerMetrics("m")
    engine = AsyncEngine(EngineConfig(model=str(llama_dir), block_size=4), metrics=metrics).engine
    prompt = [(5 * j) % 200 for j in range(9)]
    for _ in range(2):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=2))
        while engine.has_unfinished_requests:
            engine.step()
    text = metrics.render().decode()
    for line in (
        'outpace:prefix_cache_enabled{model_name="m"} 1.0',
        'outpace:prefix_cache_queries_total{model_name="m"} 18.0',
        'outpace:prefix_cache_hits_total{model_name="m"} 8.0',
        'outpace:prefix_cache_hit_rate{model_name="m"} 0.4444',
    ):
        assert line in text, text
