"""benchmarks/scripts/mtp_floor_bound.py: MTP's speed-up when plain decoding and verification both run at the
bandwidth floor."""

from __future__ import annotations

import pytest

from helpers.bench_scripts import load_bench_script
from outpace.bench.families import CONTEXT, StepBudget, distinct_experts


def budget(always: int, expert: int, kv_row: int = 0) -> StepBudget:
    return StepBudget(always, 0, expert, 48, 512, 10, ((kv_row, None),), 0)


def test_dense_bytes_alone_give_tau():
    """Without routed experts or a cache a verify reads what a decode step reads: the bound is tau itself."""
    _, _, most = load_bench_script("mtp_floor_bound").bound(budget(10**9, 0), 2.25, 2)
    assert most == pytest.approx(2.25)


def test_each_verified_token_reads_its_own_experts():
    """With experts only, a verify of 3 tokens reads the experts 3 tokens choose (about 2.94 times one token's
    10 of 512), so tau 2.25 gives about 0.77x."""
    plain, verify, most = load_bench_script("mtp_floor_bound").bound(budget(0, 3_000_000), 2.25, 2)
    assert verify / plain == pytest.approx(distinct_experts(512, 10, 3) / 10)
    assert most == pytest.approx(2.25 * 10 / distinct_experts(512, 10, 3))
    assert 0.7 < most < 0.8


def test_the_cache_rows_of_the_verified_tokens_count():
    plain, verify, _ = load_bench_script("mtp_floor_bound").bound(budget(0, 0, kv_row=100), 2.0, 1)
    assert (plain, verify) == (100 * (CONTEXT + 1), 100 * (CONTEXT + 2))
