"""The fused few-row projections over fp8 weights (layers/fused_projection.py ``Fp8Weight``) compute what they
compute over the dequantized weight (layers/quant/dequantize.py): block FP8 with N and K not multiples of the
block, bf16 scales, the per-tensor format, and every epilogue (plain, residual + next norm, SwiGLU, q/k/v with
RoPE and the cache write), on both paths: the fused kernels' fp8 stream (batch-invariant mode) and the
quantized product finishing its tiles with the epilogue (``_quantized_launch``, the normal path). On the CPU the
kernels run in Triton's interpreter in float32, where the only difference is the order of float32 sums; a scale
applied to the wrong block or divided fails them."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers.fused_projection import (
    _fp8_block_k,
    norm_project,
    norm_project_qkv,
    norm_project_qkv_gate,
    norm_project_swiglu,
    project_add,
    project_add_normed,
    project_rows,
)  # noqa: E402
from outpace.layers.norm import rms_norm_torch  # noqa: E402
from outpace.layers.normed_rows import normed_rows  # noqa: E402
from outpace.layers.quant.dequantize import (  # noqa: E402
    dequantize_fp8_block,
    dequantize_fp8_tensor,
    quantize_fp8_block,
    quantize_fp8_tensor,
)
from outpace.layers.quant.fp8_weight import Fp8Weight  # noqa: E402
from outpace.layers.rotary import RotaryEmbedding, rotary_torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
TOL = 1e-5 if DEVICE == "cpu" else 2e-2  # bf16 on the GPU


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=TOL):
    out, ref = out.double().cpu(), ref.double().cpu()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < tol, err


def _dtype():
    return torch.float32 if DEVICE == "cpu" else torch.bfloat16


def block_fp8(n: int, k: int, seed: int, block=(128, 128), scale_dtype=torch.float32):
    """(Fp8Weight on DEVICE, its dequantized float64 weight): rows of different ranges, so that every
    block has its own scale."""
    w = _rand(n, k, seed=seed) * (
        torch.rand(n, 1, generator=torch.Generator().manual_seed(seed)) * 3
    )
    weight, scale = quantize_fp8_block(w, block)
    scale = scale.to(scale_dtype)
    dense = dequantize_fp8_block(weight, scale, block).double()
    return Fp8Weight(weight.to(DEVICE), scale.to(DEVICE), block), dense


# the fused kernels' fp8 stream (batch-invariant mode) or the quantized product with the epilogue in its store
PATHS = pytest.mark.parametrize("invariant", [True, False], ids=["fused_kernel", "quantized"])


@PATHS
@pytest.mark.parametrize("m,n,k", [(1, 200, 300), (5, 130, 256), (16, 64, 1100)])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_project_rows_over_block_fp8_is_the_dequantized_product(m, n, k, scale_dtype, invariant):
    w, dense = block_fp8(n, k, seed=m + n, scale_dtype=scale_dtype)
    x = _rand(m, k, seed=m)
    with forward_settings(batch_invariant=invariant):
        out = project_rows(x.to(DEVICE, _dtype()), w)
    _close(out, F.linear(x.double(), dense))


@PATHS
def test_project_rows_over_narrow_scale_blocks(invariant):
    """64-column scale blocks: the K step shrinks to one block column (the fused kernels) or spans two (the
    quantized product)."""
    w, dense = block_fp8(96, 200, seed=3, block=(32, 64))
    x = _rand(3, 200, seed=4)
    with forward_settings(batch_invariant=invariant):
        out = project_rows(x.to(DEVICE, _dtype()), w)
    _close(out, F.linear(x.double(), dense))


@PATHS
@pytest.mark.parametrize("k", [300, 1100])
def test_project_rows_over_per_channel_fp8(k, invariant):
    """compressed-tensors' per-channel FP8 as blocks of one row (``Fp8Weight.per_channel``), on both paths."""
    from outpace.layers.quant.dequantize import dequantize_fp8_channel, quantize_fp8_channel

    raw = _rand(70, k, seed=7) * torch.rand(70, 1, generator=torch.Generator().manual_seed(7)) * 3
    weight, scale = quantize_fp8_channel(raw)
    dense = dequantize_fp8_channel(weight, scale).double()
    x = _rand(3, k, seed=8)
    w = Fp8Weight.per_channel(weight.to(DEVICE), scale.to(DEVICE))
    with forward_settings(batch_invariant=invariant):
        out = project_rows(x.to(DEVICE, _dtype()), w)
    _close(out, F.linear(x.double(), dense))


