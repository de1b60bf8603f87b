"""Prefix caching for hybrid targets (cache/state_checkpoints.py, engine/scheduler.py): a request starts from
cached KV blocks and the recurrent state saved where they end, and gets the tokens it gets without the cache;
prompt chunks end at their last block boundary; checkpoint slots are reused least recently used first, and a
failed step's saves are never looked up."""

from pathlib import Path

import pytest
import torch

from helpers.hybrid_models import make_hybrid, save_hybrid
from outpace import LLM, SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.cache.prefix_cache import PrefixCache
from outpace.cache.state_checkpoints import StateCheckpoints
from outpace.config import SpeculativeConfig
from outpace.engine.scheduler import Scheduler
from outpace.request import Request
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=3)


def shared_prefix_prompts(vocab: int) -> list[list[int]]:
    """Prompts over one 37-token text: cut at many lengths (on and off 4-token block boundaries), each with a
    tail of its own, then the text itself, twice."""
    text = [(7 * j) % (vocab - 10) + 3 for j in range(37)]
    cuts = [37, 21, 37, 33, 8, 36, 5]
    return [text[:n] + [5 + i, 9] for i, n in enumerate(cuts)] + [text, text]


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next", "nemotron_h"])
def hybrid_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    return save_hybrid(make_hybrid(request.param), tmp_path_factory.mktemp(request.param))


def one_by_one(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Each prompt generated alone, in order: each may hit what the ones before it left."""
    return [llm.generate([p], params)[0].token_ids for p in prompts]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_hybrid_prefix_hits_give_the_tokens_of_the_cache_off(hybrid_dir, params):
    prompts = shared_prefix_prompts(131)
    kwargs = dict(block_size=4, max_num_batched_tokens=64, dtype="float32")
    off = LLM(str(hybrid_dir), enable_prefix_caching=False, **kwargs)
    want = one_by_one(off, prompts, params)
    on = LLM(str(hybrid_dir), **kwargs)
    assert on.engine.prefix_caching_off_reason is None
    assert one_by_one(on, prompts, params) == want
    stats = on.engine.prefix_cache_stats
    assert stats.hits >= 100, (
        stats
    )  # every prompt after the first shares 4 blocks or more with one before
    pool = on.engine.pool
    assert pool.num_free == pool.num_blocks and not on.engine.runner.req_table.held_by


def test_a_batch_sharing_a_prefix_gives_the_tokens_of_the_cache_off(hybrid_dir):
    """Prompts arriving together: the first to leave a checkpoint serves the later ones of the same batch."""
    prompts = shared_prefix_prompts(131)
    kwargs = dict(block_size=4, max_num_batched_tokens=48, max_num_seqs=3, dtype="float32")
    want = LLM(str(hybrid_dir), enable_prefix_caching=False, **kwargs).generate(prompts, GREEDY)
    on = LLM(str(hybrid_dir), **kwargs)
    got = on.generate(prompts, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert on.engine.prefix_cache_stats.hits > 0


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig("mtp", num_steps=2),
        SpeculativeConfig("eagle3", str(ZOO / "tinyqwen35-eagle3"), num_steps=3),
        SpeculativeConfig(
            "eagle3", str(ZOO / "tinyqwen35-eagle3"), num_steps=3, topk=2, num_draft_tokens=6
        ),
        SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    ],
    ids=["mtp", "eagle3-chain", "eagle3-tree", "ngram"],
)
def test_hybrid_prefix_caching_with_drafters_is_lossless(spec):
    """The zoo's tinyqwen35 with its drafters: the cache on gives the tokens of the target alone, cache off."""
    prompts = shared_prefix_prompts(200)
    kwargs = dict(block_size=4, max_num_batched_tokens=64, dtype="float32")
    want = one_by_one(
        LLM(str(ZOO / "tinyqwen35"), enable_prefix_caching=False, **kwargs), prompts, GREEDY
    )
    on = LLM(str(ZOO / "tinyqwen35"), speculative=spec, **kwargs)
    assert one_by_one(on, prompts, GREEDY) == want
    assert on.engine.prefix_cache_stats.hits > 0


def test_preempted_hybrid_requests_resume_from_checkpoints(hybrid_dir):
    """A pool too small for the batch: requests are preempted and recomputed, from checkpoints where they hit."""
    prompts = shared_prefix_prompts(131)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kwargs = dict(block_size=4, num_kv_blocks=30, max_num_batched_tokens=32, dtype="float32")
    want = LLM(str(hybrid_dir), enable_prefix_caching=False, **kwargs).generate(prompts, params)
    on = LLM(str(hybrid_dir), **kwargs)
    got = on.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics.num_preemptions for o in got) > 0
    pool = on.engine.pool
    assert pool.num_free == pool.num_blocks and not on.engine.runner.req_table.held_by


