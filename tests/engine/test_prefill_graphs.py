"""A step's prefill chunks replayed through the forward captured for their count and token bucket
(engine/prefill_graphs.py).
On the CPU a replay runs the padded forward eagerly over the same static buffers, so the bucket choice,
the padding and everything read from the outputs are checked here; the GPU tests check the graphs."""

import json
from pathlib import Path

import pytest
import torch

from outpace import LLM, SamplingParams
from outpace.cache.kv_cache import bound_caches
from outpace.config import SpeculativeConfig
from outpace.engine.prefill_graphs import key_tokens, prefill_buckets

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SPECS = pytest.mark.parametrize(
    "spec",
    [
        None,
        SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=4),
        SpeculativeConfig(
            "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3, topk=2, num_draft_tokens=6
        ),
        SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7),
        SpeculativeConfig("mtp", num_steps=3),
        SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=4),
        SpeculativeConfig("ngram", num_steps=4),
    ],
    ids=["plain", "eagle3", "eagle3-tree", "dflash", "mtp", "draft", "ngram"],
)
# 32 tokens a step: a 40-token prompt is prefilled as a 32-token chunk, then an 8-token one (bucket 16)
ENGINE = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=32)


def test_buckets_are_powers_of_two_within_the_token_budget():
    assert prefill_buckets(2048) == (16, 32, 64, 128, 256, 512)
    assert prefill_buckets(100) == (16, 32, 64)
    assert prefill_buckets(8) == ()


def _prompts() -> list[str]:
    return json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:3]


def _counting_replays(llm: LLM) -> list[tuple[int, int]]:
    """The key (chunks, tokens a chunk) of every prefill forward that replayed one."""
    graphs, keys = llm.engine.runner.prefill_graphs, []
    run = graphs.run

    def counting(key, *args):
        keys.append(key)
        return run(key, *args)

    graphs.run = counting
    return keys


@SPECS
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lone_chunks_replay_a_bucket_and_change_no_token(spec, temperature):
    """Prompts one at a time, each in chunks of 32 tokens and a shorter last one, then the first prompt again
    (with prefix caching, only its uncached suffix): every prefill step replays a bucket, and so does every
    chunk's absorb; the tokens, acceptance and prompt log-probabilities equal those of an engine that runs every
    prefill and absorb eagerly."""
    spec = spec or SpeculativeConfig()
    eager, graphed = (
        LLM(str(ZOO / "tinypy"), speculative=spec, **ENGINE),
        LLM(str(ZOO / "tinypy"), speculative=spec, **ENGINE),
    )
    graphed.engine.capture_graphs()
    replays = _counting_replays(graphed)
    proposer, eager_starts = graphed.engine.runner.prefill_step.proposer, []
    if proposer is not None:
        absorb = proposer.absorb
        proposer.absorb = lambda rows: eager_starts.extend(rows.starts) or absorb(rows)
    tok = graphed.tokenizer
    prompts = [tok.encode(p)[-40:] for p in _prompts()]
    params = SamplingParams(
        temperature=temperature, max_tokens=8, seed=5, ignore_eos=True, prompt_logprobs=1
    )
    for prompt in prompts + prompts[:1]:
        want, got = eager.generate([prompt], params)[0], graphed.generate([prompt], params)[0]
        assert got.token_ids == want.token_ids
        if spec.enabled:
            assert got.spec_metrics.accepted_per_position == want.spec_metrics.accepted_per_position
        assert [list(row) for row in got.prompt_logprobs[1:]] == [
            list(row) for row in want.prompt_logprobs[1:]
        ]
        assert [
            e.logprob for row in got.prompt_logprobs[1:] for e in row.values()
        ] == pytest.approx(
            [e.logprob for row in want.prompt_logprobs[1:] for e in row.values()], abs=1e-4
        )
    assert (
        replays[:6] == [(1, 32), (1, 16)] * 3
    )  # the rest: the repeated prompt's suffix (a cache hit, when on)
    assert replays[6:] in ([(1, 16)], [(1, 32), (1, 16)])
    if proposer is not None and proposer.captures_absorb:
        # each prompt's 8-token chunk (row 32 on) follows one that ran whole (MTP's reads up to 2 tokens on)
        assert eager_starts == []
    engine = graphed.engine
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.runner.req_table.held_by


