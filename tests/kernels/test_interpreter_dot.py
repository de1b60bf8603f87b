"""The interpreter's tl.dot as tests/conftest.py sets it: a row's bits depend on that row's operands only."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="checks the interpreter"
)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    rows, ks, cols = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
    b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], tl.dot(a, b))


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[1])
    _dot_kernel[(1,)](a, b, out, M=a.shape[0], K=a.shape[1], N=b.shape[1])
    return out


@pytest.mark.parametrize("k, n", [(16, 16), (64, 32), (128, 64)])
def test_a_row_gets_the_same_bits_in_any_tile(k, n):
    g = torch.Generator().manual_seed(k + n)
    a, b = torch.randn(64, k, generator=g), torch.randn(k, n, generator=g)
    alone = _dot(torch.cat([a[:1], torch.zeros(15, k)]), b)[0]
    for m in (16, 32, 64):
        tile = torch.cat([a[1:m], a[:1]])  # the row last, among m - 1 others
        assert torch.equal(_dot(tile, b)[-1], alone)
    assert torch.allclose(alone, a[0] @ b, rtol=1e-5, atol=1e-5)  # and it is the product
