"""The batch-invariant mode's matrix product: the same function as F.linear, and per head (the absorbed MLA's
products) the bits of one product a head. On the CPU the kernel runs in Triton's interpreter (float32)."""

import pytest
import torch
import torch.nn.functional as F

from outpace.layers.skinny_gemm import skinny_linear, skinny_linear_heads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# What the kernel serves on the GPU (half precision; its float32 tl.dot would run in TF32 there), and
# float32 in the interpreter. Tolerance: the output's rounding to the dtype.
DTYPE, TOL = (torch.bfloat16, 5e-3) if DEVICE == "cuda" else (torch.float32, 1e-5)


@pytest.mark.parametrize("m,k,n,block_n", [(1, 300, 70, 32), (16, 256, 64, 16), (7, 40, 200, 64)])
def test_matches_f_linear(m, k, n, block_n):
    g = torch.Generator().manual_seed(m + k + n)
    x, w = torch.randn(m, k, generator=g).to(DTYPE), torch.randn(n, k, generator=g).to(DTYPE)
    out = skinny_linear(x.to(DEVICE), w.to(DEVICE), block_n=block_n, block_k=128).cpu()
    ref = F.linear(x.double(), w.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL


def test_strided_rows_are_read_correctly():
    x = torch.randn(5, 2 * 64).to(DTYPE)[:, :64]  # a view with row stride 128
    w = torch.randn(48, 64).to(DTYPE)
    out = skinny_linear(x.to(DEVICE), w.to(DEVICE), block_k=64).cpu()
    ref = F.linear(x.double(), w.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL


@pytest.mark.gpu
def test_bf16_on_the_gpu_matches_cublas():
    x = torch.randn(6, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    ref = F.linear(x.float(), w.float())
    assert ((skinny_linear(x, w).float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("m", [1, 5, 70])  # 70: four row tiles a program (prefill in the mode)
@pytest.mark.parametrize("transposed", [False, True])
def test_per_head_products_in_one_launch_give_each_heads_own_bits(m, transposed):
    """x [m, heads, k] through weights [heads, n, k], strided as the absorbed MLA passes them (W_UV as stored;
    W_UK^T a transposed view, K not contiguous; x a slice of wider head rows): the bits of skinny_linear on
    each head's contiguous weight alone."""
    g = torch.Generator().manual_seed(m + transposed)
    heads, k, n = 3, 40, 36
    x = torch.randn(m, heads, k + 8, generator=g).to(DTYPE)[..., :k]
    if transposed:
        weights = torch.randn(heads, k, n, generator=g).to(DTYPE).transpose(1, 2)
    else:
        weights = torch.randn(heads, n, k, generator=g).to(DTYPE)
    x, weights = x.to(DEVICE), weights.to(DEVICE)
    out = skinny_linear_heads(x, weights)
    for h in range(heads):
        assert torch.equal(out[:, h], skinny_linear(x[:, h], weights[h].contiguous()))
    ref = torch.einsum("mhk,hnk->mhn", x.double(), weights.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL
