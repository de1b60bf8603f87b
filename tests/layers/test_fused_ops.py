"""The fused Triton kernels (add + RMSNorm, RoPE, silu_and_mul) against their torch references, and the
decoder layer's fused residual path against the unfused formulation. Without a GPU the kernels run
in Triton's interpreter on CPU tensors (float32); the bf16 and CUDA-graph checks need a GPU."""

import pytest
import torch

from helpers.kernel_checks import DEVICE, rand, rel
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.layers import fused_kernels
from outpace.layers.activation import silu_and_mul, silu_and_mul_torch
from outpace.layers.fused_kernels import (
    rms_norm_triton,
    rotary_triton,
    silu_and_mul_triton,
)
from outpace.layers.norm import Float32RMSNorm, RMSNorm, rms_norm_f32, rms_norm_torch
from outpace.layers.rotary import RotaryEmbedding, rotary_torch
from outpace.models.loader import load_model


@pytest.mark.parametrize("shape", [(1, 48), (7, 200), (33, 128), (3, 5, 12)])
def test_add_rms_norm_matches_torch(shape, poisoned):
    x, residual = rand(*shape, seed=1), rand(*shape, seed=2)
    weight = rand(shape[-1], seed=3)
    out, stream = rms_norm_triton(x, weight, 1e-5, residual)
    ref_out, ref_stream = rms_norm_torch(x, weight, 1e-5, residual)
    assert torch.equal(stream, ref_stream)  # one float32 add, the same rounding
    assert rel(out, ref_out) < 1e-6  # only the reduction order differs


@pytest.mark.parametrize("shape", [(1, 48), (9, 200), (4, 6, 32)])  # (4, 6, 32): per-head q/k norm
def test_rms_norm_without_residual_matches_torch(shape, poisoned):
    x, weight = rand(*shape, seed=4), rand(shape[-1], seed=5)
    out, stream = rms_norm_triton(x, weight, 1e-6)
    assert stream is x
    assert rel(out, rms_norm_torch(x, weight, 1e-6)[0]) < 1e-6


def test_rms_norm_reads_strided_rows():
    """EAGLE3's aux norm reads column chunks of a wider tensor: rows with a stride > dim."""
    wide, weight = rand(5, 3 * 40, seed=6), rand(40, seed=7)
    part = wide[:, 40:80]
    assert rel(rms_norm_triton(part, weight, 1e-6)[0], rms_norm_torch(part, weight, 1e-6)[0]) < 1e-6


@pytest.mark.parametrize("offset", [0.0, 1.0, None])  # None: no weight (Gemma 4's bare norms)
@pytest.mark.parametrize("with_residual", [False, True])
def test_float32_weight_norm_matches_torch(offset, with_residual, poisoned):
    """``Float32RMSNorm``'s kernel path (the weight, or 1 + weight, applied in float32 before the cast; the
    residual add fused) against its torch path, at an odd width and over strided heads."""
    x = rand(6, 3, 40, seed=11)[:, 1]  # [6, 40], rows strided
    residual = rand(6, 40, seed=12) if with_residual else None
    norm = Float32RMSNorm(40, 1e-6, offset=offset or 0.0, with_weight=offset is not None).to(DEVICE)
    if norm.weight is not None:
        with torch.no_grad():
            norm.weight.copy_(rand(40, seed=13))
    with torch.no_grad():
        got = norm(x) if residual is None else norm(x, residual)
    stream = x if residual is None else x + residual
    weight = None if norm.weight is None else norm.weight.detach()
    expected = rms_norm_f32(stream, weight, 1e-6, offset or 0.0)
    got_norm, got_stream = (got, x) if residual is None else got
    if DEVICE == "cpu":  # the module's CPU path is the torch one: the kernel itself here
        got_norm, got_stream = rms_norm_triton(x, weight, 1e-6, residual, offset or 0.0)
    assert rel(got_norm, expected) < 1e-6
    assert torch.equal(got_stream, stream)


