"""The batch-invariant linear (deterministic mode): the same function as F.linear, and each row's
bits independent of the other rows in the call. On the CPU the kernel runs in Triton's interpreter."""

import pytest
import torch
import torch.nn.functional as F

from outpace.attention.context import forward_settings
from outpace.layers.batch_invariant import batch_invariant_linear
from outpace.layers.linear import project, project_rows_alone

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "m,k,n,bias", [(1, 48, 200, False), (7, 130, 64, True), (70, 64, 33, False)]
)
def test_matches_f_linear_fp32(m, k, n, bias):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    out = batch_invariant_linear(
        x.to(DEVICE), w.to(DEVICE), None if b is None else b.to(DEVICE)
    ).cpu()
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


def test_cpu_projection_rows_are_bitwise_independent_of_the_batch_in_batch_invariant_mode():
    """On the CPU, batch-invariant mode projects each row alone: a row's bits are the same among any number
    of rows (a plain F.linear gives other bits for some row counts on some CPUs: MKL's kernel for 1-11 rows
    differs from its kernel for 12 or more on an AVX-512 machine), and equal F.linear's for a single row."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(40, 256, generator=g),
        torch.randn(300, 256, generator=g),
        torch.randn(300, generator=g),
    )
    with forward_settings(batch_invariant=True):
        full = project(x, w, b)
        for m in range(1, 40):
            assert torch.equal(project(x[:m], w, b), full[:m])
        assert project(x[:0], w).shape == (0, 300) and project(x.view(4, 10, 256), w).shape == (
            4,
            10,
            300,
        )
    assert torch.equal(full, project_rows_alone(x, w, b))
    assert torch.equal(full[3], F.linear(x[3], w, b))
