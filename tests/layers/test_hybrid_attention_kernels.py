"""The hybrid and Step-3.5 attentions' few-launch GPU path against their eager path: partial rotary in one
Triton launch (the unrotated dimensions copied through), the sigmoid output gate (per element: Qwen3-Next;
per head: Step-3.5) and Nemotron-H's relu2 as one kernel each, and the attentions with q/k/v (and g) packed
into one matmul. Without a GPU the kernels run in Triton's interpreter on CPU tensors (float32); the
modules' CUDA choice is forced there by making tensors report ``is_cuda``."""

import pytest
import torch

from helpers.hybrid_models import make_hybrid, save_hybrid
from helpers.kernel_checks import DEVICE, rand, rel
from helpers.step3p5_checkpoints import CONFIG as STEP_CONFIG
from helpers.step3p5_checkpoints import write_checkpoint
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.layers import fused_kernels
from outpace.layers.activation import (
    ACTIVATIONS,
    relu2,
    relu2_torch,
    sigmoid_gate,
    sigmoid_gate_torch,
)
from outpace.layers.fused_kernels import relu2_triton, rotary_triton, sigmoid_gate_triton
from outpace.layers.rotary import RotaryEmbedding, rotary_torch
from outpace.models.loader import load_model


def _packed_qwen_heads(n: int, heads: int, kv_heads: int, d: int, seed: int):
    """q, gate [n, heads, d] and k [n, kv_heads, d]: strided views of one packed Qwen3-Next projection
    [n, heads * [query | gate] | k | v], as GatedAttention reads them."""
    packed = rand(n, 2 * heads * d + 2 * kv_heads * d, seed=seed)
    q, gate = packed[:, : 2 * heads * d].view(n, heads, 2 * d).chunk(2, dim=-1)
    k = packed[:, 2 * heads * d : (2 * heads + kv_heads) * d].view(n, kv_heads, d)
    return q, gate, k


# ---- partial rotary --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head_dim,rotary_dim,heads,kv_heads",
    [(12, 6, 4, 2), (40, 10, 3, 1), (256, 64, 2, 1), (12, 12, 2, 2), (16, 4, 0, 2)],
)
def test_partial_rotary_kernel_matches_torch(head_dim, rotary_dim, heads, kv_heads, poisoned):
    """Rotated and passed-through columns, from strided views of a packed projection, bit for bit
    (float32: the same products and sums); 0 heads: k alone."""
    n = 7
    rope = RotaryEmbedding(rotary_dim, 64, 10000.0).to(DEVICE)
    q, _, k = _packed_qwen_heads(n, heads, kv_heads, head_dim, seed=head_dim + rotary_dim)
    positions = torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = rotary_triton(positions, q, k, rope.cos, rope.sin)
    ref = rotary_torch(positions, q, k, rope.cos, rope.sin)
    for o, r, x in zip(out, ref, (q, k)):
        assert o.shape == x.shape and o.is_contiguous() and torch.equal(o, r)
        assert torch.equal(o[..., rotary_dim:], x[..., rotary_dim:])  # passed through
    if heads:  # the rotated part turned: not the input
        assert not torch.equal(out[0][..., :rotary_dim], q[..., :rotary_dim])


def test_partial_rotary_torch_keeps_the_eager_bits():
    """The CPU path rotates the leading dimensions of the strided heads in place of the attentions' former
    contiguous copies and concatenations: the same bits."""
    n, d, r = 9, 12, 6
    rope = RotaryEmbedding(r, 64, 10000.0)
    q, _, k = _packed_qwen_heads(n, 4, 2, d, seed=5)
    q, k = q.cpu(), k.cpu()
    positions = torch.arange(n) * 3
    q_rot, k_rot = rope(positions, q[..., :r].contiguous(), k[..., :r].contiguous())
    before = torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)
    for now, then in zip(rope(positions, q, k), before):
        assert torch.equal(now, then)


