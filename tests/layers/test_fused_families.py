"""The few-row fused path of the Gemma 3 / Gemma 4 families (layers/fused_sandwich.py over
layers/fused_projection.py) against the eager modules (layers/decoder.py's habits: the eager path is the
reference), in fp32 (on the CPU in Triton's interpreter), and on a GPU in bf16 by the real choice of path:

- the split stream (``SplitRows``: a sandwich norm's output not yet added to the stream) that o_proj and
  down hand on: added up, normalised into q/k/v (q/k norms, RoPE, KV write), gate/up (GELU-tanh) and a
  soft-capped head, and used as the next residual (odd shapes, 1 to 8 rows, a layer scalar);
- whole models: a decode (1 row a sequence) and a verify (2 to 8 rows a sequence) forward over caches
  longer than the sliding window, with sliding and global layers, give the eager logits and KV caches;
- a fused layer is four projection kernels, as a Llama layer: a stack of L fused Gemma layers launches
  4 L + 2 fused kernels (one row kernel in front, one behind), the head two;
- Step-3.5 (zero-centred norms, a head-wise sigmoid attention gate, SwiGLU clamps, RoPE over the first
  half of each head on full layers): every layer's attention (q/k/v, the gate's logits, o_proj with the
  gate in its loop) and the dense MLPs fused, the MoE eager, the same logits and caches;
- Gemma 4 MoE layers: all but the router's softmax and top-k and the experts fused (q/k/v, o_proj,
  the experts' and the router's input norms, the dense MLP, the three norms after the MLP and the
  experts).
"""

import pytest
import torch
import torch.nn.functional as F
import transformers

from helpers.gemma_models import GEMMA3_TEXT, GEMMA4_TEXT
from helpers.hf_models import save_hf_model
from helpers.step3p5_checkpoints import CONFIG as STEP_CONFIG
from helpers.step3p5_checkpoints import write_checkpoint
from outpace.layers import fused_projection
from outpace.layers.activation import ACTIVATIONS
from outpace.layers.fused_projection import (
    norm_project,
    norm_project_qkv,
    norm_project_swiglu,
    normed_rows,
    project_sandwich,
    stream_of,
)
from outpace.layers.norm import rms_norm_f32
from outpace.layers.rotary import RotaryEmbedding, rotary_torch

DEVICE = (
    "cuda" if torch.cuda.is_available() else "cpu"
)  # fp32 kernels: Triton's interpreter on the CPU
EPS = 1e-6
TOL = dict(rtol=2e-5, atol=2e-5)


