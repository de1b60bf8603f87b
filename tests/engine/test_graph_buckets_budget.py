"""The captured decode buckets stop at the largest batch a decode step can ever hold (engine/cuda_graphs.py
``largest_decode_batch``): the token budget over the tokens a decoding request costs, or, for a step run ahead,
the budget less the decoding requests' extra tokens (requests whose prefill completed join it at one token or
more each); a hybrid's batches after a step run ahead are bounded by max_num_seqs alone (``RunAhead.reconcile``
decodes them past the budget). Before, every engine captured buckets up to max_num_seqs, and the memory plan
sized the KV pool for them. Explicit ``cuda_graph_sizes`` above the bound are dropped with a warning, as vLLM
does. Every engine here runs on the CPU, where a "replay" re-runs the captured step eagerly."""

import logging
from types import SimpleNamespace

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.engine.cuda_graphs import batch_buckets, bucket_for, largest_decode_batch
from outpace.engine.start_up import _graph_tokens

TINYPY, HYBRID = "zoo/tinypy", "zoo/tinyqwen35"


def test_the_largest_bucket_is_the_largest_decode_batch():
    # no speculation: the budget, run ahead or not; a hybrid running ahead: max_num_seqs
    assert largest_decode_batch(64, 32, 1, run_ahead=False, recurrent=False) == 32
    assert largest_decode_batch(64, 32, 1, run_ahead=True, recurrent=False) == 32
    assert largest_decode_batch(64, 32, 1, run_ahead=False, recurrent=True) == 32
    assert largest_decode_batch(64, 32, 1, run_ahead=True, recurrent=True) == 64
    # 6 tokens a decoding request: 32 // 6 scheduled; a step run ahead also holds the joining requests
    assert largest_decode_batch(64, 32, 6, run_ahead=False, recurrent=False) == 5
    assert largest_decode_batch(64, 32, 6, run_ahead=True, recurrent=False) == 27
    assert largest_decode_batch(64, 32, 6, run_ahead=True, recurrent=True) == 64
    assert largest_decode_batch(4, 2048, 6, run_ahead=False, recurrent=False) == 4
    assert batch_buckets(64, None, 32) == (1, 2, 4, 8, 16, 32)
    assert batch_buckets(64, None, 27) == (1, 2, 4, 8, 16, 27)
    assert batch_buckets(64, (4, 32, 48, 64), 32) == (4, 32)
    assert batch_buckets(64, (48,), 32) == ()


def test_the_memory_plan_sizes_for_the_largest_decode_batch():
    """``_graph_tokens``: the largest captured forward's tokens, a decode step's (bucket times tokens a request) or
    a prefill key's (1024 here); before, 512 requests times 4 tokens for every engine."""
    config = SimpleNamespace(
        device="cuda",
        cuda_graphs=True,
        max_num_seqs=512,
        max_num_batched_tokens=256,
        cuda_graph_sizes=None,
        run_ahead=True,
    )
    assert (
        _graph_tokens(config, 4, recurrent=False) == 1024
    )  # 253 requests of 4: under the prefill's 1024
    assert _graph_tokens(config, 4, recurrent=True) == 2048  # a hybrid's: 512 of 4
    config.run_ahead = False
    assert _graph_tokens(config, 4, recurrent=True) == 1024  # 64 of 4
    config.run_ahead, config.cuda_graph_sizes = True, (300, 512)
    assert _graph_tokens(config, 4, recurrent=False) == 1024  # every size dropped: none captured


def _decode_sizes(llm: LLM) -> list[int]:
    """The request counts of every decode step launched from now on (run ahead or not)."""
    runner, sizes = llm.engine.runner, []
    launch = runner._launch

    def recording(reqs, ahead=False):
        sizes.append(len(reqs))
        return launch(reqs, ahead)

    runner._launch = recording
    return sizes


