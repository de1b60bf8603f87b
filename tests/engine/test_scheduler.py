"""The scheduler alone (engine/scheduler.py) over a BlockPool, without a model: admission within the token
budget and ``max_num_seqs`` in arrival order, chunked prefill, lookahead rows reserved for decoding,
preemption of the newest request when blocks run out and its recomputation before later arrivals,
finishing that returns every block, and prefix-cache reuse that never covers the last token.

``step`` plays the engine's part after a forward without speculation: each scheduled chunk gets its KV,
and a chunk that reaches the request's last token samples one more."""

from outpace import SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.cache.prefix_cache import PrefixCache
from outpace.engine.scheduler import ScheduledRequest, Scheduler
from outpace.request import Request, RequestStatus

PARAMS = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
SAMPLED_TOKEN = 7


def request(name: str, prompt: list[int] | int) -> Request:
    """A request of ``prompt`` (or of that many tokens 1, 2, ...)."""
    tokens = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    return Request(name, tokens, PARAMS)


def scheduler(
    pool: BlockPool, max_num_seqs: int = 8, max_num_batched_tokens: int = 64, **kwargs
) -> Scheduler:
    return Scheduler(pool, max_num_seqs, max_num_batched_tokens, **kwargs)


def step(sched: Scheduler) -> list[ScheduledRequest]:
    batch = sched.schedule()
    for chunk in batch:
        req, samples = chunk.request, chunk.completes_sequence
        req.num_computed_tokens += chunk.num_new_tokens
        if samples:
            req.token_ids.append(SAMPLED_TOKEN)
        sched.settle(req)
    return batch


def shares(batch: list[ScheduledRequest]) -> list[tuple[str, int]]:
    return [(chunk.request.request_id, chunk.num_new_tokens) for chunk in batch]


def test_requests_join_in_arrival_order_up_to_max_num_seqs():
    sched = scheduler(BlockPool(64, 4), max_num_seqs=2)
    reqs = [request(f"r{i}", 3) for i in range(4)]
    for r in reqs:
        sched.add(r)
    assert shares(step(sched)) == [("r0", 3), ("r1", 3)]
    assert sched.running == reqs[:2] and list(sched.waiting) == reqs[2:]
    assert all(r.status is RequestStatus.WAITING for r in reqs[2:])
    assert shares(step(sched)) == [("r0", 1), ("r1", 1)]  # decoding; still no third row


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget():
    sched = scheduler(BlockPool(64, 4), max_num_batched_tokens=8)
    r = request("r", 20)
    sched.add(r)
    chunks, outputs = [], []
    for _ in range(4):
        chunks += shares(step(sched))
        outputs.append(r.num_output_tokens)
    assert chunks == [("r", 8), ("r", 8), ("r", 4), ("r", 1)]
    assert (
        outputs == [0, 0, 1, 2] and r.num_computed_tokens == 21
    )  # a token once the prompt is computed


def test_running_requests_spend_the_budget_first_and_the_rest_goes_to_one_joining_prompt():
    sched = scheduler(BlockPool(64, 4), max_num_batched_tokens=4)
    first, second, third = request("first", 2), request("second", 10), request("third", 2)
    sched.add(first)
    step(sched)
    sched.add(second)
    sched.add(third)
    assert shares(step(sched)) == [("first", 1), ("second", 3)]  # the budget is spent: third waits
    assert shares(step(sched)) == [("first", 1), ("second", 3)]
    assert list(sched.waiting) == [third]


def test_a_decoding_request_costs_decode_tokens_and_reserves_lookahead_rows():
    pool = BlockPool(64, 2)
    sched = scheduler(pool, max_num_batched_tokens=4, decode_tokens=4, lookahead=3)
    a, b = request("a", 4), request("b", 4)
    sched.add(a)
    sched.add(b)
    assert shares(step(sched)) == [("a", 4)]  # b's prompt finds no budget left
    assert shares(step(sched)) == [("a", 1)]  # a's verify width takes the whole budget
    # a's last token was row 4: rows 0 .. 4 + 3 reserved for it and its drafts, in 4 blocks of 2
    assert len(pool.table("a")) == 4
    assert list(sched.waiting) == [b]