@PATHS
def test_project_rows_over_per_tensor_fp8(invariant):
    raw = _rand(70, 300, seed=5)
    weight, scale = quantize_fp8_tensor(raw)
    dense = dequantize_fp8_tensor(weight, scale).double()
    x = _rand(2, 300, seed=6)
    w = Fp8Weight.per_tensor(weight.to(DEVICE), scale.to(DEVICE))
    with forward_settings(batch_invariant=invariant):
        out = project_rows(x.to(DEVICE, _dtype()), w)
    _close(out, F.linear(x.double(), dense))


@PATHS
@pytest.mark.parametrize("m,k", [(4, 200), (16, 1100)])  # (1100: K split on the quantized path)
def test_project_add_normed_over_fp8_readies_the_stream(m, k, invariant):
    """The new stream, the stream times the next norm's scale (offset + weight), and partial sums of squares
    that sum to the stream's: what the next projection folds the norm in from."""
    w, dense = block_fp8(160, k, seed=7)
    x, res, nw = _rand(m, k, seed=8), _rand(m, 160, seed=9), _rand(160, seed=10)
    with forward_settings(batch_invariant=invariant):
        rows = project_add_normed(
            x.to(DEVICE, _dtype()), w, res.to(DEVICE, _dtype()), nw.to(DEVICE), next_offset=1.0
        )
    stream = res.double() + F.linear(x.double(), dense)
    _close(rows.stream, stream)
    _close(rows.normed, stream * (1.0 + nw.double()))
    _close(rows.sq_parts.sum(0), (stream * stream).sum(1))


@PATHS
def test_project_add_and_norm_project_over_fp8(invariant):
    """The residual add alone; a projection behind a norm (its factor from the rows' sums of squares), plain
    and relu(.)^2 (an ungated MLP's first half)."""
    w, dense = block_fp8(150, 260, seed=20)
    x, res, nw = _rand(3, 260, seed=21), _rand(3, 150, seed=22), _rand(260, seed=23)
    normed = rms_norm_torch(x.double(), nw.double(), EPS)[0]
    with forward_settings(batch_invariant=invariant):
        added = project_add(x.to(DEVICE, _dtype()), w, res.to(DEVICE, _dtype()))
        rows = normed_rows(x.to(DEVICE, _dtype()), nw.to(DEVICE))
        plain = norm_project(rows, EPS, w)
        squared = norm_project(rows, EPS, w, relu2=True)
    _close(added, res.double() + F.linear(x.double(), dense))
    _close(plain, F.linear(normed, dense))
    _close(squared, F.relu(F.linear(normed, dense)) ** 2)


@PATHS
def test_norm_project_swiglu_over_fp8_is_norm_gate_up_then_silu_mul(invariant):
    inter, k = 200, 300  # the up rows start inside a scale block's rows (200 = 128 + 72)
    w, dense = block_fp8(2 * inter, k, seed=11)
    x, nw = _rand(3, k, seed=12), _rand(k, seed=13)
    gate, up = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], dense).chunk(2, dim=-1)
    with forward_settings(batch_invariant=invariant):
        out = norm_project_swiglu(normed_rows(x.to(DEVICE, _dtype()), nw.to(DEVICE)), EPS, w)
    _close(out, F.silu(gate) * up)


