"""Row streams (layers/quant/quant_matmul_kernel.py ``one_row_streams``): one row's product reads a few whole weight
rows a program, K unsplit, for fp8 weights and for the plain weights that layers/fused_projection.py hands over
(``one_row_plain_max_values``, format "none") with the entry's epilogue. On the CPU the kernels run in Triton's
interpreter (float32); on the GPU in bf16."""

import pytest
import torch
import torch.nn.functional as F

from outpace.attention.context import forward_settings
from outpace.layers import fused_projection
from outpace.layers.fused_projection import (
    norm_project,
    norm_project_qkv,
    norm_project_swiglu,
    project_add_normed,
    project_rows,
    project_swiglu,
)
from outpace.layers.normed_rows import normed_rows
from outpace.layers.quant import quant_matmul_kernel as qm
from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
EPS = 1e-5


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE)


def _relative_error(got, expected) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


TOLERANCE = 2e-2 if DTYPE == torch.bfloat16 else 1e-5


@pytest.fixture
def streamed_products(monkeypatch):
    """The formats of the quantized products launched, recorded."""
    formats = []
    launch = qm._launch

    def recording(x, weight, scale, fmt, *rest):
        formats.append(fmt)
        return launch(x, weight, scale, fmt, *rest)

    monkeypatch.setattr(qm, "_launch", recording)
    return formats


def test_plan_streams_whole_rows_by_the_bytes_of_a_step():
    """fp8: 16 KB a step, 4096 columns at most; plain: 8 KB, 2048 columns; 2 to 8 rows a program, K in one split; a
    next norm's readying takes rows enough for 256 column blocks at most (up to 8 rows); INT4 and two rows not."""
    cpu = torch.device("cpu")
    cases = {  # (n, k, fmt, next_norm): (rows a program, K step)
        (576, 2048, "fp8_block", False): (8, 2048),
        (2048, 4096, "fp8_block", False): (4, 4096),
        (2048, 300, "fp8_block", False): (8, 512),
        (576, 2048, "none", False): (2, 2048),
        (2048, 4096, "none", False): (2, 2048),
        (2048, 2048, "none", True): (8, 2048),
        (4096, 2048, "none", True): (8, 2048),
        (512, 2048, "none", True): (2, 2048),
        (1024, 2048, "none", True): (4, 2048),
    }
    for (n, k, fmt, next_norm), (rows, block_k) in cases.items():
        t = qm.plan(1, n, k, fmt, 128, cpu, next_norm=next_norm)
        assert (t.block_m, t.block_n, t.block_k, t.splits) == (1, rows, block_k, 1), (n, k, fmt)
        assert t.k_per_split >= k
    assert qm.plan(1, 2048, 2048, "int4_group", 32, cpu).block_n != 8
    assert qm.plan(2, 2048, 2048, "fp8_block", 128, cpu).block_m == 16
    with pytest.raises(ValueError, match="one-row product"):
        qm.quant_matmul(torch.zeros(2, 64), torch.zeros(8, 64), torch.zeros(8, 64), "none", (1, 1))


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


@pytest.mark.parametrize("m", [1, 2])
def test_plain_entries_at_one_row_equal_the_fused_kernels(m, monkeypatch, streamed_products):
    """Each entry whose epilogue the quantized product finishes (plain, relu^2, residual + next norm readied, the input
    norm folded in, SiLU's gating), at one row in row streams (format "none") and with them off (the fused kernels):
    the same products, the next norm's readying read by a row stream and by a fused kernel; at two rows, the fused
    kernels only."""
    k, n, inter = 300, 200, 72
    x, w, res, nw = _rand(m, k, seed=4), _rand(n, k, seed=5), _rand(m, n, seed=6), _rand(n, seed=7)
    gate_up, w_in, w_after = _rand(2 * inter, k, seed=8), _rand(k, seed=9), _rand(inter, n, seed=10)

    def entries():
        readied = project_add_normed(x, w, res, nw, next_offset=1.0)
        rows = normed_rows(x * 2, w_in)
        return {
            "rows": project_rows(x, w),
            "relu2": project_rows(x, w, relu2=True),
            "stream": readied.stream,
            "normed then projected": norm_project(readied, EPS, w_after),
            # (a soft-cap: the fused kernels read the partial sums of squares that the row streams wrote)
            "normed then capped": norm_project(readied, EPS, w_after, softcap=30.0),
            "normed": norm_project(rows, EPS, w),
            "swiglu": norm_project_swiglu(rows, EPS, gate_up),
            "swiglu of x": project_swiglu(x, gate_up),
        }

    streamed = entries()
    assert streamed_products.count("none") == (7 if m == 1 else 0)
    monkeypatch.setattr(fused_projection, "one_row_plain_max_values", None)
    fused = entries()
    assert streamed_products.count("none") == (7 if m == 1 else 0)
    for name, got in streamed.items():
        assert _relative_error(got, fused[name]) < TOLERANCE, name


def test_plain_rows_keep_the_fused_kernels_where_the_product_cannot_finish_them(
    monkeypatch, streamed_products
):
    """Not in row streams: GELU-tanh's gating (a launch of its own after the product), q/k/v heads, a soft-cap,
    batch-invariant mode, a weight over ``one_row_plain_max_values`` values or over ONE_ROW_MAX_K columns."""
    k = 64
    x, gate_up, w = _rand(1, k, seed=10), _rand(2 * 40, k, seed=11), _rand(40, k, seed=12)
    project_swiglu(x, gate_up, act="gelu_pytorch_tanh")
    norm_project(normed_rows(x, _rand(k, seed=13)), EPS, w, softcap=30.0)
    with forward_settings(True):
        project_rows(x, w)
    monkeypatch.setattr(fused_projection, "one_row_plain_max_values", w.numel() - 1)
    project_rows(x, w)
    monkeypatch.setattr(fused_projection, "one_row_plain_max_values", 1 << 30)
    wide = qm.ONE_ROW_MAX_K + 64
    project_rows(_rand(1, wide, seed=14), _rand(8, wide, seed=15))
    head_dim, heads, kv_heads, slots = 16, 2, 1, 8
    qkv = _rand((heads + 2 * kv_heads) * head_dim, k, seed=16)
    cache = torch.zeros(2, slots // 2, kv_heads, head_dim, dtype=DTYPE, device=DEVICE)
    cos = torch.ones(slots, head_dim // 2, dtype=DTYPE, device=DEVICE)
    norm_project_qkv(
        normed_rows(x, _rand(k, seed=17)), EPS, qkv, head_dim, heads * head_dim,
        torch.zeros(1, dtype=torch.long, device=DEVICE), cos, cos * 0, cache, cache.clone(),
        torch.zeros(1, dtype=torch.long, device=DEVICE),
    )  # fmt: skip
    assert streamed_products == []
    project_rows(x, w)
    assert streamed_products == ["none"]