@SPECS
def test_several_chunks_replay_one_key_and_change_no_token(spec):
    """Six prompts through four indices with ragged output lengths: the first step prefills four chunks, and
    later requests join while others decode. Every prefill step replays one key, and the tokens, acceptance and
    prompt log-probabilities equal those of an engine that runs every prefill eagerly."""
    spec = spec or SpeculativeConfig()
    kw = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=256, speculative=spec)
    eager, graphed = LLM(str(ZOO / "tinypy"), **kw), LLM(str(ZOO / "tinypy"), **kw)
    graphed.engine.capture_graphs()
    replays = _counting_replays(graphed)
    prompts = [
        graphed.tokenizer.encode(p)[-40:]
        for p in json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:6]
    ]
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=8 + 5 * i,
            ignore_eos=True,
            prompt_logprobs=1 if i % 2 else None,
        )
        for i in range(6)
    ]
    want, got = eager.generate(prompts, params), graphed.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(
        got[1::2], want[1::2]
    ):  # each chunk's rows read back in order from the padded forward
        assert [list(row) for row in a.prompt_logprobs[1:]] == [
            list(row) for row in b.prompt_logprobs[1:]
        ]
        assert [e.logprob for row in a.prompt_logprobs[1:] for e in row.values()] == pytest.approx(
            [e.logprob for row in b.prompt_logprobs[1:] for e in row.values()], abs=1e-4
        )
    if spec.enabled:
        assert [o.spec_metrics.accepted_per_position for o in got] == [
            o.spec_metrics.accepted_per_position for o in want
        ]
    assert replays[0] == (4, 64) and len(replays) >= 2  # the first wave, then the joins
    engine = graphed.engine
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.runner.req_table.held_by