def test_one_checkpoint_slot_serves_the_latest_prefix(hybrid_dir):
    """With a single slot each prefix evicts the one before: later prompts hit only the newest, and outputs
    stay those of the cache off."""
    prompts = shared_prefix_prompts(131)
    kwargs = dict(block_size=4, max_num_batched_tokens=64, dtype="float32")
    want = one_by_one(LLM(str(hybrid_dir), enable_prefix_caching=False, **kwargs), prompts, GREEDY)
    on = LLM(str(hybrid_dir), num_state_checkpoints=1, **kwargs)
    assert one_by_one(on, prompts, GREEDY) == want
    assert on.engine.scheduler.checkpoints.num_confirmed == 1


def test_no_state_checkpoints_turn_hybrid_prefix_caching_off(tmp_path):
    path = str(save_hybrid(make_hybrid("qwen3_5"), tmp_path / "qwen3_5"))
    llm = LLM(path, block_size=4, num_state_checkpoints=0)
    assert llm.engine.pool.prefix_cache is None
    assert "num_state_checkpoints is 0" in llm.engine.prefix_caching_off_reason
    with pytest.raises(
        ConfigError, match="enable_prefix_caching=True is invalid: .*num_state_checkpoints"
    ):
        LLM(path, block_size=4, num_state_checkpoints=0, enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="num_state_checkpoints"):
        LLM(path, num_state_checkpoints=-1)


def test_state_checkpoints_for_a_target_without_recurrent_layers_are_refused_by_name():
    """--num-state-checkpoints N on a dense target allocated nothing and was silently dropped."""
    with pytest.raises(
        ConfigError,
        match=r"^EngineConfig.num_state_checkpoints=2 \(--num-state-checkpoints\) is invalid: .*tinypy has no "
        "recurrent layers",
    ):
        LLM(str(ZOO / "tinypy"), num_state_checkpoints=2)
    assert LLM(str(ZOO / "tinypy"), num_state_checkpoints=0).engine.pool.prefix_cache is not None


def test_the_batch_invariant_mode_turns_hybrid_prefix_caching_off(tmp_path):
    """Cut at a checkpoint, a hybrid prompt's prefill has other bits; where it is cut depends on the drafter
    (MTP's log-probabilities left plain decoding's on the GPU, benchmarks/results/gpu_2026-12-07b)."""
    path = str(save_hybrid(make_hybrid("qwen3_5"), tmp_path / "qwen3_5"))
    llm = LLM(path, block_size=4, batch_invariant=True)
    assert llm.engine.pool.prefix_cache is None
    assert "batch_invariant" in llm.engine.prefix_caching_off_reason
    with pytest.raises(
        ConfigError, match="enable_prefix_caching=True is invalid: .*batch_invariant"
    ):
        LLM(path, block_size=4, batch_invariant=True, enable_prefix_caching=True)


# ---- the scheduler and the index alone --------------------------------------------------------------------
def checkpointing_scheduler(num_slots: int = 2, budget: int = 64) -> Scheduler:
    pool = BlockPool(64, 4, PrefixCache(4))
    return Scheduler(pool, 4, budget, checkpoints=StateCheckpoints(num_slots))


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def test_a_prompt_chunk_ends_at_its_last_boundary_and_saves_there():
    sched = checkpointing_scheduler()
    sched.add(request("a", list(range(37))))
    [first] = sched.schedule()
    assert (first.num_new_tokens, first.save_checkpoint) == (
        36,
        0,
    )  # 36: the last boundary before token 36
    first.request.num_computed_tokens += first.num_new_tokens
    sched.settle(first.request)
    [tail] = sched.schedule()
    assert (tail.num_new_tokens, tail.save_checkpoint) == (1, None)
    keys = sched.pool.prefix_cache.keys("a", list(range(37)), 9)
    assert sched.checkpoints.lookup(keys[-1]) == 0 and sched.checkpoints.lookup(keys[-2]) is None


