"""GPU-only checks (skipped without CUDA): every zoo drafter stays lossless in fp32 on the GPU, with
CUDA graphs and the Triton attention backend (the defaults on CUDA) and eagerly with the torch backend."""

import json
import re
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SPECS = {
    "eagle3-chain": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5),
    "eagle3-tree": SpeculativeConfig(
        "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5, topk=4, num_draft_tokens=16
    ),
    "mtp": SpeculativeConfig("mtp", num_steps=3),
    "dflash": SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7),
    "draft": SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=5),
}


MODES = {"graphs-triton": {}, "eager-torch": {"cuda_graphs": False, "attention_backend": "torch"}}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("method", list(SPECS))
def test_zoo_drafters_lossless_fp32_on_gpu(method, mode):
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:8]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    kwargs = dict(
        device="cuda",
        dtype="float32",
        num_kv_blocks=64,
        max_num_batched_tokens=128,
        max_num_seqs=8,
        **MODES[mode],
    )
    expected = [o.token_ids for o in LLM(str(ZOO / "tinypy"), **kwargs).generate(prompts, params)]
    llm = LLM(str(ZOO / "tinypy"), speculative=SPECS[method], **kwargs)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.pool.num_free == 64


@pytest.mark.gpu
def test_graphed_decode_equals_eager_torch_backend_fp32():
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:8]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    kwargs = dict(device="cuda", dtype="float32", max_num_seqs=8)
    eager = LLM(
        str(ZOO / "tinypy"), cuda_graphs=False, attention_backend="torch", **kwargs
    ).generate(prompts, params)
    graphed = LLM(str(ZOO / "tinypy"), **kwargs)
    assert all(call.graph is not None for call in graphed.engine.runner.decode_step.graphs.values())
    assert [o.token_ids for o in graphed.generate(prompts, params)] == [o.token_ids for o in eager]


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("method", list(SPECS) + ["ngram"])
def test_every_decode_step_replays_a_captured_iteration(method, temperature):
    """Every drafter, greedy and sampled: each decode step is a graph replay, and (seeded) the tokens
    equal those of the same steps run eagerly (same code, same random keys)."""
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    params = [
        SamplingParams(temperature=temperature, max_tokens=48, seed=i, ignore_eos=True)
        for i in range(4)
    ]
    spec = SPECS.get(method, SpeculativeConfig("ngram", num_steps=4))
    kwargs = dict(device="cuda", dtype="float32", max_num_seqs=4, speculative=spec)
    llm = LLM(str(ZOO / "tinypy"), **kwargs)
    iteration = llm.engine.runner.decode_step
    assert all(call.graph is not None for call in iteration.graphs.values())
    replays, run = [], iteration.run
    iteration.run = lambda key, *args: replays.append(key in iteration.graphs) or run(key, *args)
    outs = llm.generate(prompts, params)
    assert len(replays) > 5 and all(replays)
    eager = LLM(str(ZOO / "tinypy"), cuda_graphs=False, **kwargs).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["plain", "eagle3-tree", "mtp"])
def test_steps_with_logits_features_replay_graphs_captured_on_first_use(method):
    """Requests with penalties, a logit bias, min_tokens or logprobs join a batch in flight: their steps are
    captured then (the warm-up over idle rows leaves the running requests' state as it was) and every decode
    step replays a graph; tokens equal the eager engine's, log-probabilities within 1e-4."""
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:6]
    params = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=24 + 4 * i, ignore_eos=True)
        for i in range(6)
    ]
    params[2] = params[2].replace(repetition_penalty=1.3, logprobs=2)
    params[3] = params[3].replace(logit_bias={5: 2.0}, min_tokens=8, frequency_penalty=0.5)
    params[5] = params[5].replace(logprobs=0)
    spec = SPECS.get(method)
    kwargs = dict(device="cuda", dtype="float32", max_num_seqs=4, speculative=spec)
    llm = LLM(str(ZOO / "tinypy"), **kwargs)
    iteration = llm.engine.runner.decode_step
    replays, run = [], iteration.run
    iteration.run = lambda key, *args: replays.append(key in iteration.graphs) or run(key, *args)
    outs = llm.generate(prompts, params)
    late = [call for key, call in iteration.graphs.items() if key.features.any]
    assert len(replays) > 5 and all(replays) and late
    assert all(call.graph is not None for call in late)
    eager = LLM(str(ZOO / "tinypy"), cuda_graphs=False, **kwargs).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]
    for got, want in zip(outs, eager):
        assert (got.logprobs is None) == (want.logprobs is None)
        for g, w in zip(got.logprobs or [], want.logprobs or []):
            assert list(g) == list(w)
            assert all(abs(g[t].logprob - w[t].logprob) < 1e-4 for t in w)
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["plain", "eagle3-tree", "mtp"])
def test_grammar_steps_replay_graphs_captured_on_first_use(method, caplog):
    """A batch holding grammar-constrained requests: every decode step replays graphs captured on first use (a
    zero-draft step's masks written before its launch, a drafting step's between its two parts), the
    constraints hold, and the tokens equal the eager engine's."""
    pytest.importorskip("xgrammar")
    from outpace.sampling_params import StructuredOutputsParams

    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True) for _ in range(4)]
    for i, regex in ((1, "[a-z]{2,9}"), (3, "(0|[1-9][0-9]{0,3})[.][0-9]{2}")):
        params[i] = params[i].replace(
            ignore_eos=False, structured_outputs=StructuredOutputsParams(regex=regex)
        )
    kwargs = dict(device="cuda", dtype="float32", max_num_seqs=4, speculative=SPECS.get(method))
    llm = LLM(str(ZOO / "tinypy"), **kwargs)
    iteration = llm.engine.runner.decode_step
    replays, run = [], iteration.run
    iteration.run = lambda key, *args: replays.append(key in iteration.graphs) or run(key, *args)
    outs = llm.generate(prompts, params)
    assert len(replays) > 5 and all(replays)
    assert re.fullmatch("[a-z]{2,9}", outs[1].text) and re.fullmatch(r"\d+\.\d\d", outs[3].text)
    assert "grammar refused" not in caplog.text
    eager = LLM(str(ZOO / "tinypy"), cuda_graphs=False, **kwargs).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["plain"] + list(SPECS))
