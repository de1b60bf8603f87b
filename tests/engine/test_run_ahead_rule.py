"""When a decode step may be run ahead (engine/run_ahead.py ``reserve_rows``): not when a request of the
batch surely ends by length with the current step, nor when every request may (a step run ahead would
likely serve nobody); otherwise yes, with each request's table grown for the rows the step ahead needs, as
long as the pool and the position limit allow. And whether an engine runs ahead at all (``runs_ahead``)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from outpace import LLM
from outpace.cache.block_pool import BlockPool
from outpace.engine.run_ahead import reserve_rows

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


def test_no_step_runs_ahead_when_a_request_surely_ends():
    pool = BlockPool(num_blocks=16, block_size=4)
    assert not reserve_rows(
        pool, [request("a", 11, 12), request("b", 1, 100)], [20, 20], limit=64, committed=5
    )


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


@pytest.mark.parametrize(
    ("target", "setting", "expected"),
    [
        ("tinypy", None, True),
        (
            "tinyqwen35",
            None,
            False,
        ),  # a hybrid: its state rows would be saved before each step ahead
        ("tinyqwen35", True, True),
        ("tinypy", False, False),
    ],
)
def test_run_ahead_by_default_except_on_hybrid_targets(target, setting, expected):
    llm = LLM(str(ZOO / target), device="cpu", dtype="float32", run_ahead=setting)
    llm.engine.capture_graphs()
    assert (llm.engine.runner.run_ahead is not None) == expected