@SPECS
@pytest.mark.parametrize(
    "requests, prompts, shortest, key",
    [(16, 12, 6, (16, 16)), (32, 20, 18, (32, 32))],
    ids=["16x16", "32x32"],
)
def test_many_short_chunks_replay_one_key(spec, requests, prompts, shortest, key):
    """Many short prompts in one step (as a prefix cache leaves a burst of requests a few tokens each, or a block and
    an MTP's reads past it): past 8 chunks the step replays a key of 16 or 32 chunks, 32 chunks of 32 tokens past the
    512 a longer chunk's key holds, and the tokens and acceptance equal those of an eager engine."""
    spec = spec or SpeculativeConfig()
    kw = dict(device="cpu", max_num_seqs=requests, max_num_batched_tokens=1024, speculative=spec)
    eager, graphed = LLM(str(ZOO / "tinypy"), **kw), LLM(str(ZOO / "tinypy"), **kw)
    graphed.engine.capture_graphs()
    replays = _counting_replays(graphed)
    texts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"]
    ids = [
        graphed.tokenizer.encode(texts[i % len(texts)])[-(shortest + i % 5) :]
        for i in range(prompts)
    ]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want, got = eager.generate(ids, params), graphed.generate(ids, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    if spec.enabled:
        assert [o.spec_metrics.accepted_per_position for o in got] == [
            o.spec_metrics.accepted_per_position for o in want
        ]
    assert replays == [key]
    engine = graphed.engine
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.runner.req_table.held_by


def test_a_block_left_for_mtps_reads_past_it_takes_a_key_of_20_tokens_a_chunk():
    """MTP's three layers read three tokens past a block, so a prompt ending one token past a block boundary gets that
    block from the prefix cache no more (its key reads tokens not yet known) and prefills 17 tokens where the others
    prefill at most 14: the step replays chunks of 20 tokens (``READS_AHEAD_ROUNDING``), not 32, and the tokens and
    acceptance equal an eager engine's; plain decoding keeps its key of 16."""
    texts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"]
    kw = dict(device="cpu", max_num_seqs=32, max_num_batched_tokens=1024)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for spec, key in ((SpeculativeConfig("mtp", num_steps=3), (32, 20)), (None, (32, 16))):
        spec = spec or SpeculativeConfig()
        eager = LLM(str(ZOO / "tinypy"), speculative=spec, **kw)
        graphed = LLM(str(ZOO / "tinypy"), speculative=spec, **kw)
        graphed.engine.capture_graphs()
        encode = graphed.tokenizer.encode
        # 31 prompts ending 3 .. 14 tokens past a block boundary, one ending 1 token past one
        ids = [encode(texts[i % len(texts)] * 2)[: 35 + i % 12] for i in range(31)]
        ids.append(encode(texts[0] * 2)[:33])
        for llm in (eager, graphed):
            llm.generate(ids, params)  # (the prompts' blocks published)
        replays = _counting_replays(graphed)
        want, got = eager.generate(ids, params), graphed.generate(ids, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.spec_metrics.accepted_per_position for o in got] == [
            o.spec_metrics.accepted_per_position for o in want
        ]
        assert replays == [key], spec.method


def test_keys_past_the_largest_bucket_the_chunk_count_and_the_context_end_run_eagerly():
    llm = LLM(str(ZOO / "tinypy"), device="cpu", max_num_seqs=16, max_num_batched_tokens=2048)
    llm.engine.capture_graphs()
    graphs = llm.engine.runner.prefill_graphs
    assert graphs.buckets == (16, 32, 64, 128, 256, 512)
    assert graphs.bucket([1], [0]) == (1, 16) and graphs.bucket([100], [40]) == (1, 128)
    assert graphs.bucket([513], [0]) is None
    assert graphs.bucket([3, 40, 9], [0, 5, 0]) == (4, 64) and graphs.bucket([3] * 8, [0] * 8) == (
        8,
        16,
    )
    # up to the engine's 16 requests: 9 chunks take a key of 16 (16 x 16 tokens), 17 none
    assert graphs.bucket([3] * 9, [0] * 9) == (16, 16) and graphs.bucket([3] * 16, [0] * 16) == (
        16,
        16,
    )
    assert graphs.bucket([17] * 9, [0] * 9) == (16, 32) and graphs.bucket([33] * 9, [0] * 9) is None
    assert key_tokens(graphs.buckets, 16) == 512 and key_tokens(graphs.buckets, 32) == 1024
    assert graphs.bucket([3] * 17, [0] * 17) is None  # more chunks than the engine has requests
    assert graphs.bucket([200, 100, 10], [0] * 3) is None  # 4 chunks of 256 tokens: past 512
    assert graphs.bucket([10], [graphs.max_rows - 16]) == (1, 16)
    assert graphs.bucket([10, 10], [0, graphs.max_rows - 15]) is None
    replays = _counting_replays(llm)
    prompts = [
        llm.tokenizer.encode(p)[-40:]
        for p in json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:9]
    ]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4))  # one step prefills all nine
    assert replays == []


def test_mla_buckets_stop_below_the_expanded_form():
    """MLA expands its latents by gathering the whole block table from ``expand_min_query_len`` queries on (32
    for tinyds): a captured chunk's table is the row's full width, so only shorter buckets are captured, and a
    lone prompt's chunks replay them or prefill eagerly with the tokens an eager engine gives."""
    kw = dict(device="cpu", max_num_seqs=2, max_num_batched_tokens=64)
    graphed, eager = LLM(str(ZOO / "tinyds"), **kw), LLM(str(ZOO / "tinyds"), **kw)
    graphed.engine.capture_graphs()
    assert graphed.engine.runner.prefill_graphs.buckets == (16,)
    replays = _counting_replays(graphed)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for prompt in _prompts():
        ids = graphed.tokenizer.encode(prompt)[-30:]
        for chunk in (
            ids[:12],
            ids,
        ):  # 12 tokens (replayed), then 30 (eager, or after a cached block replayed)
            assert (
                graphed.generate([chunk], params)[0].token_ids
                == eager.generate([chunk], params)[0].token_ids
            )
    assert len(replays) >= 3 and set(replays) == {(1, 16)}