def test_prefill_chunks_replay_captured_forwards(method):
    """Prompts one at a time (each prefill a lone chunk), chunked in 64-token steps, then the first again (a
    prefix-cache hit): every prefill forward replays a captured graph; then six short prompts through four
    slots (several chunks a step); the tokens in fp32 equal those of an engine without graphs
    (engine/prefill_graphs.py)."""
    tinypy = str(ZOO / "tinypy")
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    kwargs = dict(
        device="cuda",
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=64,
        speculative=SPECS.get(method, SpeculativeConfig()),
    )
    llm = LLM(tinypy, **kwargs)
    graphs = llm.engine.runner.prefill_graphs
    # (MTP's three layers read past a block: chunks of up to 18 tokens get keys of 20: prefill_graphs.py)
    assert graphs.buckets == ((16, 20, 32, 64) if method == "mtp" else (16, 32, 64)) and all(
        call.graph is not None for call in graphs.graphs.values()
    )
    keys, run = [], graphs.run
    graphs.run = lambda key, *args: keys.append(key) or run(key, *args)
    eager = LLM(tinypy, cuda_graphs=False, **kwargs)
    for prompt in prompts + prompts[:1]:
        assert (
            llm.generate([prompt], params)[0].token_ids
            == eager.generate([prompt], params)[0].token_ids
        )
    steps = sum(-(-len(llm.tokenizer.encode(p)) // 64) for p in prompts)
    assert len(keys) >= steps + 1 and {k for k, _ in keys} == {1}
    # several chunks a step: short prompts together, then joining while others decode
    short = [llm.tokenizer.encode(p)[-20:] for p in prompts + prompts[:2]]
    ragged = [params.replace(max_tokens=8 + 6 * i) for i in range(len(short))]
    assert [o.token_ids for o in llm.generate(short, ragged)] == [
        o.token_ids for o in eager.generate(short, ragged)
    ]
    assert max(k for k, _ in keys) > 1
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


ABSORBING = {  # drafters whose absorb is captured (engine/prefill_graphs.py), on a target of each kind
    "tinyds-mtp": ("tinyds", SpeculativeConfig("mtp", num_steps=2)),
    "tinyqwen35-mtp": ("tinyqwen35", SpeculativeConfig("mtp", num_steps=2)),
    "tinypy-eagle3": ("tinypy", SPECS["eagle3-chain"]),
    "tinypy-draft": ("tinypy", SPECS["draft"]),
    "tinypy-dflash": ("tinypy", SPECS["dflash"]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(ABSORBING))
def test_absorb_replays_inside_the_captured_prefill_fp32(case):
    """A drafter's prompt layers captured with each prefill key and replayed after the forward
    (engine/prefill_graphs.py; tinyds's two MTP layers: the MLA kernel, the grouped experts, the last layer's rows
    routed to none; tinyqwen35's: after a hybrid's forward; EAGLE3's layer; a standalone draft; DFlash's context
    rows): the tokens
    equal the plain target's, and the drafts accepted come within 5% of an engine's that runs every prefill and
    absorb eagerly (the padded rows may round differently)."""
    target, spec = ABSORBING[case]
    ids = list(range(7, 40))
    prompts = [ids[:5], ids[3:15], ids[10:26]]  # one step: 3 chunks in the key of 4 x 16 tokens
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    kw = dict(device="cuda", dtype="float32", max_num_seqs=4)
    plain = [o.token_ids for o in LLM(str(ZOO / target), **kw).generate(prompts, params)]
    eager = LLM(str(ZOO / target), speculative=spec, cuda_graphs=False, **kw).generate(
        prompts, params
    )
    llm = LLM(str(ZOO / target), speculative=spec, **kw)
    graphs = llm.engine.runner.prefill_graphs
    assert graphs.absorbs and all(call.graph is not None for call in graphs.absorbs.values())
    # the start-up's scratch prefills replayed some already
    warm_up = sum(call.replays for call in graphs.absorbs.values())
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == plain == [o.token_ids for o in eager]
    assert sum(call.replays for call in graphs.absorbs.values()) == warm_up + 1
    accepted = [
        sum(sum(o.spec_metrics.accepted_per_position) for o in outs) for outs in (got, eager)
    ]
    assert abs(accepted[0] - accepted[1]) <= 0.05 * accepted[1]


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["tinyqwen35", "nemotron_h"])
def test_hybrid_prefill_chunks_replay_captured_forwards_fp32(target, tmp_path):
    """A hybrid's prefill chunks replay a captured forward whose recurrent layers take each chunk's real length
    (engine/prefill_graphs.py): the DeltaNet / Mamba2 step kernels and per-token scans below 64 tokens,
    flash-linear-attention's chunked kernels in their batched form from 64 (a 90-token prompt in the key of
    128); lone, several in a step, a prompt's second chunk continuing its state; the tokens equal those of an
    engine without graphs."""
    from helpers.hybrid_models import make_hybrid, save_hybrid

    path = ZOO / target if target.startswith("tiny") else save_hybrid(make_hybrid(target), tmp_path)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ids = [(i * 37 + 5) % 120 for i in range(90)]
    for budget, batches in (
        (128, ([ids[:5]], [ids[:30]], [ids], [ids[:3], ids[40:60]])),
        (16, ([ids[:30]],)),
    ):
        kw = dict(
            device="cuda",
            dtype="float32",
            max_num_seqs=4,
            max_num_batched_tokens=budget,
            enable_prefix_caching=False,  # (its chunks end at block boundaries: the test below)
        )
        llm = LLM(str(path), **kw)
        graphs = llm.engine.runner.prefill_graphs
        assert graphs.buckets and all(call.graph is not None for call in graphs.graphs.values())
        keys, run = [], graphs.run
        graphs.run = lambda key, *args: keys.append(key) or run(key, *args)
        eager = LLM(str(path), cuda_graphs=False, **kw)
        for batch in batches:
            assert [o.token_ids for o in llm.generate(batch, params)] == [
                o.token_ids for o in eager.generate(batch, params)
            ]
        assert keys == (
            [(1, 16), (1, 32), (1, 128), (2, 32)] if budget == 128 else [(1, 16), (1, 16)]
        )


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["tinyqwen35", "nemotron_h"])
def test_hybrid_prefix_hits_give_the_tokens_of_the_cache_off_fp32(target, tmp_path):
    """Hybrid prefix caching on the GPU (tests/engine/test_hybrid_prefix_cache.py): prompts sharing a prefix, one
    at a time and then together, with captured prefill chunks and decode steps, plain and (tinyqwen35) with its MTP
    layers: the tokens of an engine with the cache off, and hits from the state checkpoints."""
    from helpers.hybrid_models import make_hybrid, save_hybrid

    path = ZOO / target if target.startswith("tiny") else save_hybrid(make_hybrid(target), tmp_path)
    text = [(i * 37 + 5) % 120 + 3 for i in range(90)]
    prompts = [text[:n] + [4 + i] for i, n in enumerate((90, 40, 90, 70, 17, 64))] + [text]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kw = dict(device="cuda", dtype="float32", max_num_seqs=4, max_num_batched_tokens=128)
    want = [
        o.token_ids
        for o in LLM(str(path), enable_prefix_caching=False, **kw).generate(prompts, params)
    ]
    specs = [SpeculativeConfig()] + (
        [SpeculativeConfig("mtp", num_steps=2)] if target == "tinyqwen35" else []
    )
    for spec in specs:
        llm = LLM(str(path), speculative=spec, **kw)
        assert [llm.generate([p], params)[0].token_ids for p in prompts] == want
        assert [o.token_ids for o in llm.generate(prompts, params)] == want
        assert llm.engine.prefix_cache_stats.hits >= 400, llm.engine.prefix_cache_stats
