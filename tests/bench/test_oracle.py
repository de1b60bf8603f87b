"""bench/oracle.py: speed-ups from measured step costs at an assumed acceptance or at rates by depth measured
elsewhere."""

import pytest

from outpace.bench.oracle import best_draft_count, expected_tokens, oracle_speedups, rows_at_rates


def test_expected_tokens_multiplies_the_rates_along_the_chain():
    assert expected_tokens(0.5, 3) == 1 + 0.5 + 0.25 + 0.125
    assert expected_tokens([0.5, 0.5, 0.5], 3) == expected_tokens(0.5, 3)
    assert expected_tokens([0.9, 0.5], 2) == pytest.approx(1 + 0.9 + 0.45)
    assert expected_tokens([0.9, 0.5], 1) == pytest.approx(1.9)
    with pytest.raises(ValueError, match="2 acceptance rates for 3 drafts"):
        expected_tokens([0.9, 0.5], 3)


def test_rates_by_depth_weigh_only_the_draft_counts_they_cover():
    costs = {
        0: 1.0,
        1: 1.1,
        2: 1.2,
        3: 1.25,
    }  # a third draft nearly free: any acceptance would take it
    k, speedup = best_draft_count(costs, costs[0], [0.8, 0.8])
    assert k == 2 and speedup == pytest.approx((1 + 0.8 + 0.64) / 1.2)
    assert best_draft_count(costs, costs[0], 0.8)[0] == 3
    row = rows_at_rates(costs, 4, [0.8, 0.8])
    assert row["num_drafts"] == 2 and row["tokens_per_s"] == pytest.approx(4 * 2.44 / 1.2)


def test_no_draft_where_drafts_cost_more_than_they_commit():
    costs = {0: 1.0, 1: 2.0, 2: 3.0}
    assert rows_at_rates(costs, 1, [0.5, 0.5])["num_drafts"] == 0
    assert all(r["num_drafts"] == 0 and r["speedup"] == 1.0 for r in oracle_speedups(costs))
