"""The few-row matrix product (decode GEMV): the same function as F.linear, and used only where it
applies. On the CPU the kernel runs in Triton's interpreter (float32)."""
import pytest
import torch
import torch.nn.functional as F

from outpace.layers.skinny_gemm import skinny_applies, skinny_linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("m,k,n,block_n", [(1, 300, 70, 32), (16, 256, 64, 16), (7, 40, 200, 64)])
def test_matches_f_linear(m, k, n, block_n):
    g = torch.Generator().manual_seed(m + k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    out = skinny_linear(x.to(DEVICE), w.to(DEVICE), block_n=block_n, block_k=128).cpu()
    ref = F.linear(x.double(), w.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_strided_rows_are_read_correctly():
    x = torch.randn(5, 2 * 64)[:, :64]  # a view with row stride 128
    w = torch.randn(48, 64)
    out = skinny_linear(x.to(DEVICE), w.to(DEVICE), block_k=64).cpu()
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_applies_only_to_few_half_precision_rows_without_bias_or_grad():
    w = torch.zeros(8, 4, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert skinny_applies(torch.zeros(16, 4, dtype=torch.bfloat16), w, None)
        assert not skinny_applies(torch.zeros(17, 4, dtype=torch.bfloat16), w, None)
        assert not skinny_applies(torch.zeros(2, 4), w.float(), None)
        assert not skinny_applies(torch.zeros(2, 4, dtype=torch.bfloat16), w, torch.zeros(8, dtype=torch.bfloat16))
    assert not skinny_applies(torch.zeros(2, 4, dtype=torch.bfloat16), w, None)  # autograd on


@pytest.mark.gpu
def test_bf16_on_the_gpu_matches_cublas():
    x = torch.randn(6, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    ref = F.linear(x.float(), w.float())
    assert ((skinny_linear(x, w).float() - ref).norm() / ref.norm()).item() < 1e-2