def _rand(*shape, seed, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def _norm(x, weight, offset):
    return rms_norm_f32(x, weight, EPS, offset)


# ---- the split stream ----------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 5, 8])
def test_split_stream_through_a_sandwich_layer(m):
    """h -> mid = h + post(attn @ Wo.T) -> out = (mid + post_mlp(act @ Wd.T)) * scale, each a split
    stream from one kernel; every reader of a split stream (q/k/v, gate/up, the head, the next
    residual add) equals the eager formula on the added-up stream."""
    hidden, inter, heads, kv_heads, d = 44, 36, 3, 1, 8
    offset = 1.0  # Gemma 3's (1 + w) norms
    h, attn, act = _rand(m, hidden, seed=1), _rand(m, 20, seed=2), _rand(m, inter, seed=3)
    w_o, w_d = _rand(hidden, 20, seed=4, scale=0.3), _rand(hidden, inter, seed=5, scale=0.3)
    post, pre, post_mlp, nxt = (_rand(hidden, seed=s, scale=0.3) for s in (6, 7, 8, 9))
    scale = torch.tensor([0.7], device=DEVICE)

    mid_ref = h + _norm(F.linear(attn, w_o), post, offset)
    mid = project_sandwich(attn, w_o, h, (post, EPS, offset), (pre, offset))
    torch.testing.assert_close(stream_of(mid), mid_ref, **TOL)

    gate_up = _rand(2 * inter, hidden, seed=10, scale=0.3)
    g, u = F.linear(_norm(mid_ref, pre, offset), gate_up).chunk(2, dim=-1)
    swiglu = norm_project_swiglu(mid, EPS, gate_up, act="gelu_pytorch_tanh")
    torch.testing.assert_close(swiglu, ACTIVATIONS["gelu_pytorch_tanh"](g) * u, **TOL)

    out_ref = (mid_ref + _norm(F.linear(act, w_d), post_mlp, offset)) * 0.7
    out = project_sandwich(act, w_d, mid, (post_mlp, EPS, offset), (nxt, offset), scale)
    torch.testing.assert_close(stream_of(out), out_ref, **TOL)

    head = _rand(29, hidden, seed=11)
    logits = norm_project(out, EPS, head, softcap=0.5)
    ref = torch.tanh(F.linear(_norm(out_ref, nxt, offset), head) / 0.5) * 0.5
    torch.testing.assert_close(logits, ref, **TOL)

    qkv = _rand((heads + 2 * kv_heads) * d, hidden, seed=12, scale=0.3)
    q_norm, k_norm = _rand(d, seed=13, scale=0.3), _rand(d, seed=14, scale=0.3)
    rope = RotaryEmbedding(d, 64, 1e4, None).to(DEVICE)
    positions, slots = (
        torch.arange(m, device=DEVICE) * 3 + 1,
        torch.arange(m, device=DEVICE) * 2 + 1,
    )
    q, k, v = F.linear(_norm(out_ref, nxt, offset), qkv).split(
        [heads * d, kv_heads * d, kv_heads * d], dim=-1
    )
    q = _norm(q.view(m, heads, d), q_norm, offset)
    k = _norm(k.view(m, kv_heads, d), k_norm, offset)
    q, k = rotary_torch(positions, q, k, rope.cos, rope.sin)
    k_cache, v_cache = (torch.zeros(4, 8, kv_heads, d, device=DEVICE) for _ in range(2))
    q_out = norm_project_qkv(
        out,
        EPS,
        qkv,
        d,
        heads * d,
        positions,
        rope.cos,
        rope.sin,
        k_cache,
        v_cache,
        slots,
        qk_norm=(q_norm, k_norm, EPS),
        qk_offset=offset,
    )
    torch.testing.assert_close(q_out, q.reshape(m, -1), **TOL)
    torch.testing.assert_close(k_cache.view(-1, kv_heads, d)[slots], k, **TOL)
    torch.testing.assert_close(v_cache.view(-1, kv_heads, d)[slots], v.view(m, kv_heads, d), **TOL)


def test_a_split_stream_left_unnormed_adds_up_and_is_refused_as_a_norm_input():
    """Without a next norm (Gemma 4's per-layer branch reads the stream), no normed copies are written:
    the stream adds up (Gemma 4's plain-weight norm), and a norm reader refuses it."""
    x, w, h, post = (
        _rand(2, 12, seed=1),
        _rand(16, 12, seed=2),
        _rand(2, 16, seed=3),
        _rand(16, seed=4),
    )
    split = project_sandwich(x, w, h, (post, EPS, 0.0))
    torch.testing.assert_close(stream_of(split), h + _norm(F.linear(x, w), post, 0.0), **TOL)
    with pytest.raises(ValueError, match="next_norm"):
        norm_project(split, EPS, _rand(8, 16, seed=5))


def test_head_wise_gate_and_swiglu_clamp():
    """Step-3.5's pieces: o_proj over attention output whose heads are scaled by sigmoid(g_proj(x))
    (the gate inside o_proj's loop, 3 heads of 16), and SwiGLU clamped at a limit that bites."""
    from outpace.layers.fused_projection import project_add_normed
    from outpace.models.step3p5 import clamped_swiglu

    m, heads, d, hidden = 5, 3, 16, 28
    attn, logits = _rand(m, heads * d, seed=1), _rand(m, heads, seed=2, scale=2)
    w_o, h, nw = (
        _rand(hidden, heads * d, seed=3, scale=0.3),
        _rand(m, hidden, seed=4),
        _rand(hidden, seed=5),
    )
    gated = (attn.view(m, heads, d) * torch.sigmoid(logits)[..., None]).view(m, -1)
    mid = project_add_normed(attn, w_o, h, nw, next_offset=1.0, gate=(logits, d))
    torch.testing.assert_close(mid.stream, h + F.linear(gated, w_o), **TOL)
    torch.testing.assert_close(mid.normed, mid.stream * (1.0 + nw), **TOL)

    x, gate_up = _rand(m, hidden, seed=6, scale=2), _rand(2 * 24, hidden, seed=7, scale=0.5)
    g, u = F.linear(_norm(x, nw, 1.0), gate_up).chunk(2, dim=-1)
    out = norm_project_swiglu(normed_rows(x, nw, 1.0), EPS, gate_up, limit=0.3)
    torch.testing.assert_close(out, clamped_swiglu(g, u, 0.3), **TOL)
    assert not torch.allclose(out, clamped_swiglu(g, u, None), atol=1e-3)  # the clamp bites


# ---- whole models ----------------------------------------------------------------------------------------
# power-of-two head dims (the fused q/k norms need them); windows of 7 under contexts of 13 and 20
MODELS = {
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **dict(GEMMA3_TEXT, head_dim=8, num_hidden_layers=3, sliding_window_pattern=2)
    ),
    # no per-layer inputs: the layer scalar folds into the split stream
    "gemma4": lambda: transformers.Gemma4TextConfig(
        **dict(
            GEMMA4_TEXT,
            head_dim=8,
            global_head_dim=16,
            num_hidden_layers=3,
            hidden_size_per_layer_input=0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    ),
    # k = v on the full layer (its v is k_proj's output), with its own KV head count
    "gemma4-k-eq-v": lambda: transformers.Gemma4TextConfig(
        **dict(
            GEMMA4_TEXT,
            head_dim=8,
            global_head_dim=16,
            num_hidden_layers=3,
            hidden_size_per_layer_input=0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
        )
    ),
    # a MoE block beside every MLP: all but the router and the experts fused
    "gemma4-moe": lambda: transformers.Gemma4TextConfig(
        **dict(
            GEMMA4_TEXT,
            head_dim=8,
            global_head_dim=16,
            num_hidden_layers=3,
            hidden_size_per_layer_input=0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=24,
        )
    ),
}
# fused kernels of a forward of 3 layers and the head (normed_rows, projections, add_normed / stream_of,
# two_norm_tail): a fused stack is a row kernel, four projections a layer and a row kernel; the head a
# row kernel and one projection
KERNELS = {
    "gemma3": {"rows": 1 + 1, "projections": 4 * 3 + 1, "add": 1, "tail": 0, "pair": 0},
    "gemma4": {"rows": 1 + 1, "projections": 4 * 3 + 1, "add": 1, "tail": 0, "pair": 0},
    "gemma4-k-eq-v": {"rows": 1 + 1, "projections": 4 * 3 + 1, "add": 1, "tail": 0, "pair": 0},
    # a MoE layer: the attention half's row kernels, q/k/v and o_proj; the dense MLP's row kernel,
    # gate/up and down; one row kernel for the experts' and the router's input norms, one for the three
    # norms after the MLP and the experts
    "gemma4-moe": {
        "rows": 2 * 3 + 1,
        "projections": 4 * 3 + 1,
        "add": 3,
        "tail": 3,
        "pair": 3,
    },
    # Step (STEP below): dense layers the input norm when the layer before was not fused whole, q/k/v,
    # the gate, o_proj, gate/up, down; the MoE layer q/k/v, the gate and o_proj
    "step3p5": {"rows": 2 + 1, "projections": 5 + 3 + 5 + 5 + 1, "add": 0, "tail": 0, "pair": 0},
}
# Step-3.5: head_dim 16; layers 0 and 3 full (RoPE over the first half of each head, llama3-scaled), 1
# sliding MoE (its attention fused), 2 sliding dense with a SwiGLU clamp that bites; no MTP layers
STEP = dict(
    STEP_CONFIG,
    head_dim=16,
    attention_other_setting=dict(STEP_CONFIG["attention_other_setting"], head_dim=16),
    moe_layers_enum="1",
    swiglu_limits_shared=[0.0, 0.0, 0.05, 0.0],
    num_nextn_predict_layers=0,
)
LENS = [13, 20]


def _hf_checkpoint(variant, path):
    if variant == "step3p5":
        return write_checkpoint(path, STEP)[0]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(MODELS[variant](), dtype=torch.float32)
    with torch.no_grad():
        for name, t in hf.state_dict().items():
            if "norm" in name or "scal" in name:
                t.add_(torch.randn_like(t) * 0.1)
    return save_hf_model(hf.eval(), path)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """(variant, dtype) -> (the loaded model on DEVICE, its KV caches after prefilling LENS eagerly)."""
    from outpace.attention import build_paged_metadata, forward_context
    from outpace.attention.triton_backend import TritonAttentionBackend
    from outpace.cache.block_pool import BlockPool
    from outpace.cache.kv_cache import bind_kv_cache
    from outpace.models.loader import load_model

    cache = {}

    def get(variant, dtype=torch.float32):
        device = DEVICE
        if (variant, dtype) not in cache:
            path = _hf_checkpoint(variant, tmp_path_factory.mktemp(variant))
            model = load_model(path, dtype, device, progress=False)
            caches = bind_kv_cache(model.model, BlockPool(5, 16), dtype, device)
            ids = (torch.arange(sum(LENS)) * 7 % 61).to(device)
            positions = torch.cat([torch.arange(n) for n in LENS]).to(device)
            meta = build_paged_metadata(TABLES, [0, 0], LENS, 16, device)
            with torch.inference_mode(), forward_context(meta, TritonAttentionBackend()):
                model(ids, positions)
            cache[variant, dtype] = model, caches
        return cache[variant, dtype]

    return get


TABLES = [[3, 1], [0, 2]]


def _forward(model, caches, rows, fused, monkeypatch):
    """``rows`` new tokens a sequence after LENS, with the fused path off, or on (forced in fp32, the
    real choice in half precision) -> (logits [2 * rows, vocab], the KV caches after it); the caches
    are restored after."""
    import outpace.layers.fused_decoder as fused_decoder
    import outpace.layers.fused_sandwich as fused_sandwich
    from outpace.attention import build_paged_metadata, forward_context
    from outpace.attention.triton_backend import TritonAttentionBackend

    saved = [[t.clone() for t in c] for c in caches]
    device = caches[0][0].device
    if not fused or caches[0][0].dtype == torch.float32:
        for module in (fused_decoder, fused_sandwich):
            monkeypatch.setattr(module, "fusable_rows", lambda x, w: fused)
    ids = (torch.arange(2 * rows) * 5 % 61).to(device)
    positions = torch.cat([torch.arange(n, n + rows) for n in LENS]).to(device)
    meta = build_paged_metadata(TABLES, LENS, [rows, rows], 16, device)
    with torch.inference_mode(), forward_context(meta, TritonAttentionBackend()):
        logits = model.compute_logits(model(ids, positions).hidden_states)
    after = [torch.stack(c).clone() for c in caches]
    for c, s in zip(caches, saved):
        for t, v in zip(c, s):
            t.copy_(v)
    monkeypatch.undo()
    return logits, after


@pytest.mark.parametrize(
    "variant,rows",
    [
        ("gemma3", 1),
        ("gemma3", 3),
        ("gemma3", 8),
        ("gemma4", 1),
        ("gemma4", 8),
        ("gemma4-k-eq-v", 5),
        ("gemma4-moe", 2),
    ],
)
def test_fused_stack_equals_the_eager_one(variant, rows, family, monkeypatch):
    model, caches = family(variant)
    ref_logits, ref_caches = _forward(model, caches, rows, False, monkeypatch)
    calls = _count_kernels(monkeypatch)
    logits, fused_caches = _forward(model, caches, rows, True, monkeypatch)
    assert calls == KERNELS[variant]
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(fused_caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 4], ids=["decode", "verify4"])
def test_fused_step3p5_equals_the_eager_one(rows, family, monkeypatch):
    model, caches = family("step3p5")
    ref_logits, ref_caches = _forward(model, caches, rows, False, monkeypatch)
    calls = _count_kernels(monkeypatch)
    logits, fused_caches = _forward(model, caches, rows, True, monkeypatch)
    assert calls == KERNELS["step3p5"]
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(fused_caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", list(KERNELS))
def test_bf16_on_the_gpu_the_fused_forward_is_the_eager_one(variant, family, monkeypatch):
    """bf16 on the GPU, the real kernels (PDL, pipelining) and the real choice of path: decode and an
    8-row verify take the fused kernels counted above and give the eager logits and caches to bf16
    rounding."""
    model, caches = family(variant, torch.bfloat16)
    for rows in (1, 8):
        ref_logits, ref_caches = _forward(model, caches, rows, False, monkeypatch)
        calls = _count_kernels(monkeypatch)
        logits, fused_caches = _forward(model, caches, rows, True, monkeypatch)
        assert calls == KERNELS[variant]
        torch.testing.assert_close(logits, ref_logits, rtol=3e-2, atol=3e-2)
        for c, r in zip(fused_caches, ref_caches):
            torch.testing.assert_close(c, r, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "hidden,inter,heads,kv_heads,d,v_norm",
    [(3840, 15360, 16, 8, 256, False), (2816, 2112, 16, 4, 512, True)],
    ids=["gemma-3-12b", "gemma-4-global-512"],
)
@pytest.mark.parametrize("m", [1, 8])
def test_bf16_public_shapes_split_stream_and_wide_heads(
    hidden, inter, heads, kv_heads, d, v_norm, m
):
    """The public shapes' kernels compile and fit (q/k/v over heads of 256 and 512 with their norms,
    the split stream's two-input loops) and compute the float32 formulas to bf16 rounding."""
    dev, bf = "cuda", torch.bfloat16

    def r(*shape, seed, scale=1.0):
        return _rand(*shape, seed=seed, scale=scale).to(dev, bf)

    h, attn, act = r(m, hidden, seed=1), r(m, heads * d, seed=2), r(m, inter, seed=3)
    w_o = r(hidden, heads * d, seed=4, scale=(heads * d) ** -0.5)
    w_d = r(hidden, inter, seed=5, scale=inter**-0.5)
    post, pre, post_mlp = (r(hidden, seed=s, scale=0.3) for s in (6, 7, 8))
    mid = project_sandwich(attn, w_o, h, (post, EPS, 1.0), (pre, 1.0))
    out = project_sandwich(act, w_d, mid, (post_mlp, EPS, 1.0), (pre, 1.0))
    f = {name: t.float() for name, t in dict(h=h, attn=attn, act=act, w_o=w_o, w_d=w_d).items()}
    mid_ref = f["h"] + _norm(F.linear(f["attn"], f["w_o"]), post.float(), 1.0)
    out_ref = mid_ref + _norm(F.linear(f["act"], f["w_d"]), post_mlp.float(), 1.0)
    torch.testing.assert_close(stream_of(out).float(), out_ref, rtol=2e-2, atol=2e-2)

    qkv = r((heads + 2 * kv_heads) * d, hidden, seed=9, scale=hidden**-0.5)
    q_norm, k_norm = r(d, seed=10, scale=0.3), r(d, seed=11, scale=0.3)
    rope = RotaryEmbedding(d, 4096, 1e4, None).to(dev)
    positions, slots = torch.arange(m, device=dev) * 37 + 5, torch.arange(m, device=dev) * 3 + 1
    k_cache, v_cache = (torch.zeros(4, 16, kv_heads, d, device=dev, dtype=bf) for _ in range(2))
    q = norm_project_qkv(
        out,
        EPS,
        qkv,
        d,
        heads * d,
        positions,
        rope.cos,
        rope.sin,
        k_cache,
        v_cache,
        slots,
        qk_norm=(q_norm, k_norm, EPS),
        qk_offset=1.0,
        v_norm=v_norm,
    )
    q_ref, k_ref, v_ref = F.linear(_norm(out_ref, pre.float(), 1.0), qkv.float()).split(
        [heads * d, kv_heads * d, kv_heads * d], dim=-1
    )
    q_ref = _norm(q_ref.view(m, heads, d), q_norm.float(), 1.0)
    k_ref = _norm(k_ref.view(m, kv_heads, d), k_norm.float(), 1.0)
    v_ref = v_ref.view(m, kv_heads, d)
    if v_norm:
        v_ref = rms_norm_f32(v_ref, None, EPS)
    q_ref, k_ref = rotary_torch(positions, q_ref, k_ref, rope.cos, rope.sin)
    torch.testing.assert_close(q.float(), q_ref.reshape(m, -1), rtol=3e-2, atol=3e-2)
    k_got = k_cache.view(-1, kv_heads, d)[slots].float()
    torch.testing.assert_close(k_got, k_ref, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(
        v_cache.view(-1, kv_heads, d)[slots].float(), v_ref, rtol=3e-2, atol=3e-2
    )


class _Counted:
    """A Triton kernel whose launches are counted under ``name`` in ``calls``."""

    def __init__(self, kernel, calls, name):
        self.kernel, self.calls, self.name = kernel, calls, name

    def __getitem__(self, grid):
        self.calls[self.name] += 1
        return self.kernel[grid]


def _count_kernels(monkeypatch) -> dict[str, int]:
    calls = {"rows": 0, "projections": 0, "add": 0, "tail": 0, "pair": 0}
    for attr, name in (
        ("_normed_rows_kernel", "rows"),
        ("_fused_rows_kernel", "projections"),
        ("_add_normed_kernel", "add"),
        ("_two_norm_tail_kernel", "tail"),
        ("_norm_pair_kernel", "pair"),
    ):
        kernel = getattr(fused_projection, attr)
        monkeypatch.setattr(fused_projection, attr, _Counted(kernel, calls, name))
    return calls
