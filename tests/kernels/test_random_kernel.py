"""The GPU's counter-based random numbers (layers/random_kernel.py, run here in Triton's interpreter) are
bit for bit those of layers/sampler.py's torch code, which the CPU runs: a seeded request draws the same
numbers on either device."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.layers import random_kernel, sampler  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, else the interpreter


def test_keys_and_uniforms_match_the_torch_reference():
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (37,), dtype=torch.int64, generator=g)
    counters = torch.randint(0, 2**40, (37,), dtype=torch.int64, generator=g)
    keys = sampler.random_keys(seeds, counters)  # CPU tensors: the torch code
    assert torch.equal(random_kernel.random_keys(seeds.to(DEVICE), counters.to(DEVICE)).cpu(), keys)
    for cols, stream in ((0, 2), (1, 1), (200, 0), (129, 3)):
        want = sampler.draw_uniform(len(keys), cols, keys, "cpu", stream)
        got = random_kernel.draw_uniform(keys.to(DEVICE), cols, stream).cpu()
        assert torch.equal(got, want), (cols, stream)
    keys = keys.to(DEVICE)
    assert not torch.equal(
        random_kernel.draw_uniform(keys, 8, 0), random_kernel.draw_uniform(keys, 8, 1)
    )


def test_gumbel_noise_matches_the_torch_reference():
    """The same uniforms; -log(-log(u)) may round differently in the last bits."""
    keys = sampler.random_keys(
        torch.arange(5, dtype=torch.int64), torch.arange(5, dtype=torch.int64) * 7
    )
    for cols in (1, 200, 1500):
        want = sampler.draw_gumbel(keys, cols)
        got = random_kernel.draw_gumbel(keys.to(DEVICE), cols, sampler.GUMBEL_STREAM).cpu()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got.isfinite().all()
