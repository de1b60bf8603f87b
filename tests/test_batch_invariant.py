"""The batch-invariant linear (deterministic mode): the same function as F.linear, and each row's
bits independent of the other rows in the call. On the CPU the kernel runs in Triton's interpreter."""
import pytest
import torch
import torch.nn.functional as F

from outpace.layers.batch_invariant import batch_invariant_linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("m,k,n,bias", [(1, 48, 200, False), (7, 130, 64, True), (70, 64, 33, False)])
def test_matches_f_linear_fp32(m, k, n, bias):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    out = batch_invariant_linear(x.to(DEVICE), w.to(DEVICE), None if b is None else b.to(DEVICE)).cpu()
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_leading_dims_are_kept():
    x, w = torch.randn(2, 3, 16), torch.randn(8, 16)
    assert batch_invariant_linear(x.to(DEVICE), w.to(DEVICE)).shape == (2, 3, 8)


@pytest.mark.gpu
def test_rows_are_bitwise_independent_of_the_batch_bf16():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 4096, generator=g, device="cuda").bfloat16()
    w = (torch.randn(1024, 4096, generator=g, device="cuda") * 0.02).bfloat16()
    full = batch_invariant_linear(x, w)
    for rows in (slice(0, 1), slice(5, 11), slice(100, 164)):
        assert torch.equal(batch_invariant_linear(x[rows], w), full[rows])
    ref = F.linear(x.float(), w.float())
    assert ((full.float() - ref).norm() / ref.norm()).item() < 1e-2
