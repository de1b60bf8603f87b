"""The FP8 KV cache (attention/kv_quant.py) in the attention kernels: the Triton backend (fast and
batch-invariant variants) against the torch backend on the same float8_e4m3fn cache with non-unit k and
v scales: decode, chain verify of widths 2..8, tree masks, ragged batches, a sliding window, odd block
sizes and head dims; the new rows written byte for byte as the torch backend writes them; the MLA latent
kernel likewise. Without CUDA the kernels run in Triton's interpreter (conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.attention_cases import DEVICE, Case, make_case, poisoned_allocations
from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.context import forward_settings
from outpace.attention.kv_quant import FP8_KV_DTYPE, dequantize, quantize, store
from outpace.attention.mla_kernels import mla_paged_attention
from outpace.attention.torch_backend import TorchAttentionBackend, attend_paged, gather_blocks
from outpace.attention.triton_kernels import paged_attention, write_kv

K_SCALE, V_SCALE = 0.05, 0.03  # large values (x / 0.03 > 448) are clamped: both paths must agree


def fp8_case(case: Case, outliers: bool = True) -> tuple[Case, tuple[torch.Tensor, torch.Tensor]]:
    """``case`` with its caches quantized to FP8 under the test's scales (and a few new k/v values
    large enough to be clamped)."""
    scales = (
        torch.tensor(K_SCALE, device=DEVICE),
        torch.tensor(V_SCALE, device=DEVICE),
    )
    k, v = case.k.clone(), case.v.clone()
    if outliers:
        k[0, 0, :3] = torch.tensor([40.0, -50.0, 3.0])
        v[-1, -1, :2] = torch.tensor([-20.0, 30.0])
    fp8 = Case(
        case.q,
        k,
        v,
        quantize(case.k_cache, scales[0], FP8_KV_DTYPE),
        quantize(case.v_cache, scales[1], FP8_KV_DTYPE),
        case.meta,
        case.scale,
    )
    return fp8, scales


def positions_of(case: Case) -> torch.Tensor:
    """[num_tokens]: each new token's position (its KV row, causal layouts)."""
    m = case.meta
    return (m.seq_lens - m.query_lens)[m.token_seq_index] + m.token_query_index


def run_both(case: Case, scales, sliding_window=None, num_splits=None):
    """(torch backend's out and caches, the Triton kernels' out and caches), on fresh cache copies."""
    positions = positions_of(case) if sliding_window else None
    ref_caches = (case.k_cache.clone(), case.v_cache.clone())
    expected = TorchAttentionBackend().forward(
        case.q, case.k, case.v, ref_caches, case.meta, case.scale, sliding_window, positions, scales
    )
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    with poisoned_allocations():
        table = write_kv(case.k, case.v, k_cache, v_cache, case.meta, scales)
        out = paged_attention(
            case.q,
            k_cache,
            v_cache,
            case.meta,
            table,
            case.scale,
            num_splits=num_splits,
            sliding_window=sliding_window,
            positions=positions,
            kv_scales=scales,
        )
    return (expected, *ref_caches), (out, k_cache, v_cache)


def assert_same(case: Case, scales, **kwargs) -> None:
    (expected, k_ref, v_ref), (out, k_cache, v_cache) = run_both(case, scales, **kwargs)
    assert k_cache.dtype == FP8_KV_DTYPE and not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))


def test_quantize_convention():
    """stored = clamp(x / scale) in e4m3, read = stored * scale (not x * scale, not unclamped)."""
    x = torch.tensor([1.0, -3.0, 1000.0, 0.0])
    stored = quantize(x, torch.tensor(0.5), FP8_KV_DTYPE)
    assert stored.dtype == FP8_KV_DTYPE
    assert stored.float().tolist() == [2.0, -6.0, 448.0, 0.0]
    assert dequantize(stored, torch.tensor(0.5), torch.float32).tolist() == [1.0, -3.0, 224.0, 0.0]
    cache = torch.zeros(2, 2, 4, dtype=FP8_KV_DTYPE)
    store(cache, torch.tensor([3]), x[None], torch.tensor(0.5))
    assert cache[1, 1].float().tolist() == [2.0, -6.0, 448.0, 0.0] and not cache[0].float().any()


