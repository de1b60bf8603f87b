"""The batch-invariant mode's matrix product: the same function as F.linear. On the CPU the kernel runs in
Triton's interpreter (float32)."""

import pytest
import torch
import torch.nn.functional as F

from outpace.layers.skinny_gemm import skinny_linear

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