def test_rotary_refuses_heads_narrower_than_the_table():
    rope = RotaryEmbedding(16, 8, 10000.0)
    q = torch.zeros(2, 1, 8)
    with pytest.raises(ValueError, match="rotated dimensions"):
        rotary_triton(torch.arange(2), q, q, rope.cos, rope.sin)
    interleaved = RotaryEmbedding(8, 8, 10000.0, interleaved=True)
    with pytest.raises(ValueError, match="whole heads"):
        interleaved(torch.arange(2), torch.zeros(2, 1, 12), torch.zeros(2, 1, 12))


# ---- the sigmoid output gate and relu2 --------------------------------------------------------------------


@pytest.mark.parametrize("n,heads,d", [(1, 3, 12), (5, 2, 40), (4, 4, 128)])
def test_sigmoid_gate_per_element_matches_torch(n, heads, d, poisoned):
    """Qwen3-Next's gate: the gate half of each head of the packed q projection, read strided."""
    _, gate, _ = _packed_qwen_heads(n, heads, 1, d, seed=d)
    x = rand(n, heads * d, seed=d + 1).view(n, heads, d)  # the attention output
    out = sigmoid_gate_triton(x, 4 * gate)
    assert out.is_contiguous()
    assert rel(out, sigmoid_gate_torch(x, 4 * gate)) < 1e-6  # exp may differ in the last bit


@pytest.mark.parametrize("n,heads,d", [(1, 4, 12), (6, 6, 40)])
def test_sigmoid_gate_per_head_matches_torch(n, heads, d, poisoned):
    """Step-3.5's gate: one value per head, the last columns of a packed [q | k | v | g] projection."""
    packed = rand(n, 3 * heads * d + heads, seed=heads) * 4
    g = packed[:, 3 * heads * d :]  # [n, heads], rows strided
    x = rand(n, heads, d, seed=heads + 1)
    # Step3p5Attention's former formula, over g_proj's own (contiguous) output
    ref = x * torch.sigmoid(g.contiguous())[..., None]
    assert rel(sigmoid_gate_triton(x, g[..., None]), ref) < 1e-6
    assert torch.equal(sigmoid_gate_torch(x, g[..., None]), ref)
    assert torch.equal(sigmoid_gate(x.cpu(), g.cpu()[..., None]), ref.cpu())  # the CPU path


@pytest.mark.parametrize("shape", [(1, 48), (7, 1500), (3, 5, 20)])
def test_relu2_matches_torch(shape, poisoned):
    """float32: relu is exact and the square one rounding, so bit for bit; NaN stays NaN."""
    x = rand(*shape, seed=shape[-1])
    x.view(-1)[:3] = torch.tensor([float("nan"), -0.0, 0.0])
    torch.testing.assert_close(relu2_triton(x), relu2_torch(x), rtol=0, atol=0, equal_nan=True)


def test_relu2_reads_strided_rows(poisoned):
    wide = rand(5, 3 * 70, seed=8)
    part = wide[:, 70:140]
    assert torch.equal(relu2_triton(part), relu2_torch(part))


def test_relu2_is_the_activation_and_keeps_the_eager_bits():
    x = rand(6, 33, seed=9, device="cpu")
    assert ACTIVATIONS["relu2"] is relu2
    assert torch.equal(relu2(x), torch.square(torch.nn.functional.relu(x)))


# ---- the attentions on their GPU path (forced on CPU tensors) -----------------------------------------------


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
    return load_model(
        save_hybrid(make_hybrid("qwen3_next"), tmp_path_factory.mktemp("qwen3_next")),
        torch.float32,
    )


@pytest.fixture(scope="module")
def step3p5(tmp_path_factory):
    path, _ = write_checkpoint(tmp_path_factory.mktemp("step3p5"), STEP_CONFIG)
    return load_model(path, torch.float32)


def _gpu_path_against_eager(attn, monkeypatch, n: int = 11) -> tuple[float, dict[str, int]]:
    """attn(positions, x) eager against the same call with every tensor reporting ``is_cuda`` (the packed
    matmul, the norm, rotary and gate kernels in the interpreter) -> (relative error, kernel calls)."""
    x, positions = rand(n, attn.q_proj.in_features, seed=n, device="cpu"), torch.arange(n) + 5
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
        eager = attn(positions, x)
    calls = {"rotary_triton": 0, "sigmoid_gate_triton": 0}
    for name in calls:
        kernel = getattr(fused_kernels, name)

        def counted(*args, _kernel=kernel, _name=name):
            calls[_name] += 1
            return _kernel(*args)

        monkeypatch.setattr(fused_kernels, name, counted)
    with monkeypatch.context() as m, torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
        m.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        kernels = attn(positions, x)
    return rel(kernels, eager), calls