def test_the_quantized_product_gates_silu_and_gelu_in_its_store(monkeypatch):
    """On the normal path the gating, SiLU's or GELU-tanh's (Gemma), is the quantized product's epilogue
    (``RowEpilogue.swiglu`` and ``gelu``): the product's output is the gated [M, inter], no launch after it."""
    from outpace.layers import fused_projection

    inter, k = 200, 300
    w, dense = block_fp8(2 * inter, k, seed=21)
    x, nw = _rand(3, k, seed=22), _rand(k, seed=23)
    gate, up = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], dense).chunk(2, dim=-1)
    rows = normed_rows(x.to(DEVICE, _dtype()), nw.to(DEVICE))
    gated = []
    real = fused_projection.quant_matmul

    def product(*args, epilogue=None, **kwargs):
        out = real(*args, epilogue=epilogue, **kwargs)
        gated.append((epilogue.swiglu, epilogue.gelu, out.shape[1]))
        return out

    monkeypatch.setattr(fused_projection, "quant_matmul", product)
    _close(norm_project_swiglu(rows, EPS, w), F.silu(gate) * up)
    _close(
        norm_project_swiglu(rows, EPS, w, act="gelu_pytorch_tanh"),
        F.gelu(gate, approximate="tanh") * up,
    )
    assert gated == [(True, False, inter), (True, True, inter)]


@pytest.mark.parametrize(
    "invariant,qk_norm,rotated_part",
    [(True, False, 1), (False, False, 1), (False, True, 1), (False, True, 2)],
    ids=["fused_kernel", "quantized_product", "quantized_qk_norm", "quantized_half_rotated"],
)
def test_norm_project_qkv_over_fp8_rotates_and_writes_the_cache(invariant, qk_norm, rotated_part):
    """In batch-invariant mode the fused kernel's q/k/v epilogue over the fp8 stream; otherwise the quantized
    product and the per-head kernel, which applies the input norm's factor itself (and the per-head norms,
    partial rotary)."""
    m, heads, kv_heads, head_dim, k_in = 3, 4, 2, 64, 200
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    w, dense = block_fp8(q_size + 2 * kv_size, k_in, seed=14)
    x, nw = _rand(m, k_in, seed=15), _rand(k_in, seed=16)
    qn, kn = _rand(head_dim, seed=18), _rand(head_dim, seed=19)
    rotary = RotaryEmbedding(head_dim // rotated_part, 512, 10000.0, None)
    positions = torch.tensor([5, 100, 511])
    slots = torch.tensor([7, 0, 12])
    k_cache = torch.zeros(4, 4, kv_heads, head_dim, dtype=_dtype())
    v_cache = torch.zeros_like(k_cache)
    qkv = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], dense)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.reshape(m, heads, head_dim), k.reshape(m, kv_heads, head_dim)
    if qk_norm:
        q, k = rms_norm_torch(q, qn.double(), EPS)[0], rms_norm_torch(k, kn.double(), EPS)[0]
    q_ref, k_ref = rotary_torch(positions, q, k, rotary.cos.double(), rotary.sin.double())
    caches = [c.to(DEVICE) for c in (k_cache, v_cache)]
    with forward_settings(batch_invariant=invariant):
        out = norm_project_qkv(
            normed_rows(x.to(DEVICE, _dtype()), nw.to(DEVICE)),
            EPS,
            w,
            head_dim,
            q_size,
            positions.to(DEVICE),
            rotary.cos.to(DEVICE),
            rotary.sin.to(DEVICE),
            *caches,
            slots.to(DEVICE),
            qk_norm=(qn.to(DEVICE), kn.to(DEVICE), EPS) if qk_norm else None,
        )
    _close(out, q_ref.reshape(m, q_size))
    _close(caches[0].view(-1, kv_size)[slots], k_ref.reshape(m, kv_size))
    _close(caches[1].view(-1, kv_size)[slots], v)