def test_norm_reads_heads_of_a_packed_projection_in_place(poisoned, monkeypatch):
    """Per-head q/k norms over [tokens, heads, dim] views of a packed projection (token stride > heads * dim):
    read with both strides, no copy made first."""
    packed = rand(5, 3 * 4 * 16 + 7, seed=21)  # [tokens, q | k | v | more]
    heads = packed[:, 16 : 16 + 4 * 16].view(5, 4, 16)  # [5, 4, 16], strides (199, 16, 1)
    weight = rand(16, seed=22)
    flattened = []  # fused_kernels._rows flattens (and so copies) a tensor that is not a view of rows
    real_rows = fused_kernels._rows
    monkeypatch.setattr(fused_kernels, "_rows", lambda t: flattened.append(t) or real_rows(t))
    got, _ = rms_norm_triton(heads, weight, 1e-6, None, 1.0)
    assert not flattened and got.shape == heads.shape
    assert rel(got, rms_norm_f32(heads, weight, 1e-6, 1.0)) < 1e-6


@pytest.mark.parametrize(
    "head_dim,q_heads,kv_heads", [(12, 6, 2), (32, 3, 1), (128, 4, 4), (64, 0, 2), (32, 2, 0)]
)
def test_rotary_matches_torch(head_dim, q_heads, kv_heads, poisoned):
    """q and k are strided views of one [n, (q_heads + 2 kv_heads) * head_dim] projection; 0 heads is
    DFlash's way of rotating k (or q) alone."""
    n = 9
    rope = RotaryEmbedding(head_dim, 64, 10000.0).to(DEVICE)
    qkv = rand(n, (q_heads + 2 * kv_heads) * head_dim, seed=head_dim)
    q = qkv[:, : q_heads * head_dim].view(n, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(n, kv_heads, head_dim)
    positions = torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(head_dim)).to(
        DEVICE
    )
    out = rotary_triton(positions, q, k, rope.cos, rope.sin)
    ref = rotary_torch(positions, q, k, rope.cos, rope.sin)
    for o, r in zip(out, ref):  # float32: the same products and sums, rounded the same way
        assert o.shape == r.shape and torch.equal(o, r)


@pytest.mark.parametrize("shape", [(1, 48), (7, 200), (3, 5, 1500)])
def test_silu_and_mul_matches_torch(shape, poisoned):
    gate, up = rand(*shape, seed=8) * 4, rand(*shape, seed=9)
    assert rel(silu_and_mul_triton(gate, up), silu_and_mul_torch(gate, up)) < 1e-6


def test_silu_and_mul_reads_the_halves_of_a_packed_projection(poisoned):
    packed = (
        rand(5, 2 * 300, seed=12) * 4
    )  # [rows, gate | up], as a packed gate_up projection gives
    gate, up = packed.chunk(2, dim=-1)
    assert not gate.is_contiguous()
    assert rel(silu_and_mul_triton(gate, up), silu_and_mul_torch(gate, up)) < 1e-6


def test_rms_norm_module_returns_the_normed_tensor_or_the_pair():
    norm = RMSNorm(48, 1e-6)
    x, residual = rand(3, 48, seed=10, device="cpu"), rand(3, 48, seed=11, device="cpu")
    assert torch.equal(norm(x), rms_norm_torch(x, norm.weight, 1e-6)[0])
    out, stream = norm(x, residual)
    assert torch.equal(stream, x + residual) and torch.equal(out, norm(x + residual))


def test_decoder_layers_match_the_unfused_residual_adds(llama_dir):
    """forward / forward_residual / the model's output and captured layer inputs against
    ``h = h + attn(norm(h)); h = h + mlp(norm(h))``, bit for bit on the CPU."""
    model = load_model(llama_dir, torch.float32)
    layers = model.model.layers
    model.set_aux_hidden_state_layers((0, 2, len(layers), 1))
    n = 10
    ids, positions = (
        torch.randint(0, 200, (n,), generator=torch.Generator().manual_seed(0)),
        torch.arange(n),
    )
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
        out = model(ids, positions)
        h, inputs = model.embed(ids), []
        for layer in layers:
            inputs.append(h)
            assert torch.equal(layer(positions, h), _unfused(layer, positions, h))
            h = _unfused(layer, positions, h)
    assert torch.equal(out.hidden_states, h)
    assert torch.equal(
        out.aux_hidden_states, torch.cat([inputs[0], inputs[2], h, inputs[1]], dim=-1)
    )