@pytest.mark.parametrize("target", ["tinyqwen35", "qwen3_next", "nemotron_h"])
def test_models_with_recurrent_layers_replay_their_chunks(target, tmp_path):
    """A hybrid's recurrent layers (gated DeltaNet; Nemotron-H's Mamba2) take each padded chunk's real length,
    so its padding leaves the request's state as it is: chunks replay (lone, several in a step, a prompt's
    second chunk continuing its state, one past the chunked scans' 64 tokens) and the tokens equal an eager
    engine's."""
    from helpers.hybrid_models import make_hybrid, save_hybrid

    path = ZOO / target if target.startswith("tiny") else save_hybrid(make_hybrid(target), tmp_path)
    # (no prefix caching: its chunks end at block boundaries, tests/engine/test_hybrid_prefix_cache.py)
    kw = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=128, enable_prefix_caching=False)
    graphed, eager = LLM(str(path), **kw), LLM(str(path), **kw)
    graphed.engine.capture_graphs()
    assert graphed.engine.runner.prefill_graphs.buckets == (16, 32, 64, 128)
    replays = _counting_replays(graphed)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ids = [(i * 37 + 5) % 120 for i in range(90)]
    for batch in ([ids[:5]], [ids[:30]], [ids], [ids[:3], ids[40:60], ids[7:18]]):
        got, want = graphed.generate(batch, params), eager.generate(batch, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert replays == [(1, 16), (1, 32), (1, 128), (4, 32)]
    engine = graphed.engine
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.runner.req_table.held_by
    kw["max_num_batched_tokens"] = 16  # 30 tokens: a chunk of 16, then one of 14 from the state
    graphed, eager = LLM(str(path), **kw), LLM(str(path), **kw)
    graphed.engine.capture_graphs()
    replays = _counting_replays(graphed)
    assert [o.token_ids for o in graphed.generate([ids[:30]], params)] == [
        o.token_ids for o in eager.generate([ids[:30]], params)
    ]
    assert replays == [(1, 16), (1, 16)]


def _mtp_rows_at_first_draft(llm: LLM, ids: list[int], rows: int):
    """(The greedy output of the lone prompt ``ids``, its MTP layers' cache rows 0 .. rows - 1 as its first draft
    finds them: each cache tensor's [rows, ...])."""
    engine, found = llm.engine, []
    draft = engine.proposer.draft

    def first(decode_rows, shape):
        if not found:
            table = engine.runner.req_table.host_tables[int(decode_rows.req_indices[0])]
            flat, size = torch.arange(rows), engine.pool.block_size
            at = (table[flat // size].long(), flat % size)
            caches = bound_caches(engine.proposer.target.mtp_layers)
            found.append([t[at].clone() for layer in caches for t in layer])
        return draft(decode_rows, shape)

    engine.proposer.draft = first
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    return out, found[0]


@pytest.mark.parametrize(
    "chain, budget, length, absorbs",
    [
        (False, 16, 40, (3, [])),
        (False, 520, 530, (1, [[520]])),
        (True, 16, 40, (3, [])),
        (True, 16, 33, (2, [[1]])),
        (True, 520, 530, (1, [[520]])),
    ],
)
@pytest.mark.parametrize("target", ["tinypy", "tinyds"])
def test_mtp_layers_absorb_later_chunks_as_captured(target, chain, budget, length, absorbs):
    """MTP layers run a chunk whole where the request holds every token they read past it
    (speculative/drafters/mtp.py), so a prompt's later chunks replay the captured absorb: one layer (the target's
    first, ``num_steps`` 1) or the whole chain (tinypy's 3, tinyds's 2), over chunks of 16 tokens, or a first
    chunk of 520 (past the largest bucket: forward and absorb eager) and a captured one of 10 (tinyds's MLA
    expands past 16 rows: its only bucket). A chain's chunk followed by at most K tokens (33 tokens: 16, 16 and
    1) leaves its last rows unrun, and the 1-token chunk takes them with it, eagerly. ``absorbs``: the captured
    absorbs replayed and the chunks absorbed eagerly. The layers' final cache rows of the prompt at the first
    draft (those before its pending window), the tokens and the acceptance equal those of an engine given the
    whole prompt as one eager chunk."""
    layers = (3 if target == "tinypy" else 2) if chain else 1
    kw = dict(device="cpu", max_num_seqs=2, speculative=SpeculativeConfig("mtp", num_steps=layers))
    whole = LLM(str(ZOO / target), max_num_batched_tokens=1024, **kw)
    ids = whole.tokenizer.encode(" ".join(_prompts()) * 8)[:length]
    final_rows = length - max(layers - 1, 1)
    want, want_rows = _mtp_rows_at_first_draft(whole, ids, final_rows)
    graphed = LLM(str(ZOO / target), max_num_batched_tokens=budget, **kw)
    graphed.engine.capture_graphs()
    graphs = graphed.engine.runner.prefill_graphs
    proposer, eager_absorbs = graphed.engine.runner.prefill_step.proposer, []
    absorb = proposer.absorb
    proposer.absorb = lambda rows: eager_absorbs.append(rows.counts) or absorb(rows)
    got, got_rows = _mtp_rows_at_first_draft(graphed, ids, final_rows)
    for a, b in zip(got_rows, want_rows):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert got.token_ids == want.token_ids
    assert got.spec_metrics.accepted_per_position == want.spec_metrics.accepted_per_position
    assert sum(got.spec_metrics.accepted_per_position) > 0
    replayed = sum(call.replays for call in graphs.absorbs.values())
    assert (replayed, eager_absorbs) == absorbs


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("target", ["tinyds", "tinyqwen35"])
def test_mtp_layers_absorb_inside_the_captured_prefill(target, together):
    """Two chained MTP layers (tinyds: MLA and routed experts; tinyqwen35: a hybrid's) run over a prompt's chunks
    as captured, replayed after the forward, a later chunk too (a step's budget of 16 tokens splits a 30-token
    prompt in two). Prompts one at a time, or several chunks in one step (with tinyqwen35,
    one of 40 tokens): the tokens and the acceptance at each draft position equal those of an engine that
    absorbs every chunk eagerly."""
    kw = dict(
        device="cpu",
        max_num_seqs=4,
        max_num_batched_tokens=64 if together else 16,
        speculative=SpeculativeConfig("mtp", num_steps=2),
        enable_prefix_caching=False,  # (a hybrid's would end the 40-token chunk at a block boundary)
    )
    eager, graphed = LLM(str(ZOO / target), **kw), LLM(str(ZOO / target), **kw)
    graphed.engine.capture_graphs()
    graphs = graphed.engine.runner.prefill_graphs
    assert graphs.absorbs and set(graphs.graphs) <= set(graphs.absorbs)
    proposer, eager_absorbs = graphed.engine.runner.prefill_step.proposer, []
    absorb = proposer.absorb
    proposer.absorb = lambda rows: eager_absorbs.append(rows.counts) or absorb(rows)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ids = graphed.tokenizer.encode(_prompts()[0])
    lengths = (5, 12, 40 if target == "tinyqwen35" else 16) if together else (5, 12, 16, 30)
    prompts = [ids[-n:] for n in lengths]
    batches = [prompts] if together else [[p] for p in prompts]
    for batch in batches:
        want, got = eager.generate(batch, params), graphed.generate(batch, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.spec_metrics.accepted_per_position for o in got] == [
            o.spec_metrics.accepted_per_position for o in want
        ]
    replayed = sum(call.replays for call in graphs.absorbs.values())
    assert (replayed, eager_absorbs) == ((1, []) if together else (5, []))
    engine = graphed.engine
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.runner.req_table.held_by