@pytest.mark.parametrize("interleaved", [False, True], ids=["gate_after_v", "gate_beside_q"])
@pytest.mark.parametrize("invariant", [False, True], ids=["quantized_product", "fused_kernel"])
def test_norm_project_qkv_gate_over_fp8_is_its_dequantized_weights(interleaved, invariant):
    """An attention output gate's rows in q/k/v's projection over an fp8 weight (Qwen3-Next-FP8's q_proj: a
    gate head beside each query head; or after v): the quantized product folds the input norm's factor into
    its store (the gate's products come out whole), the heads kernel does the rest; q, the cache writes and the
    gate as over the dequantized weight. In batch-invariant mode the fused kernel's fp8 stream."""
    m, heads, kv_heads, head_dim = 3, 4, 2, 64
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    gate_size = q_size if interleaved else heads
    w, dense = block_fp8(q_size + 2 * kv_size + gate_size, 200, seed=24)
    x, nw = _rand(m, 200, seed=25), _rand(200, seed=26)
    qn, kn = _rand(head_dim, seed=27), _rand(head_dim, seed=28)
    rotary = RotaryEmbedding(head_dim // 2, 512, 10000.0, None)  # (partial rotary)
    positions, slots = torch.tensor([5, 100, 511]), torch.tensor([7, 0, 12])
    args = (head_dim, q_size, gate_size, positions.to(DEVICE), rotary.cos.to(DEVICE))
    args += (rotary.sin.to(DEVICE),)
    outs = []
    for weight in (w, dense.to(DEVICE, _dtype())):  # (the reference in x's dtype: bf16 on the GPU)
        caches = [
            torch.zeros(4, 4, kv_heads, head_dim, dtype=_dtype(), device=DEVICE) for _ in "kv"
        ]
        with forward_settings(batch_invariant=invariant):
            q, gate = norm_project_qkv_gate(
                normed_rows(x.to(DEVICE, _dtype()), nw.to(DEVICE)),
                EPS,
                weight,
                *args,
                *caches,
                slots.to(DEVICE),
                qk_norm=(qn.to(DEVICE), kn.to(DEVICE), EPS),
                interleaved=interleaved,
            )
        outs.append((q, gate.float(), *caches))
    for got, want in zip(*outs):
        _close(got, want)


def test_rows_of_an_fp8_weight_keep_their_scales():
    w, dense = block_fp8(384, 256, seed=17)
    part = w.rows(128)
    x = _rand(2, 256, seed=18)
    _close(project_rows(x.to(DEVICE, _dtype()), part), F.linear(x.double(), dense[128:]))
    with pytest.raises(ValueError, match="cut a scale block of 128 rows"):
        w.rows(64)
    _close(project_rows(x.to(DEVICE, _dtype()), w.rows(0, 256)), F.linear(x.double(), dense[:256]))


def test_packed_fp8_weights_are_their_parts_one_after_another():
    (a, dense_a), (b, dense_b) = block_fp8(256, 200, seed=19), block_fp8(72, 200, seed=20)
    packed = Fp8Weight.packed([a, b])
    assert torch.equal(packed.dequantized().double().cpu(), torch.cat([dense_a, dense_b]))
    with pytest.raises(ValueError, match="not whole blocks of 128"):
        Fp8Weight.packed([b, a])


def test_the_k_step_lies_in_one_scale_column():
    assert _fp8_block_k(128) == 128
    assert _fp8_block_k(256) == 128
    assert _fp8_block_k(64) == 64
    assert _fp8_block_k(8) is None


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="16-column FP8 blocks (a model small enough to pack q/k/v in whole blocks): the GPU's fp8 prefill "
    "kernels take blocks of 64 columns or more (fp8_linear_kernel.py); the fused fp8 kernels' GPU checks "
    "are this file's others (the projections, norms and epilogues over fp8 weights)",
)
def test_fused_decoder_layers_over_block_fp8_compute_the_dequantized_model(tmp_path, monkeypatch):
    """A random Llama in block FP8 (q/k/v and gate/up packed as fp8 with their scales): its fused decode
    forward (forced on; the interpreter on the CPU) gives the dequantized twin's unfused logits and KV."""
    from helpers.fused_decode import decode_forward
    from helpers.quantized_checkpoints import block_fp8_config, is_projection, write_quantized
    from helpers.spec_models import random_llama

    src = random_llama(tmp_path / "src", vocab_size=50, seed=0, std=0.2)
    quantized, reference = write_quantized(
        src, tmp_path / "q", "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    ref_logits, ref_caches = decode_forward(
        reference, monkeypatch, torch.float32, lambda x, w: False
    )
    weights = []
    logits, caches = decode_forward(
        quantized, monkeypatch, torch.float32, lambda x, w: weights.append(w) or True
    )
    # the packed q/k/v (32 + 16 + 16 rows) in fp8
    assert any(isinstance(w, Fp8Weight) and w.shape[0] == 64 for w in weights), weights
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