def test_write_rounds_as_torch():
    """The write kernel's float8 values equal torch's cast for every e4m3 value, the midpoints between
    neighbours (ties to even) and values just off them, subnormals and the clamp included."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8_KV_DTYPE).float()
    values = values[values.isfinite()].unique()  # [253] ascending
    mids = (values[1:] + values[:-1]) / 2
    x = torch.cat(
        (values, mids, mids * (1 + 2**-20), mids * (1 - 2**-20), torch.tensor([500.0, -1e4]))
    )
    x = torch.cat((x, x.new_zeros(-x.numel() % 128)))
    n = x.numel() // 128  # tokens of 128 values
    meta = build_paged_metadata([[1]], [0], [n], n, DEVICE)
    rows = x.view(n, 1, 128).to(DEVICE)
    caches = [torch.zeros(2, n, 1, 128, dtype=FP8_KV_DTYPE, device=DEVICE) for _ in range(2)]
    one = torch.tensor(1.0, device=DEVICE)
    write_kv(rows, rows, *caches, meta, (one, one))
    expected = quantize(x, one, FP8_KV_DTYPE).view(torch.uint8)
    assert torch.equal(caches[0][1].flatten().cpu().view(torch.uint8), expected)


LAYOUTS = {  # (cached rows, new tokens, tree window or None) per sequence
    "decode": ([37, 5, 130], [1, 1, 1], None),
    "tree": ([30, 12, 50], [5, 8, 3], [9, 8, 7]),
    "ragged": ([0, 17, 9], [40, 1, 4], None),
}
SHAPES = [(16, 32, 8, 2), (3, 12, 6, 2)]  # (block_size, head_dim, heads, kv_heads)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "bs{}-d{}-h{}-kv{}".format(*s))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_triton_reads_fp8_as_torch_does(layout, shape):
    block_size, head_dim, heads, kv_heads = shape
    cached, new, windows = LAYOUTS[layout]
    case = make_case(
        cached, new, windows, block_size=block_size, head_dim=head_dim, heads=heads,
        kv_heads=kv_heads, seed=list(LAYOUTS).index(layout),
    )  # fmt: skip
    assert_same(*fp8_case(case))


def test_chain_verify_widths():
    """Chains of 2 to 8 tokens, one sequence each, in one ragged verify batch."""
    widths = list(range(2, 9))
    case = make_case(
        [21, 6, 0, 40, 3, 9, 17], widths, block_size=5, head_dim=12, heads=4, kv_heads=2
    )
    assert_same(*fp8_case(case, outliers=False))
    assert_same(*fp8_case(case, outliers=False), num_splits=3)


def test_sliding_window():
    case = make_case([70, 9, 40], [1, 5, 3], block_size=8, head_dim=16, heads=4, kv_heads=1, seed=4)
    assert_same(*fp8_case(case), sliding_window=13)


def test_scales_are_applied():
    """The same fp8 bytes read with other scales give another output: the kernels use them."""
    case, scales = fp8_case(make_case([20], [1], seed=5))
    (_, _, _), (out, k_cache, v_cache) = run_both(case, scales)
    doubled = (scales[0], scales[1] * 2)
    table = write_kv(case.k, case.v, k_cache, v_cache, case.meta, scales)
    other = paged_attention(
        case.q, k_cache, v_cache, case.meta, table, case.scale, kv_scales=doubled
    )
    torch.testing.assert_close(other, out * 2, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="scales"):
        paged_attention(case.q, k_cache, v_cache, case.meta, table, case.scale)


@pytest.mark.parametrize("layout", ["decode", "tree"])
def test_batch_invariant_variant_reads_fp8(layout):
    cached, new, windows = LAYOUTS[layout]
    case = make_case(cached, new, windows, block_size=6, head_dim=12, heads=4, kv_heads=2, seed=7)
    with forward_settings(True):
        assert_same(*fp8_case(case))


@pytest.mark.parametrize("tree", [False, True])
def test_mla_kernel_reads_fp8_latents(tree):
    """The absorbed MLA kernel over an FP8 latent cache [c, k_pe] (one k scale for the row) against the
    torch path the eager layer takes (layers/mla.py): dequantized rows, the latents as values."""
    g = torch.Generator().manual_seed(11)
    rank, rope, heads, block_size = 24, 8, 4, 4
    cached, new = [13, 3], [3, 2]
    tables = [[1, 2, 3, 4], [5, 6]]
    masks = None
    if tree:
        masks = [
            torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device=DEVICE),
            torch.tensor([[1, 0], [0, 1]], dtype=torch.bool, device=DEVICE),
        ]
    meta = build_paged_metadata(tables, cached, new, block_size, DEVICE, masks)
    scale = torch.tensor(0.04, device=DEVICE)
    rows = torch.randn(7, block_size, 1, rank + rope, generator=g).to(DEVICE)
    cache = quantize(rows, scale, FP8_KV_DTYPE)
    q_latent = torch.randn(sum(new), heads, rank, generator=g).to(DEVICE)
    q_rope = torch.randn(sum(new), heads, rope, generator=g).to(DEVICE)
    out = mla_paged_attention(q_latent, q_rope, cache, meta, 0.3, k_scale=scale)
    gathered = dequantize(gather_blocks(cache, meta), scale, torch.float32)
    with forward_context(meta):
        expected = attend_paged(
            torch.cat((q_latent, q_rope), dim=-1), gathered, gathered[..., :rank], meta, 0.3
        )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    unscaled = mla_paged_attention(q_latent, q_rope, cache, meta, 0.3, k_scale=scale * 2)
    assert not torch.allclose(unscaled, out, atol=1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through Triton's interpreter")
def test_fused_mla_block_on_fp8_cache(monkeypatch):
    """The fused few-row MLA block (layers/mla_fused.py) against the eager layer under the torch backend
    on an FP8 latent cache with a non-unit scale: the rows it writes (quantized after its own norm and
    RoPE in float32: an element may round to the neighbouring e4m3 value) and its output."""
    import outpace.layers.mla as mla_module
    from outpace.attention.registry import get_backend
    from outpace.layers import mla_fused
    from outpace.layers.mla import MLAShape, MultiHeadLatentAttention
    from outpace.layers.rotary import RotaryEmbedding
    from outpace.layers.skinny_gemm import MAX_ROWS

    calls = []
    monkeypatch.setattr(MultiHeadLatentAttention, "fused", True)
    monkeypatch.setattr(mla_module, "fusable_rows", lambda x, w: x.shape[0] <= MAX_ROWS)
    real = mla_fused.mla_forward_fused
    monkeypatch.setattr(mla_fused, "mla_forward_fused", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    layer = MultiHeadLatentAttention(
        MLAShape(40, 3, 20, 36, 6, 8, 5, scale=0.3), RotaryEmbedding(8, 256, 10000.0)
    )
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.uniform_(0.5, 1.5) if "layernorm" in name else p.normal_(0.0, p.shape[-1] ** -0.5)
    layer.expand_min_query_len = 10**6  # always absorbed
    layer.k_scale.fill_(0.05)
    g = torch.Generator().manual_seed(4)
    masks = [torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool), None]
    meta = build_paged_metadata([[3, 1, 7], [5, 2]], [9, 5], [3, 2], 5, "cpu", masks)
    x = torch.randn(5, 40, generator=g)
    positions = (meta.seq_lens - meta.query_lens)[meta.token_seq_index] + meta.token_query_index
    start = quantize(torch.randn(8, 5, 1, 44, generator=g), torch.tensor(0.05), FP8_KV_DTYPE)
    results = []
    for backend in ("triton", "torch"):
        layer.bind_cache(8, 5, FP8_KV_DTYPE, "cpu")
        layer.cache_rows.copy_(start)
        with torch.no_grad(), forward_context(meta, get_backend(backend)):
            results.append((layer(positions, x), layer.cache_rows.clone()))
    (out, cache), (ref_out, ref_cache) = results
    assert calls == [1]
    same = cache.view(torch.uint8) == ref_cache.view(torch.uint8)
    assert same.float().mean() > 0.98, "the fused block's rows differ from the eager layer's"
    torch.testing.assert_close(cache.float(), ref_cache.float(), rtol=0.13, atol=2**-9)
    torch.testing.assert_close(out, ref_out, rtol=2e-2, atol=2e-3)
