"""When a decode step may be run ahead (engine/run_ahead.py ``reserve_rows``): a request that surely ends by
length with the current step stays out of it (``goes_on``); not when every request may end (a step run ahead
would likely serve nobody); otherwise yes, with each request's table grown for the rows the step ahead needs,
as long as the pool and the position limit allow; nor when the request state to save first exceeds
``MAX_SAVED_BYTES``."""

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


def test_no_step_runs_ahead_whose_saved_state_exceeds_the_bound(monkeypatch):
    """A hybrid target's recurrent state rows are saved before a step run ahead: a batch whose rows hold more
    than MAX_SAVED_BYTES is not run ahead, a smaller one is; the output is greedy decoding's either way."""
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
    assert row > 0
    sizes = _steps_run_ahead(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == reference
    assert 4 in sizes  # within the default bound
    monkeypatch.setattr(run_ahead, "MAX_SAVED_BYTES", 2 * row)
    sizes.clear()
    assert [o.token_ids for o in llm.generate(prompts, params)] == reference
    assert sizes == []  # four requests' rows: over the bound
    assert [o.token_ids for o in llm.generate(prompts[:2], params)] == reference[:2]
    assert sizes and set(sizes) == {2}


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
    step = SimpleNamespace(state_buffers=lambda key: buffers)
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