def test_qwen3_next_attention_gpu_path_matches_eager(qwen3_next, monkeypatch):
    attn = qwen3_next.model.layers[1].self_attn  # the full-attention layer: head_dim 12, 6 rotated
    assert attn.qkv is not None and attn.qkv.sizes == [96, 24, 24]  # packed by load_model
    rel, calls = _gpu_path_against_eager(attn, monkeypatch)
    assert rel < 1e-5 and calls == {"rotary_triton": 1, "sigmoid_gate_triton": 1}


@pytest.mark.parametrize("layer", [0, 1])  # full (6 of 12 dimensions rotated), sliding (all 12)
def test_step3p5_attention_gpu_path_matches_eager(layer, step3p5, monkeypatch):
    attn = step3p5.model.layers[layer].self_attn
    heads = attn.attn.num_heads
    assert attn.in_proj is not None and attn.in_proj.sizes == [12 * heads, 24, 24, heads]
    rel, calls = _gpu_path_against_eager(attn, monkeypatch)
    assert rel < 1e-5 and calls == {"rotary_triton": 1, "sigmoid_gate_triton": 1}


def test_the_gpu_path_reads_the_packed_weight(qwen3_next, monkeypatch):
    """The checks above can fail: k and v swapped in the packed weight (not in the separate projections the
    eager path reads) change the GPU path's output."""
    attn = qwen3_next.model.layers[1].self_attn
    q, k, v = attn.qkv.weight.split(attn.qkv.sizes)
    monkeypatch.setattr(attn.qkv, "weight", torch.cat((q, v, k)))
    rel, _ = _gpu_path_against_eager(attn, monkeypatch)
    assert rel > 1e-2


# ---- CUDA only ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_kernels_bf16_on_cuda():
    n, heads, kv_heads, d, r = 5, 16, 2, 256, 64  # Qwen3-Next's attention shape
    rope = RotaryEmbedding(r, 4096, 10000000.0).cuda()
    q, gate, k = (t.bfloat16() for t in _packed_qwen_heads(n, heads, kv_heads, d, seed=1))
    positions = torch.randint(0, 4096, (n,), device="cuda")
    x = rand(n, heads, d, seed=2).bfloat16()
    up = rand(n, 12288, seed=3).bfloat16()
    with torch.inference_mode():
        rotated = rope(positions, q, k)
        gated, step_gated = sigmoid_gate(x, gate), sigmoid_gate(x, gate[..., :1])
        squared = ACTIVATIONS["relu2"](up)
    for o, ref in zip(rotated, rotary_torch(positions, q, k, rope.cos, rope.sin)):
        torch.testing.assert_close(o, ref)
    torch.testing.assert_close(gated, sigmoid_gate_torch(x, gate))
    torch.testing.assert_close(step_gated, sigmoid_gate_torch(x, gate[..., :1]))
    assert torch.equal(squared, relu2_torch(up))  # one rounding of an exact relu


@pytest.mark.gpu
def test_kernels_replay_in_a_cuda_graph():
    rope = RotaryEmbedding(16, 128, 10000.0).cuda()
    q, gate, k = _packed_qwen_heads(3, 4, 2, 64, seed=4)
    x, positions = rand(3, 4, 64, seed=5), torch.arange(3, device="cuda")

    def step():
        return *rope(positions, q, k), sigmoid_gate(x, gate), ACTIVATIONS["relu2"](x)

    with torch.inference_mode():
        step()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = step()
        for t, seed in ((q, 6), (gate, 7), (k, 8), (x, 9)):
            t.copy_(rand(*t.shape, seed=seed))
        positions.copy_(torch.tensor([100, 7, 50], device="cuda"))
        graph.replay()
        for o, r in zip(outputs, step()):
            assert torch.equal(o, r)
