"""When a decode step may be run ahead (engine/run_ahead.py ``reserve_rows``): a request that surely ends by
length with the current step stays out of it (``goes_on``); not when every request may end (a step run ahead
would likely serve nobody); otherwise yes, with each request's table grown for the rows the step ahead needs,
as long as the pool and the position limit allow; a hybrid's at any batch, its recurrent state not saved."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from outpace import LLM, SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.engine import run_ahead
from outpace.engine.run_ahead import goes_on, reserve_rows

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def request(rid: str, output_tokens: int, max_tokens: int):
    return SimpleNamespace(
        request_id=rid,
        num_output_tokens=output_tokens,
        params=SimpleNamespace(max_tokens=max_tokens),
    )


def test_a_step_runs_ahead_while_one_request_may_not_end():
    pool = BlockPool(num_blocks=16, block_size=4)
    short, long_ = request("a", 8, 12), request("b", 4, 17)  # a may end within 5 tokens, b may not
    assert reserve_rows(pool, [short, long_], [20, 20], limit=64, committed=5)
    assert len(pool.table("a")) == len(pool.table("b")) == 5  # grown to hold 20 rows each


def test_no_step_runs_ahead_when_every_request_may_end():
    pool = BlockPool(num_blocks=16, block_size=4)
    assert not reserve_rows(
        pool, [request("a", 8, 12), request("b", 13, 17)], [20, 20], limit=64, committed=5
    )
    assert not reserve_rows(pool, [request("a", 10, 12)], [20], limit=64, committed=5)
    assert pool.num_free == 16 and not pool.table("a")


def test_a_request_that_surely_ends_stays_out_of_the_step_run_ahead():
    assert [
        goes_on(r) for r in (request("a", 11, 12), request("b", 10, 12), request("c", 12, 12))
    ] == [
        False,
        True,
        False,
    ]


def test_no_step_runs_ahead_past_the_position_limit_or_the_free_blocks():
    pool = BlockPool(num_blocks=4, block_size=4)
    assert not reserve_rows(pool, [request("a", 1, 100)], [65], limit=64, committed=5)
    assert not reserve_rows(
        pool, [request("a", 1, 100), request("b", 1, 100)], [12, 12], limit=64, committed=5
    )
    assert pool.num_free == 4  # nothing grown when refused
    assert (
        reserve_rows(pool, [request("a", 1, 100)], [16], limit=64, committed=5)
        and pool.num_free == 0
    )


def _steps_run_ahead(llm: LLM) -> list[int]:
    """The batch sizes of the steps launched ahead (engine/run_ahead.py), from now on."""
    owner, sizes = llm.engine.runner.run_ahead, []
    may_launch = owner.may_launch

    def recording(reqs, shape, joining, captured):
        ran = may_launch(reqs, shape, joining, captured)
        if ran:
            sizes.append(len(reqs) + len(joining))
        return ran

    owner.may_launch = recording
    return sizes


def test_a_hybrid_runs_ahead_at_every_batch_saving_no_recurrent_state():
    """A hybrid target's recurrent state is not saved before a step run ahead (engine/run_ahead.py): a batch of
    any size runs ahead, saving only its lengths and last tokens, and the output is greedy decoding's. Before,
    the state was saved and a batch holding more than 512 MiB of it did not run ahead."""
    prompts = ["def add(a, b):", "class Stack:", "import os\n", "for i in range("]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    reference = [
        o.token_ids
        for o in LLM(str(ZOO / "tinyqwen35"), device="cpu", dtype="float32").generate(
            prompts, params
        )
    ]
    llm = LLM(str(ZOO / "tinyqwen35"), device="cpu", dtype="float32", max_num_seqs=4)
    llm.engine.capture_graphs()
    row = llm.engine.runner.states.state_bytes_per_request
    sizes, saved = _steps_run_ahead(llm), []
    owner = llm.engine.runner.run_ahead
    saved_state = owner.saved_state

    def recording(key, req_indices):
        rows = saved_state(key, req_indices)
        saved.append(sum(t.numel() * t.element_size() for t in rows.tensors))
        return rows

    owner.saved_state = recording
    assert [o.token_ids for o in llm.generate(prompts, params)] == reference
    assert 4 in sizes
    assert saved and max(saved) < row  # four rows' lengths and last tokens, no recurrent state


def test_a_request_that_left_is_never_restored():
    """A request that leaves while a step runs ahead for it (here preempted, and its row given back to it by a
    prefill before the step is read) keeps what the prefill wrote when the step is dropped; the others' rows are
    restored."""
    import torch

    from outpace.engine.launch import DecodeLaunch

    buffers = [torch.arange(4, dtype=torch.int64)]
    step = SimpleNamespace(state_buffers=lambda key, recurrent=True: buffers)
    table = SimpleNamespace(holds=lambda rid, index: True, max_rows=64, device="cpu")
    ahead = run_ahead.RunAhead(None, table, step, per_step=1, lookahead=0, max_model_len=64)
    saved = ahead.saved_state(None, [0, 1])
    ahead.launch = DecodeLaunch(
        None, ("a", "b"), (), SimpleNamespace(wait=lambda: None), [0, 1], saved
    )
    buffers[0].add_(10)  # the step run ahead
    ahead.forget("b")
    buffers[0][1] = -1  # b's prefill into the same row
    ahead.drop()
    assert buffers[0].tolist() == [0, -1, 12, 13]


def test_a_hybrids_batch_after_a_step_run_ahead_decodes_exactly_the_requests_it_ran_for():
    """``reconcile``: a hybrid's next batch must decode every running request the step run ahead advanced (b, left
    out by the scheduler) and none it did not run for at its length (n: then no step runs ahead of this one, so
    that the next batch holds n too); a request that left (c, preempted and prefilling again) is neither. A dense
    target's batch stays as scheduled."""
    from outpace.engine.launch import DecodeLaunch

    def req(rid, computed):
        params = SimpleNamespace(max_tokens=100, structured_outputs=None)
        return SimpleNamespace(
            request_id=rid, num_computed_tokens=computed, num_output_tokens=1, params=params
        )

    a, b, c, n = req("a", 5), req("b", 7), req("c", 0), req("n", 3)
    table = SimpleNamespace(max_rows=64)
    copy = SimpleNamespace(wait=lambda: None)
    launch = DecodeLaunch(None, ("a", "b", "c"), (5, 7, 9), copy, [0, 1, 2])
    dense = run_ahead.RunAhead(None, table, None, per_step=1, lookahead=0, max_model_len=64)
    dense.launch = launch
    assert dense.reconcile([a, n], [a, b, c, n]) == ([], [])
    pool = BlockPool(num_blocks=16, block_size=4)
    hybrid = run_ahead.RunAhead(
        pool, table, None, per_step=1, lookahead=0, max_model_len=64, recurrent=True
    )
    hybrid.launch = launch
    hybrid.forget("c")
    assert hybrid.reconcile([a, n], [a, b, c, n]) == ([b], [n])
    shape = SimpleNamespace(num_steps=0)
    assert not hybrid.may_launch([a, b], shape, [], captured=True)
    assert hybrid.may_launch([a, b, n], shape, [], captured=True)  # the step after
    hybrid.launch = launch
    for rid in ("a", "b"):
        hybrid.forget(rid)
    # every request it ran for has left: n decodes (the step, serving no one, is dropped)
    assert hybrid.reconcile([n], [c, n]) == ([], [])