def test_a_joining_request_hits_only_up_to_a_checkpoint():
    sched = checkpointing_scheduler()
    tokens = list(range(37))
    sched.add(request("a", tokens))
    [first] = sched.schedule()
    first.request.num_computed_tokens += first.num_new_tokens
    sched.settle(first.request)  # blocks 0 .. 8 published, a checkpoint at 36
    sched.add(
        request("b", tokens[:30] + [99, 98, 97])
    )  # shares 7 blocks, none of them checkpointed
    sched.add(request("c", tokens + [5, 6]))  # shares all 9
    chunks = {s.request.request_id: s for s in sched.schedule()}
    assert (chunks["b"].num_reused_tokens, chunks["b"].load_checkpoint) == (0, None)
    assert (chunks["c"].num_reused_tokens, chunks["c"].load_checkpoint) == (36, 0)


def run_chunk(sched: Scheduler, chunk) -> None:
    """The chunk's step ran: its tokens computed, its request settled (blocks published, checkpoint confirmed)."""
    chunk.request.num_computed_tokens += chunk.num_new_tokens
    sched.settle(chunk.request)


def test_a_chunk_ends_where_its_tokens_leave_the_published_blocks():
    """A shared system prompt: the second request to share it saves a checkpoint where its tokens leave the
    first's blocks, and the third starts there."""
    sched = checkpointing_scheduler()
    system = list(range(24))
    sched.add(request("a", system + list(range(100, 118))))  # 42 tokens: a checkpoint at 40 only
    [a] = sched.schedule()
    assert (a.num_new_tokens, a.save_checkpoint) == (40, 0)
    run_chunk(sched, a)
    sched.add(request("b", system + list(range(200, 220))))
    chunks = {s.request.request_id: s for s in sched.schedule()}
    b = chunks["b"]  # no checkpoint at 24: from row 0, cut where it leaves a's blocks
    assert (b.num_reused_tokens, b.num_new_tokens, b.save_checkpoint) == (0, 24, 1)
    for chunk in chunks.values():
        run_chunk(sched, chunk)
    sched.add(request("c", system + list(range(300, 310))))
    c = {s.request.request_id: s for s in sched.schedule()}["c"]
    assert (c.num_reused_tokens, c.load_checkpoint) == (24, 1)


def test_a_failed_steps_checkpoints_are_never_looked_up():
    sched = checkpointing_scheduler()
    sched.add(request("a", list(range(37))))
    [first] = (
        sched.schedule()
    )  # reserves slot 0 for the key of block 8; the step then fails (no settle)
    key = sched.pool.prefix_cache.keys("a", list(range(37)), 9)[-1]
    sched.isolate([first.request])
    [again] = sched.schedule()
    assert sched.checkpoints.lookup(key) is None
    assert (
        again.save_checkpoint is not None
    )  # the key's slot was released, so it may be reserved again


def test_checkpoint_slots_are_reused_least_recently_used_first():
    index, published = StateCheckpoints(2), lambda key: True
    a, b, c = (index.reserve(k, published) for k in (b"a", b"b", b"c"))
    assert (a, b, c) == (0, 1, None)  # every slot pending
    assert index.reserve(b"a", published) is None  # a key pending already
    index.confirm(a)
    index.confirm(b)
    assert index.use(b"a") == 0  # b is now the least recently used
    assert index.reserve(b"c", published) == 1 and index.lookup(b"b") is None
    index.release_pending()
    assert index.lookup(b"c") is None and index.reserve(b"d", published) == 1


def test_a_checkpoint_whose_block_was_evicted_goes_first():
    index = StateCheckpoints(2)
    for key in (b"a", b"b"):
        index.confirm(index.reserve(key, lambda k: True))
    index.use(b"a")  # b the least recently used, but a's block is gone
    assert index.reserve(b"c", lambda k: k != b"a") == 0
    assert index.lookup(b"a") is None and index.lookup(b"b") == 1
