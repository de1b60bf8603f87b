"""The start-up warm-up (engine/warm_up.py): the prefill chunks it runs, and an engine it leaves as it
found it (blocks, indices, drafter and recurrent state), so later requests get the tokens a fresh engine
gives. On the GPU the engine runs it at start-up; here it is called on CPU engines."""

import json
from pathlib import Path

import pytest
import torch
import triton

from outpace import LLM, SamplingParams
from outpace.attention import mla_kernels
from outpace.cache.block_pool import BlockPool
from outpace.config import SpeculativeConfig
from outpace.engine.warm_up import (
    LONGEST_WARM_CHUNK,
    LONGEST_WARM_QUERY,
    long_chunk_lengths,
    warm_query_lengths,
    warm_up_prefills,
    warm_up_steps,
)
from outpace.layers.moe_routing_kernel import logit_splits

ZOO = Path(__file__).resolve().parents[2] / "zoo"
ENGINE = dict(
    device="cpu", max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=96, block_size=16
)


def _engine(target: str, draft: str | None) -> LLM:
    """The target with its EAGLE3 draft, or (``draft`` None) its own MTP layers."""
    spec = (
        SpeculativeConfig("mtp", num_steps=2)
        if draft is None
        else SpeculativeConfig("eagle3", str(ZOO / draft), num_steps=3)
    )
    return LLM(str(ZOO / target), speculative=spec, **ENGINE)


@pytest.mark.parametrize(
    "target,draft",
    [("tinypy", "tinypy-eagle3"), ("tinyqwen35", "tinyqwen35-eagle3"), ("tinyds", None)],
)
def test_warm_up_leaves_the_engine_as_it_found_it(target, draft):
    warmed, fresh = _engine(target, draft), _engine(target, draft)
    engine = warmed.engine
    free_blocks, free_rows = engine.pool.num_free, engine.runner.req_table.num_free
    steps, execute = [], engine.runner.execute

    def recording(batch):
        steps.append([(s.num_reused_tokens, s.num_new_tokens) for s in batch])
        return execute(batch)

    engine.runner.execute = recording
    warm_up_prefills(engine.runner, engine.pool, 4, 256, engine.max_model_len)
    engine.runner.execute = execute
    # a chunk of every length class up to the longest tile (1 to 8, 15, 16, 31, 32, ...): alone after no
    # prefix and after prefixes of 16 to 1024 rows (the pool's 1536 rows hold no 2048-row one), then as a batch
    # within max_num_seqs and the batched-token budget
    expected = []
    for n in warm_query_lengths(LONGEST_WARM_QUERY):
        expected += [[(p, n)] for p in (0, 16, 32, 64, 128, 256, 512, 1024)]
        expected.append([(0, n)] * min(4, 256 // n))
    # longer chunks, up to the budget of 256 tokens, alone after no prefix and after one block
    expected += [[(p, n)] for n in (255, 256) for p in (0, 16)]
    # batches of one-token chunks after prefixes of 16 to 512 rows (four of 513 rows would need 132 of the 96
    # blocks)
    expected += [[(p, 1)] * 2 for p in (16, 32, 64, 128, 256, 512)]
    expected += [[(p, 1)] * 4 for p in (16, 32, 64, 128, 256)]
    assert steps == expected
    assert engine.pool.num_free == free_blocks and not engine.pool.held_by
    assert engine.runner.req_table.num_free == free_rows and not engine.runner.req_table.held_by
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:3]
    for params in (
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True, seed=3),
    ):
        got, want = warmed.generate(prompts, params), fresh.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.spec_metrics.num_accepted_drafts for o in got] == [
            o.spec_metrics.num_accepted_drafts for o in want
        ]


def test_warm_up_stops_at_what_the_pool_and_context_hold():
    llm = LLM(
        str(ZOO / "tinypy"),
        device="cpu",
        max_num_seqs=4,
        max_num_batched_tokens=256,
        num_kv_blocks=6,
        block_size=16,
    )
    steps, execute = [], llm.engine.runner.execute
    llm.engine.runner.execute = lambda batch: (
        steps.append([(s.num_reused_tokens, s.num_new_tokens) for s in batch]) or execute(batch)
    )
    warm_up_prefills(llm.engine.runner, llm.engine.pool, 4, 256, max_len=70)
    # 6 blocks of 16 rows in a context of 70: prefixes of 16, 32 and 64 rows where the chunk fits after them,
    # batches of up to four chunks within the 6 blocks; lengths end at 64 (127 > 70)
    chunks = [  # (length, its prefixes, its batch)
        *[(n, (0, 16, 32, 64), 4) for n in (1, 2, 3, 4, 5)],
        *[(n, (0, 16, 32), 4) for n in (6, 7, 8, 15, 16)],
        *[(n, (0, 16, 32), 3) for n in (31, 32)],
        (63, (0,), 1),
        (64, (0,), 1),
    ]
    expected = []
    for n, prefixes, batch in chunks:
        expected += [[(p, n)] for p in prefixes] + ([[(0, n)] * batch] if batch > 1 else [])
    # one-token chunks after a prefix: two of 17 or 33 rows (2 or 3 blocks each) fit the 6 blocks, no four
    expected += [[(16, 1)] * 2, [(32, 1)] * 2]
    assert steps == expected
    assert llm.engine.pool.num_free == 6