@pytest.mark.parametrize("one_launch", [False, True], ids=["torch_copies", "one_launch"])
@pytest.mark.parametrize("rows", [[3, 0, 4], [4, 2, 3], [0]])
def test_a_drop_restores_each_held_row_of_every_buffer(rows, one_launch, monkeypatch):
    """The saved state holds every buffer's rows (int64, float32, bfloat16, [rows, ...] of any
    shape), whether they form one run of consecutive rows (in any order) or several; a drop puts back the
    rows still held by their requests and leaves the others as they are. A second step run ahead for the
    same rows (whose save reuses the first's tensors) saves the rows as they are then. ``one_launch``: the
    whole 32-bit words copied in one launch (engine/copy_pieces_kernel.py: on CUDA tensors where there is a
    GPU, else forced into Triton's interpreter; the bfloat16 rows of 14 bytes by torch beside it)."""
    import torch

    device = "cpu"
    if one_launch:
        pytest.importorskip("triton")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        monkeypatch.setattr(run_ahead, "copies_in_one_launch", lambda buffers, nbytes: True)

    from outpace.engine.launch import DecodeLaunch

    g = torch.Generator().manual_seed(0)
    buffers = [
        torch.arange(5, dtype=torch.int64),
        torch.randn(5, 3, 2, generator=g),
        torch.randn(5, 7, generator=g).to(torch.bfloat16),
    ]
    buffers = [t.to(device) for t in buffers]
    step = SimpleNamespace(state_buffers=lambda key, recurrent=True: buffers)
    table = SimpleNamespace(holds=lambda rid, index: rid != "gone", max_rows=64, device=device)
    ahead = run_ahead.RunAhead(None, table, step, per_step=1, lookahead=0, max_model_len=64)
    ids = ("a", "gone", "b")[: len(rows)] if len(rows) > 1 else ("a",)
    restored = [r for r, rid in zip(rows, ids) if rid != "gone"]
    untouched = [r for r in range(5) if r not in restored]  # "gone"'s row and rows outside the step
    for _ in range(2):
        saved = ahead.saved_state(None, rows)
        before = [t.clone() for t in buffers]
        for t in buffers:
            t.add_(1)  # the step run ahead advances every row
        after = [t.clone() for t in buffers]
        ahead.launch = DecodeLaunch(None, ids, (), SimpleNamespace(wait=lambda: None), rows, saved)
        ahead.drop()
        for t, old, new in zip(buffers, before, after):
            assert torch.equal(t[restored], old[restored])
            assert torch.equal(t[untouched], new[untouched])
        for t in buffers:
            t.mul_(2)  # the steps between two run ahead


def test_a_request_given_the_id_of_one_that_left_never_takes_its_step_run_ahead():
    """A step run ahead for requests that were all aborted stays in flight while the engine idles; a new request
    given one's id (which the engine allows once it has left) decodes from the length that one's step started
    from (the same prompt). Before, ``take`` served it that step's tokens, which continued the old request's
    sampled token from its row: the seeded output was not its own."""
    llm = LLM(str(ZOO / "tinypy"), device="cpu", dtype="float32", max_num_seqs=4)
    llm.engine.capture_graphs()
    engine = llm.engine
    prompt = engine.tokenizer.encode("def fibonacci(n):")
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=1)
    expected = llm.generate([prompt], sampled.replace(seed=2))[0].token_ids
    engine.add_request(
        engine.tokenizer.encode("class Stack:"),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        request_id="b",
    )
    engine.step()
    engine.add_request(prompt, sampled, request_id="a")
    engine.step()  # b decodes, a's prefill completes: a step runs ahead for both
    assert set(engine.runner.run_ahead.launch.request_ids) == {"a", "b"}
    engine.abort_request("a")
    engine.abort_request("b")
    engine.add_request(prompt, sampled.replace(seed=2), request_id="a")
    outs = {}
    while engine.has_unfinished_requests:
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert outs["a"].token_ids == expected
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.runner.req_table.held_by