def test_packable_takes_block_fp8_parts_of_whole_blocks_only():
    """q/k/v or gate/up pack in fp8 where every part but the last is whole blocks of rows and they share a
    block (per-tensor FP8: ``test_per_tensor_fp8_parts_pack_at_their_own_scales``); projections of mixed
    storage stay separate."""
    from torch import nn

    from outpace.layers.decoder import PackedProjection, packable
    from outpace.layers.quant.linear import FORMATS, QuantizedLinear
    from outpace.layers.quant.scheme import FP8_BLOCK, QuantScheme

    def fp8(out, block=(16, 16)):
        scheme = QuantScheme(FP8_BLOCK, "test", block=block)
        layer = QuantizedLinear(FORMATS[FP8_BLOCK](scheme), 32, out, False, torch.float32)
        layer.stored_weight.data, layer.scale.data = quantize_fp8_block(
            _rand(out, 32, seed=out), (16, 16)
        )
        return layer

    assert packable([fp8(32), fp8(16), fp8(16)])
    assert packable([fp8(32), fp8(8)])  # (the last part may end inside a block)
    assert not packable([fp8(8), fp8(32)])
    assert not packable([fp8(32), fp8(32, block=(32, 16))])
    assert not packable([fp8(32), nn.Linear(32, 32, bias=False)])
    q, k = fp8(32), fp8(16)
    before = [p.dequantized() for p in (q, k)]
    packed = PackedProjection([q, k])
    assert isinstance(packed.weight, Fp8Weight)
    for p, dense in zip((q, k), before):  # each projection now a view of its rows, values unchanged
        assert torch.equal(p.dequantized(), dense)
    x = _rand(3, 32, seed=7)
    for got, p in zip(packed(x), (q, k)):
        _close(got, F.linear(x.double(), p.dequantized().double()))


@PATHS
def test_per_tensor_fp8_parts_pack_at_their_own_scales(invariant):
    """ModelOpt's q/k/v (a scale each) pack as block FP8 of their rows' common divisor, each block at its
    part's scale (``Fp8Weight.packed_per_tensor``): each part's values unchanged, the packed product (both
    paths) each part's own; not beside a block-FP8 part."""
    from outpace.layers.decoder import PackedProjection, packable
    from outpace.layers.quant.linear import FORMATS, QuantizedLinear
    from outpace.layers.quant.scheme import FP8_BLOCK, FP8_TENSOR, QuantScheme

    def per_tensor(out, magnitude):
        layer = QuantizedLinear(
            FORMATS[FP8_TENSOR](QuantScheme(FP8_TENSOR, "test")), 40, out, False, torch.float32
        )
        layer.stored_weight.data, layer.scale.data = quantize_fp8_tensor(
            _rand(out, 40, seed=out) * magnitude
        )
        return layer

    parts = [per_tensor(48, 1.0), per_tensor(16, 30.0), per_tensor(24, 0.01)]  # rows' divisor: 8
    block = QuantizedLinear(
        FORMATS[FP8_BLOCK](QuantScheme(FP8_BLOCK, "test", block=(8, 16))),
        40,
        8,
        False,
        torch.float32,
    )
    assert not packable([parts[0], block])
    assert packable(parts)
    before = [p.dequantized() for p in parts]
    packed = PackedProjection(parts)
    assert packed.weight.block == (8, 64) and packed.weight.scale.shape == (11, 1)
    for p, dense in zip(parts, before):
        assert torch.equal(p.dequantized(), dense)
    x = _rand(3, 40, seed=9)
    weight = Fp8Weight(
        *(t.to(DEVICE) for t in (packed.weight.weight, packed.weight.scale)), (8, 64)
    )
    with forward_settings(batch_invariant=invariant):
        out = project_rows(x.to(DEVICE, _dtype()), weight)
    _close(out, F.linear(x.double(), torch.cat(before).double()))