def test_buckets_stop_at_the_token_budget_and_full_concurrency_keeps_its_tokens():
    """max_num_seqs 64 under a 32-token budget: no decode step holds more than 32 requests, so none past 32 is
    captured; 64 requests at once decode 32 at a time, each step in a bucket, with greedy decoding's tokens."""
    prompts = [[3 + 3 * i] for i in range(64)]  # 32 join a step, then decode 32 at a time
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm = LLM(TINYPY, device="cpu", max_num_seqs=64, max_num_batched_tokens=32, num_kv_blocks=48)
    expected = [
        o.token_ids for o in llm.generate(prompts, params)
    ]  # (every step eager: nothing captured yet)
    llm.engine.capture_graphs()
    runner = llm.engine.runner
    assert runner.graph_buckets == (1, 2, 4, 8, 16, 32)
    assert max(key.bucket for key in runner.decode_step.graphs) == 32
    sizes = _decode_sizes(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert max(sizes) == 32 and all(bucket_for(runner.graph_buckets, n) for n in sizes)
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


TREE = dict(method="eagle3", num_steps=3, topk=2, num_draft_tokens=6)  # 6 tokens a decoding request
# one long prompt, then one-token prompts that join while the first requests decode
STAGGERED = [list(range(3, 17))] + [[20 + i] for i in range(23)]


def _tree_engine(model: str, max_num_seqs: int, **kw) -> LLM:
    tree = SpeculativeConfig(draft=f"{model}-eagle3", **TREE)
    llm = LLM(
        model,
        device="cpu",
        dtype="float32",
        speculative=tree,
        block_size=16,
        max_num_batched_tokens=16,
        max_num_seqs=max_num_seqs,
        **kw,
    )
    llm.engine.capture_graphs()
    return llm


def test_speculation_widths_and_steps_run_ahead_of_a_dense_target():
    """6 tokens a decoding request under a 16-token budget: 2 decode a step, but a step run ahead also holds the
    requests whose one-token prefill completed beside them (up to 16 - 6 + 1 = 11): those are captured, and the
    step ahead launches for them (the requests the next batch leaves out get their state back) with plain
    decoding's tokens. Without running ahead, nothing past 2 is captured."""
    assert _tree_engine(TINYPY, 12, run_ahead=False).engine.runner.graph_buckets == (1, 2)
    prompts, params = STAGGERED[:12], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [
        o.token_ids for o in LLM(TINYPY, device="cpu", dtype="float32").generate(prompts, params)
    ]
    llm = _tree_engine(TINYPY, 12)
    runner = llm.engine.runner
    assert runner.graph_buckets == (1, 2, 4, 8, 11)
    sizes = _decode_sizes(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert max(sizes) > 2 and all(bucket_for(runner.graph_buckets, n) for n in sizes)


def test_a_hybrid_running_ahead_keeps_buckets_up_to_max_num_seqs():
    """A hybrid's batch after a step run ahead decodes every request that step ran for, the budget or not, and
    the requests that joined meanwhile run ahead with them: here 6-token decodes under a 16-token budget grow to
    more than 16 requests a step, so its buckets go up to max_num_seqs (capped at the budget, the larger steps
    would not run ahead); every request keeps plain decoding's tokens."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = LLM(HYBRID, device="cpu", dtype="float32")
    expected = [o.token_ids for o in reference.generate(STAGGERED, params)]
    llm = _tree_engine(HYBRID, 24)
    runner = llm.engine.runner
    assert runner.has_recurrent_state and runner.graph_buckets == (1, 2, 4, 8, 16, 24)
    sizes = _decode_sizes(llm)
    assert [o.token_ids for o in llm.generate(STAGGERED, params)] == expected
    assert max(sizes) > 16 and all(bucket_for(runner.graph_buckets, n) for n in sizes)
    assert _tree_engine(HYBRID, 24, run_ahead=False).engine.runner.graph_buckets == (1, 2)


def test_cuda_graph_sizes_past_the_largest_decode_batch_are_dropped_with_a_warning(caplog):
    """As vLLM drops capture sizes above max_num_batched_tokens with a warning (``VllmConfig._set_cudagraph_sizes``):
    the sizes no decode step can reach are not captured; with none left every decode step runs eagerly, with the
    same tokens."""
    prompts = [[(5 * i) % 200 + 3, 9] for i in range(40)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    kw = dict(device="cpu", max_num_seqs=64, max_num_batched_tokens=32, num_kv_blocks=48)
    llm = LLM(TINYPY, cuda_graph_sizes=(4, 32, 48, 64), **kw)
    with caplog.at_level(logging.WARNING, logger="outpace.engine"):
        llm.engine.capture_graphs()
    assert llm.engine.runner.graph_buckets == (4, 32)
    assert "EngineConfig.cuda_graph_sizes [4, 32, 48, 64]" in caplog.text
    assert "no decode step holds more than 32 requests" in caplog.text
    assert "sizes [48, 64] are not captured; captured: [4, 32]" in caplog.text
    caplog.clear()
    llm = LLM(TINYPY, cuda_graph_sizes=(48,), **kw)
    expected = [o.token_ids for o in llm.generate(prompts, params)]  # (before any capture)
    with caplog.at_level(logging.WARNING, logger="outpace.engine"):
        llm.engine.capture_graphs()
    assert llm.engine.runner.graph_buckets == () and not llm.engine.runner.decode_step.graphs
    assert "sizes [48] are not captured; every decode step runs eagerly" in caplog.text
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected


@pytest.mark.parametrize("sizes", [None, (2, 8)])
def test_buckets_within_the_bound_are_kept_without_a_warning(sizes, caplog):
    llm = LLM(
        TINYPY, device="cpu", max_num_seqs=8, max_num_batched_tokens=32, cuda_graph_sizes=sizes
    )
    with caplog.at_level(logging.WARNING, logger="outpace.engine"):
        llm.engine.capture_graphs()
    assert llm.engine.runner.graph_buckets == (sizes or (1, 2, 4, 8))
    assert "cuda_graph_sizes" not in caplog.text