def test_a_decode_chunk_outside_the_budget_grows_its_rows_or_preempts_the_request():
    """``decode_chunk`` (a hybrid's request that a step run ahead advanced, left out by the budget: engine/
    run_ahead.py ``reconcile``): a decode step of it, its rows grown for the verify width; where the pool cannot hold
    them, the request is preempted instead, to be recomputed."""
    pool = BlockPool(7, 2)
    sched = scheduler(pool, max_num_batched_tokens=4, decode_tokens=4, lookahead=3)
    a, b = request("a", 3), request("b", 1)
    for r in (a, b):
        sched.add(r)
    step(sched)  # both prompts
    assert shares(step(sched)) == [("a", 1)]  # b left out by the budget
    chunk = sched.decode_chunk(b)
    assert (chunk.request, chunk.num_new_tokens) == (b, 1)
    # rows 0 .. 4 (its last token's row 1, then 3 draft rows) in blocks of 2
    assert len(pool.table("b")) == 3 and pool.num_free == 0
    a.num_computed_tokens += 1  # (say a draft was accepted too)
    a.token_ids.append(SAMPLED_TOKEN)
    assert sched.decode_chunk(a) is None  # its step from row 5 needs rows 0 .. 8: a fifth block
    assert list(sched.waiting) == [a] and a.metrics.num_preemptions == 1 and not pool.table("a")


def test_a_request_that_does_not_fit_the_free_blocks_is_not_overtaken():
    pool = BlockPool(3, 4)
    sched = scheduler(pool)
    for r in (request("a", 8), request("b", 8), request("c", 2)):
        sched.add(r)
    assert shares(step(sched)) == [("a", 8)]  # b needs 2 blocks of the 1 free; c waits behind it
    assert [r.request_id for r in sched.waiting] == ["b", "c"] and pool.num_free == 1


def test_running_out_of_blocks_preempts_the_newest_request_which_recomputes_before_later_arrivals():
    pool = BlockPool(4, 2)
    freed = []
    sched = scheduler(pool, on_free=freed.append)
    old, new = request("old", 3), request("new", 3)
    sched.add(old)
    sched.add(new)
    step(sched)  # both prefilled: 2 blocks each, the pool is full
    assert shares(step(sched)) == [("old", 1), ("new", 1)]  # rows 0..3 still fit their 2 blocks
    later = request("later", 1)
    sched.add(later)
    # old's next row needs a third block: new, admitted last, gives its blocks back and waits first in line
    assert shares(step(sched)) == [("old", 1)]
    assert freed == [new] and new.metrics.num_preemptions == 1 and old.metrics.num_preemptions == 0
    assert (
        new.status is RequestStatus.WAITING
        and new.num_computed_tokens == 0
        and pool.table("new") == []
    )
    assert (
        list(sched.waiting) == [new, later] and len(pool.table("old")) == 3 and pool.num_free == 1
    )
    sched.finish(old, "length")
    # new recomputes its prompt and the tokens it produced, in one chunk, ahead of the later arrival
    assert shares(step(sched))[0] == ("new", 5)
    assert new.num_output_tokens == 3


def test_finishing_returns_every_block_wherever_the_request_is():
    pool = BlockPool(8, 4)
    freed = []
    sched = scheduler(pool, max_num_seqs=1, on_free=freed.append)
    running, waiting = request("running", 9), request("waiting", 3)
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert len(pool.table("running")) == 3 and pool.num_free == 5
    sched.finish(running, "stop")
    assert pool.num_free == 8 and pool.table("running") == [] and not pool.held_by
    assert running.finished and running.finish_reason == "stop" and sched.running == []
    sched.finish(waiting, "abort")
    assert not sched.has_unfinished and waiting.finish_reason == "abort"
    assert freed == [running, waiting]


def test_a_joining_request_reuses_published_blocks_but_forwards_its_last_token():
    pool = BlockPool(8, 4, PrefixCache(4))
    sched = scheduler(pool)
    first = request("first", list(range(10, 19)))  # 9 tokens: blocks 0 and 1 full
    sched.add(first)
    step(sched)
    first_blocks = pool.table("first")[:2]
    sched.finish(first, "stop")
    same_start = request("same_start", list(range(10, 18)) + [50, 51])
    whole_blocks = request("whole_blocks", list(range(10, 18)))  # exactly the two published blocks
    sched.add(same_start)
    sched.add(whole_blocks)
    batch = step(sched)
    assert [(c.num_reused_tokens, c.num_new_tokens) for c in batch] == [(8, 2), (4, 4)]
    assert (
        pool.table("same_start")[:2] == first_blocks
        and pool.table("whole_blocks")[:1] == first_blocks[:1]
    )
    assert pool.prefix_cache.stats.hits == 12 and pool.prefix_cache.stats.queries == 9 + 10 + 8
