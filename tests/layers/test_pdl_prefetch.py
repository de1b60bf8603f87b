"""The L2 prefetch budget of kernels launched under PDL (layers/pdl.py ``prefetch_columns``): how many columns of
each weight row a grid asks for before it waits."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from outpace.layers import pdl  # noqa: E402


@pytest.fixture
def budget(monkeypatch):
    monkeypatch.setattr(pdl, "prefetch_bytes", 8 << 20)


def test_a_narrow_projection_is_prefetched_whole(budget):
    # DeepSeek-V2-Lite's o_proj: 2048 rows of 2048 columns, 8 MiB in bf16
    assert pdl.prefetch_columns(2048, 2048) == 2048
    # Llama-3.1-8B's o_proj: 4096 rows of 4096; the budget covers a quarter of each row
    assert pdl.prefetch_columns(4096, 4096) == 1024


def test_the_least_holds_where_the_budget_covers_less(budget):
    # a gate/up grid's first sub-tiles (two weight rows an output): 132 x 109 x 2 rows of 4096 columns
    assert pdl.prefetch_columns(132 * 109 * 2, 4096) == pdl.MIN_PREFETCH_COLUMNS


def test_columns_stay_a_power_of_two_within_k(budget):
    assert (
        pdl.prefetch_columns(16, 1000) == 1024
    )  # K's power of two: the kernel masks the lines past K
    assert pdl.prefetch_columns(16, 40) == 64
    for rows in (1, 3, 100, 3000, 50_000):
        columns = pdl.prefetch_columns(rows, 14336)
        assert columns & (columns - 1) == 0
        assert columns <= 16384
        assert columns == pdl.MIN_PREFETCH_COLUMNS or rows * columns * 2 <= pdl.prefetch_bytes


def test_no_budget_is_the_least(monkeypatch):
    monkeypatch.setattr(pdl, "prefetch_bytes", 0)
    assert pdl.prefetch_columns(2048, 2048) == pdl.MIN_PREFETCH_COLUMNS
