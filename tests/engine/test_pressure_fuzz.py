"""The engine under pressure, driven as a user would: pools too small to serve, request ids chosen by the caller
beside the engine's own, every drafter over a small pool with shared prefixes, aborts and mixed sampling."""

from __future__ import annotations

from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TINYPY = str(ZOO / "tinypy")


@pytest.mark.parametrize(
    "block_size, num_kv_blocks, spec, holds",
    [
        (1, 1, SpeculativeConfig(), 1),
        (4, 1, SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3), 0),
        (4, 2, SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7), 0),
    ],
)
def test_a_kv_pool_that_holds_no_request_is_refused_naming_num_kv_blocks(
    block_size, num_kv_blocks, spec, holds
):
    """A fixed pool whose rows, less those a request's drafts reserve, hold fewer than a prompt token and one
    generated token cannot serve any request; it used to start, report a context of -4 tokens and refuse every
    prompt with "at most -5 prompt tokens leave room to generate"."""
    with pytest.raises(
        ConfigError,
        match=rf"EngineConfig.num_kv_blocks={num_kv_blocks} is invalid: the KV cache "
        rf"\({num_kv_blocks} blocks of {block_size}\) holds {holds} tokens? for a request",
    ):
        LLM(
            TINYPY,
            device="cpu",
            dtype="float32",
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            speculative=spec,
        )


def test_the_smallest_pool_that_holds_a_request_serves_it():
    llm = LLM(TINYPY, device="cpu", dtype="float32", block_size=1, num_kv_blocks=2)
    out = llm.generate([[5]], SamplingParams(temperature=0, max_tokens=1))[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    assert llm.engine.pool.num_free == 2


@pytest.fixture(scope="module")
def plain():
    return LLM(TINYPY, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=4)


def _drain(engine) -> list:
    """Step ``engine`` until no request is left; the outputs of those that finished."""
    outs = []
    while engine.has_unfinished_requests:
        outs += [o for o in engine.step() if o.finished]
    return outs


def test_engine_request_ids_skip_ids_the_caller_took(plain):
    """A request added without an id gets one no request in the engine holds: a caller's own id that looks like
    the engine's next one ("req-N") used to make the request fail ("request id 'req-N' is already in use")."""
    engine = plain.engine
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first = engine.add_request([4, 5], params)
    taken = [f"req-{int(first.removeprefix('req-')) + i}" for i in range(1, 4)]
    for rid in taken:
        engine.add_request([1, 2, 3], params, request_id=rid)
    own = engine.add_request([4, 5], params)
    assert own not in taken + [first]
    outs = _drain(engine)
    assert sorted(o.request_id for o in outs) == sorted(taken + [first, own])
    assert all(o.finish_reason == "length" and len(o.token_ids) == 3 for o in outs)
    assert engine.pool.num_free == engine.pool.num_blocks


def test_generate_returns_its_own_prompts_beside_requests_already_in_the_engine(plain):
    """LLM.generate while the engine serves other requests (added through the engine, or left by a generate that
    raised): it returns its own prompts' outputs, each once it has finished. It used to count every finished
    output, the others' too, and stop before its own had finished (KeyError)."""
    engine = plain.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = [o.token_ids for o in plain.generate([[4, 5], [6]], params)]
    others = [
        engine.add_request([7, 8, 9], SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
        for m in (1, 2)
    ]
    outs = plain.generate([[4, 5], [6]], params)
    assert [o.token_ids for o in outs] == expected
    assert all(o.request_id not in others for o in outs)
    _drain(engine)
    assert engine.pool.num_free == engine.pool.num_blocks


PRESSURE = {
    "eagle3-tree": (
        "tinypy",
        SpeculativeConfig(
            "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3, topk=2, num_draft_tokens=6
        ),
    ),
    "dflash": ("tinypy", SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7)),
    "mtp-deepseek": ("tinyds", SpeculativeConfig("mtp", num_steps=3)),
    "mtp-qwen35": ("tinyqwen35", SpeculativeConfig("mtp")),
}


@pytest.mark.parametrize("name", list(PRESSURE))
def test_a_small_pool_serves_shared_prefixes_aborts_and_full_contexts_losslessly(name):
    """12 blocks of 4 rows for 6 requests (a shared system prompt, one prompt 3 tokens short of the context,
    greedy and seeded ones, one aborted mid-flight) with every kind of drafter (the hybrid's state checkpoints
    too): preemption comes, no request fails, greedy outputs are plain decoding's, a seeded request's are its
    own alone, and every block, request row and checkpoint slot comes back."""
    model, spec = PRESSURE[name]
    kwargs = dict(device="cpu", dtype="float32", block_size=4, max_num_seqs=4)
    llm = LLM(
        str(ZOO / model), **kwargs, num_kv_blocks=12, max_num_batched_tokens=16, speculative=spec
    )
    engine = llm.engine
    system, size = [7, 300, 41, 2048, 9, 15, 4095, 600], engine.max_model_len
    prompts = [system + [20 + i] * (i + 1) for i in range(4)] + [system[:3], list(range(size - 3))]
    params = [
        SamplingParams(temperature=t, max_tokens=m, seed=i, ignore_eos=True)
        for i, (t, m) in enumerate([(0, 16), (1.0, 14), (0, 16), (0.8, 12), (0, 8), (0, 3)])
    ]
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    outs, steps = {}, 0
    while engine.has_unfinished_requests:
        if steps == 2:
            outs[ids[3]] = engine.abort_request(ids[3])
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
        steps += 1
    done = [outs[i] for i in ids]
    assert sum(o.metrics.num_preemptions for o in done) > 0, (
        "the pool was meant to force preemption"
    )
    assert [o.finish_reason for o in done] == ["length"] * 3 + ["abort"] + ["length"] * 2
    plain = LLM(str(ZOO / model), **kwargs, num_kv_blocks=64, enable_prefix_caching=False)
    for i in (0, 2, 4, 5):
        assert done[i].token_ids == plain.generate([prompts[i]], params[i])[0].token_ids
    assert done[1].token_ids == llm.generate([prompts[1]], params[1])[0].token_ids
    assert engine.pool.num_free == engine.pool.num_blocks
    assert not engine.runner.req_table.held_by and engine.runner.req_table.num_free == 4
    checkpoints = engine.scheduler.checkpoints
    assert checkpoints is None or not checkpoints._pending