def _unfused(layer, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    h = h + layer.self_attn(positions, layer.input_layernorm(h))
    return h + layer.mlp(layer.post_attention_layernorm(h))


# ---- CUDA only ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "x_dtype,residual_dtype,weight_dtype",
    [
        (torch.bfloat16, torch.bfloat16, torch.bfloat16),
        (
            torch.bfloat16,
            torch.float32,
            torch.float32,
        ),  # autocast: bf16 projections, float32 stream and weights
    ],
)
def test_add_rms_norm_bf16_on_cuda(x_dtype, residual_dtype, weight_dtype):
    x, residual = (
        rand(37, 4096, seed=12, dtype=x_dtype),
        rand(37, 4096, seed=13, dtype=residual_dtype),
    )
    weight = rand(4096, seed=14, dtype=weight_dtype)
    norm = RMSNorm(4096).cuda()
    norm.weight.data = weight
    with torch.inference_mode():
        out, stream = norm(x, residual)
        single = norm(x)
    ref_out, ref_stream = rms_norm_torch(x, weight, norm.eps, residual)
    assert torch.equal(stream, ref_stream)
    torch.testing.assert_close(out, ref_out)  # bf16 tolerance: an rsqrt ulp may flip a rounding
    torch.testing.assert_close(single, rms_norm_torch(x, weight, norm.eps)[0])


@pytest.mark.gpu
def test_rotary_and_silu_bf16_on_cuda():
    n, d = 21, 128
    rope = RotaryEmbedding(d, 4096, 500000.0).cuda()
    qkv = rand(n, (32 + 2 * 8) * d, seed=15, dtype=torch.bfloat16)
    q, k = qkv[:, : 32 * d].view(n, 32, d), qkv[:, 32 * d : 40 * d].view(n, 8, d)
    positions = torch.randint(0, 4096, (n,), device="cuda")
    gate, up = (
        rand(n, 14336, seed=16, dtype=torch.bfloat16),
        rand(n, 14336, seed=17, dtype=torch.bfloat16),
    )
    with torch.inference_mode():
        out = rope(positions, q, k)
        act = silu_and_mul(gate, up)
    for o, r in zip(out, rotary_torch(positions, q, k, rope.cos, rope.sin)):
        torch.testing.assert_close(o, r)
    torch.testing.assert_close(act, silu_and_mul_torch(gate, up))


@pytest.mark.gpu
def test_kernels_replay_in_a_cuda_graph():
    norm, rope = RMSNorm(256).cuda(), RotaryEmbedding(64, 128, 10000.0).cuda()
    x, residual = rand(5, 256, seed=18), rand(5, 256, seed=19)
    q, k, positions = (
        rand(5, 4, 64, seed=20),
        rand(5, 2, 64, seed=21),
        torch.arange(5, device="cuda"),
    )

    def step():
        out, stream = norm(x, residual)
        return out, stream, *rope(positions, q, k), silu_and_mul(x, residual)

    with torch.inference_mode():
        step()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = step()
        for t, seed in ((x, 22), (residual, 23), (q, 24), (k, 25)):
            t.copy_(rand(*t.shape, seed=seed))
        positions.copy_(torch.randint(0, 128, (5,), device="cuda"))
        graph.replay()
        for o, r in zip(outputs, step()):
            assert torch.equal(o, r)


@pytest.mark.gpu
def test_autograd_keeps_the_torch_path_on_cuda():
    """The kernels have no backward: with gradients on, the modules compute in torch."""
    norm = RMSNorm(64).cuda()
    x, residual = rand(3, 64, seed=26).requires_grad_(), rand(3, 64, seed=27).requires_grad_()
    out, stream = norm(x, residual)
    (out.sum() + stream.sum() + silu_and_mul(x, x).sum()).backward()
    assert norm.weight.grad is not None and x.grad is not None and residual.grad is not None