def _triton_class(tokens: int) -> tuple[int, bool, bool]:
    """What a launch over ``tokens`` rows compiles for: tiles from the next power of two, and the count as an
    integer argument, which Triton specialises as 1, a multiple of 16, or neither."""
    return triton.next_power_of_2(tokens), tokens == 1, tokens % 16 == 0


def test_warm_up_lengths_meet_every_length_class():
    # gpu_2026-12-01h calls 1 and 3: prompts of 38 to 113 tokens and their prefix-cache suffixes compiled MoE
    # routing, MLA merge and projection variants inside timed requests, the powers of two having met each tile
    # from 16 rows up only as a multiple of 16, and a drafter's rows (the chunk less up to 3 kept rows) only
    # some of the small powers of two
    lengths = warm_query_lengths(LONGEST_WARM_QUERY)
    warmed = {_triton_class(n) for n in lengths}
    missed = [n for n in range(1, LONGEST_WARM_QUERY + 1) if _triton_class(n) not in warmed]
    assert not missed, f"chunk lengths whose Triton variants the warm-up does not compile: {missed}"
    for kept in (1, 2, 3):
        buckets = {triton.next_power_of_2(n - kept) for n in lengths if n > kept}
        missed = [
            n
            for n in range(1, LONGEST_WARM_QUERY - kept + 1)
            if triton.next_power_of_2(n) not in buckets
        ]
        assert not missed, (
            f"a drafter keeping {kept} rows meets no warm-up chunk of {missed} rows' tiles"
        )


@pytest.mark.parametrize(
    "hidden,experts",
    [
        (64, 8),
        (2048, 64),
        (2048, 512),
        (7168, 256),
        (4096, 288),
    ],  # zoo, V2-Lite, Qwen3-Next, V3, Step-3.5
)
def test_warm_up_lengths_meet_every_routing_split(hidden, experts):
    # MoE routing's logit splits are the routing kernel's SPLITS (one compile each); they follow the token count
    # up to where one split remains: every count's must be one a warm-up chunk meets
    lengths = warm_query_lengths(LONGEST_WARM_QUERY) + long_chunk_lengths(LONGEST_WARM_CHUNK)
    warmed = {logit_splits(n, hidden, experts) for n in lengths}
    counts = [*range(1, LONGEST_WARM_CHUNK + 1), 8192, 65536]
    missed = [n for n in counts if logit_splits(n, hidden, experts) not in warmed]
    assert not missed, (
        f"token counts whose routing splits the warm-up does not compile: {missed[:20]}"
    )


def _mla_merge_variant(seqs: int, query_len: int, table_rows: int) -> tuple[int, int, int]:
    """The MLA merge's compile-time tiles (BLOCK_M, BLOCK_T, CHUNK: attention/mla_kernels.py) for a prefill step
    of ``seqs`` chunks of ``query_len`` tokens over block tables of ``table_rows`` rows, at DeepSeek-V2-Lite's
    shape (16 heads, W_UV's 128 rows, bf16) on an H200 (132 SMs)."""
    device = torch.device("cpu")
    block_m = mla_kernels.tile_rows(query_len, 16, False)
    tiles = -(-query_len * 16 // block_m)
    splits = mla_kernels.kv_splits(seqs * tiles, table_rows, 32, device)
    return (block_m, *mla_kernels._combine_launch(seqs * query_len, 16, 128, splits, False, device))


def test_warm_up_meets_every_mla_merge_of_one_token_chunks(monkeypatch):
    # A step of several one-token chunks, each a prefix-cache hit but its last token, has one token's heads a
    # tile and KV splits that follow its prefix: merge tiles that the lone chunks and the prefix-free batches
    # of the warm-up do not compile (BLOCK_T 1 with a CHUNK of 32 or 64 for four or more such chunks)
    monkeypatch.setattr(mla_kernels, "num_sms", lambda device: 132)
    pool, max_seqs = BlockPool(8192, 16), 32
    warmed = {
        _mla_merge_variant(
            len(lengths), max(lengths), pool.blocks_needed(prefix + max(lengths)) * 16
        )
        for lengths, _, prefix in warm_up_steps(pool, max_seqs, 4096, 8192)
    }
    missed = sorted(
        {
            (seqs, prefix)
            for seqs in range(1, max_seqs + 1)
            for prefix in range(0, 4097, 16)
            if _mla_merge_variant(seqs, 1, pool.blocks_needed(prefix + 1) * 16) not in warmed
        }
    )
    assert not missed, (
        f"(chunks, prefix rows) of one-token steps that compile in a request: {missed[:10]}"
    )
