"""layers/all_reduce_norm.py under Triton's interpreter, one process playing every rank
(tests/helpers/push_ranks.py): the fused all-reduce, residual add and RMSNorm give the bits of the all-reduce
followed by the norm module's own launch, for each kind of norm; and what it leaves to the two launches."""

from __future__ import annotations

import os

import pytest
import torch

from helpers.push_ranks import PushRanks
from outpace.distributed.group import RankGroup
from outpace.distributed.symmetric_all_reduce import MAX_BYTES
from outpace.layers.all_reduce_norm import all_reduce_add_rms_norm
from outpace.layers.fused_kernels import rms_norm_triton
from outpace.layers.norm import Float32RMSNorm, RMSNorm

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter plays every rank on the CPU"
)


def _norms(dim: int) -> dict[str, torch.nn.Module]:
    g = torch.Generator().manual_seed(dim)
    plain, gemma, bare = (
        RMSNorm(dim, 1e-6),
        Float32RMSNorm(dim, 1e-5, 1.0),
        Float32RMSNorm(dim, 1e-6, 0.0, False),
    )
    with torch.no_grad():
        plain.weight.copy_(torch.rand(dim, generator=g) + 0.5)
        gemma.weight.copy_(torch.randn(dim, generator=g) * 0.1)
    return {"RMSNorm": plain, "Float32RMSNorm offset 1": gemma, "no weight": bare}


@pytest.mark.parametrize("norm_kind", ["RMSNorm", "Float32RMSNorm offset 1", "no weight"])
@pytest.mark.parametrize("world,rows,dim", [(2, 1, 96), (3, 5, 200)])
def test_fused_rows_equal_the_all_reduce_then_the_norm(norm_kind, world, rows, dim):
    norm = _norms(dim)[norm_kind]
    ranks = PushRanks(world, torch.float32)
    g = torch.Generator().manual_seed(rows * 10 + world)
    stream = torch.randn(rows, dim, generator=g)
    for _ in range(3):  # both buffers, then the first again
        partials = [torch.randn(rows, dim, generator=g) * 10 ** (r - 1) for r in range(world)]
        summed = partials[0].clone()
        for p in partials[1:]:
            summed = summed + p  # the all-reduce's sum: rank order, float32
        expected_normed, expected_stream = rms_norm_triton(
            summed, norm.weight, norm.eps, stream, getattr(norm, "offset", None)
        )
        with torch.no_grad():
            results = ranks.call(
                partials,
                lambda r: all_reduce_add_rms_norm(partials[r], stream, norm, ranks.group(r)),
            )
        for normed, added in results:
            assert torch.equal(added, expected_stream) and torch.equal(normed, expected_normed)
        stream = expected_stream


def test_what_it_leaves_to_the_two_launches():
    ranks = PushRanks(2, torch.float32)
    group, x = ranks.group(0), torch.zeros(2, 64)
    norm = RMSNorm(64)
    assert all_reduce_add_rms_norm(x, x, norm, RankGroup(0, 1)) is None  # one rank
    assert all_reduce_add_rms_norm(x, x, norm, RankGroup(0, 2)) is None  # no symmetric path
    assert all_reduce_add_rms_norm(x, x, torch.nn.LayerNorm(64), group) is None  # not an RMSNorm
    assert all_reduce_add_rms_norm(x, x.double(), norm, group) is None  # a stream of another dtype
    assert all_reduce_add_rms_norm(x, x[:1], norm, group) is None  # of another shape
    big = torch.zeros(MAX_BYTES // 4 // 64 + 1, 64)
    assert all_reduce_add_rms_norm(big, big, norm, group) is None  # more than a slot
    wide = torch.zeros(1, 32768)
    assert (
        all_reduce_add_rms_norm(wide, wide, RMSNorm(32768), group) is None
    )  # a row wider than a program


def test_reduce_add_normalised_takes_the_kernel_where_it_serves():
    """layers/fused_decoder.py ``reduce_add_normalised``: the fused kernel over a group with a symmetric path
    (each rank's rows as the kernel leaves them), else the all-reduce and the norm module (one rank: no
    all-reduce)."""
    from outpace.layers.fused_decoder import reduce_add_normalised

    norm = _norms(64)["RMSNorm"]
    ranks = PushRanks(2, torch.float32)
    g = torch.Generator().manual_seed(3)
    partials = [torch.randn(3, 64, generator=g) for _ in range(2)]
    stream = torch.randn(3, 64, generator=g)
    with torch.no_grad():
        rows = ranks.call(
            partials, lambda r: reduce_add_normalised(partials[r], stream, norm, ranks.group(r))
        )
        expected_normed, expected_stream = rms_norm_triton(
            partials[0] + partials[1], norm.weight, norm.eps, stream
        )
        for got in rows:
            assert torch.equal(got.stream, expected_stream) and torch.equal(got.x, expected_normed)
        alone = reduce_add_normalised(partials[0], stream, norm, RankGroup(0, 1))
        normed, added = norm(partials[0], stream)
        assert torch.equal(alone.stream, added) and torch.equal(alone.x, normed)
