"""Block and request-row accounting under any mix of finishing, aborted and preempted requests
(hypothesis)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.engine_fuzz import request_strategy, run_with_aborts
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

_llm_cache = {}


def tight_llm(llama_dir, speculative: bool):
    """A pool of 12 blocks of 4 tokens: a few requests already force preemption. With speculation
    (n-gram, 3 drafts) every decode step also reserves lookahead rows."""
    if speculative not in _llm_cache:
        spec = (
            SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
            if speculative
            else SpeculativeConfig()
        )
        _llm_cache[speculative] = LLM(
            str(llama_dir),
            block_size=4,
            num_kv_blocks=12,
            max_num_batched_tokens=16,
            speculative=spec,
        )
    return _llm_cache[speculative]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(request_strategy, min_size=1, max_size=6), st.booleans())
def test_free_blocks_return_to_initial(llama_dir, requests, speculative):
    llm = tight_llm(llama_dir, speculative)
    engine = llm.engine
    initial = engine.pool.num_free
    assert initial == engine.pool.num_blocks

    def check() -> None:
        in_use = sum(len(engine.pool.table(r.request_id)) for r in engine.scheduler.running)
        assert engine.pool.num_free + in_use == engine.pool.num_blocks
        # a request row (engine/request_table.py) only while running: none held for a waiting or gone request
        assert engine.runner.req_table.held_by <= {r.request_id for r in engine.scheduler.running}

    run_with_aborts(
        engine,
        [
            ([(i * 31 + j) % 200 for j in range(plen)], *rest)
            for i, (plen, *rest) in enumerate(requests)
        ],
        check,
    )
    assert engine.pool.num_free == initial
    assert not engine.runner.req_table.held_by
    assert engine.runner.req_table.num_free == engine.config.max_num_seqs


def test_preempted_requests_produce_the_same_tokens(llama_dir):
    prompts = [[(i * 17 + j) % 200 for j in range(6 + i)] for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    roomy = LLM(str(llama_dir), block_size=4, num_kv_blocks=256).generate(prompts, params)
    tight = LLM(str(llama_dir), block_size=4, num_kv_blocks=12)
    out = tight.generate(prompts, params)
    assert sum(o.metrics.num_preemptions for o in out) > 0, "the pool was meant to force preemption"
    assert [o.token_ids for o in out] == [o.token_ids for o in roomy]
    assert tight.engine.pool.num_free == 12
