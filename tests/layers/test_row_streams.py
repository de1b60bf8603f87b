"""Row streams (layers/quant/quant_matmul_kernel.py ``one_row_streams``): one row's product of an fp8 weight reads a
few whole weight rows a program, K unsplit. On the CPU the kernel runs in Triton's interpreter (float32); on the GPU
in bf16."""

import pytest
import torch
import torch.nn.functional as F

from outpace.attention.context import forward_settings
from outpace.layers.quant import quant_matmul_kernel as qm
from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE)


def _relative_error(got, expected) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


TOLERANCE = 2e-2 if DTYPE == torch.bfloat16 else 1e-5


def test_plan_streams_whole_rows_by_the_bytes_of_a_step(monkeypatch):
    """16 KB a step, 4096 columns at most, 2 to 8 rows a program, K in one split; a next norm's readying takes rows
    enough for 256 column blocks at most (up to 8 rows); each program prefetches ``stream_prefetch_bytes`` of its
    rows; INT4, two rows, batch-invariant mode and the streams off not."""
    cpu = torch.device("cpu")
    cases = {  # (n, k, fmt, next_norm): (rows a program, K step)
        (576, 2048, "fp8_block", False): (8, 2048),
        (2048, 4096, "fp8_block", False): (4, 4096),
        (2048, 300, "fp8_block", False): (8, 512),
        (6144, 4096, "fp8_tensor", False): (4, 4096),
        (2048, 4096, "fp8_block", True): (8, 4096),
        (4096, 4096, "fp8_block", True): (8, 4096),
        (512, 4096, "fp8_block", True): (4, 4096),
        (1024, 4096, "fp8_block", True): (4, 4096),
    }
    for (n, k, fmt, next_norm), (rows, block_k) in cases.items():
        t = qm.plan(1, n, k, fmt, 128, cpu, next_norm=next_norm)
        assert (t.block_m, t.block_n, t.block_k, t.splits) == (1, rows, block_k, 1), (n, k, fmt)
        assert t.k_per_split >= k
    assert qm.plan(1, 2048, 2048, "int4_group", 32, cpu).block_n != 8
    assert qm.plan(2, 2048, 2048, "fp8_block", 128, cpu).block_m == 16
    with forward_settings(True):
        assert qm.plan(1, 2048, 2048, "fp8_block", 128, cpu).block_m == 16
    monkeypatch.setattr(
        qm, "stream_prefetch_bytes", 1024
    )  # (a sweep's setting: 8 lines of each row)
    t = qm.plan(1, 576, 2048, "fp8_block", 128, cpu)
    assert qm.prefetch_lines(t.k_per_split, t.prefetch_bytes) == 8
    monkeypatch.setattr(qm, "one_row_streams", False)
    monkeypatch.setattr(qm, "num_sms", lambda device: 132)
    off = qm.plan(1, 576, 2048, "fp8_block", 128, cpu)  # (the one-row tiles, K split)
    assert (off.block_n, off.splits > 1) == (qm.one_row_tiles[0], True)


@pytest.mark.parametrize("k", [300, 2048, 2100])
def test_fp8_streams_equal_the_product_on_the_dequantized_weight(k):
    """Block FP8 in row streams (K = 2100: the one step mostly past the weight), the residual added and the next
    norm readied: F.linear on the dequantized weight, every scale column its own."""
    n = 300
    raw = torch.randn(n, k, generator=torch.Generator().manual_seed(k))
    q, scale = quantize_fp8_block(raw, (128, 128))
    x, residual, w_next = _rand(1, k, seed=1), _rand(1, n, seed=2), _rand(n, seed=3)
    parts = qm.column_blocks(1, n, k, "fp8_block", 128, torch.device(DEVICE))
    normed, sq = torch.empty(1, n, dtype=DTYPE, device=DEVICE), torch.empty(parts, 1, device=DEVICE)
    epilogue = qm.RowEpilogue(residual=residual, next_norm=(w_next, 1.0, normed, sq))
    got = qm.quant_matmul(
        x, q.to(DEVICE), scale.to(DEVICE), "fp8_block", (128, 128), None, epilogue
    )
    assert qm.plan(1, n, k, "fp8_block", 128, torch.device(DEVICE)).splits == 1
    dense = dequantize_fp8_block(q, scale, (128, 128)).double().to(DEVICE)
    expected = F.linear(x.double(), dense) + residual.double()
    assert _relative_error(got, expected) < TOLERANCE
    s = got.double()
    assert _relative_error(normed, s * (1.0 + w_next.double())) < TOLERANCE
    assert torch.allclose(sq.sum(0).double(), (s * s).sum(1), rtol=TOLERANCE)
