"""Gemma's few-row fused path comes from the shared fused layers (layers/fused_projection.py,
layers/fused_sandwich.py): norm variants ((1 + w) and w, in float32), GELU-tanh gating, soft-capped logits, v norm,
the sandwich norms around attention and the MLP. On the CPU the kernels run in Triton's interpreter (fp32):
each variant equals its eager module, and a Gemma 3 and a Gemma 4 decode forward on the fused path equals the
eager one (logits and KV). On a GPU: tiny Gemma 3 / Gemma 4 targets under CUDA graphs and the Triton backend
(sliding windows, query_pre_attn_scalar, Gemma 4's scale 1.0) give the eager torch tokens in fp32."""

import pytest
import torch
import torch.nn.functional as F
import transformers

from helpers.gemma_models import GEMMA3_TEXT, GEMMA4_TEXT
from helpers.hf_models import save_hf_model
from outpace.layers.activation import ACTIVATIONS
from outpace.layers.fused_projection import (
    norm_project,
    norm_project_qkv,
    norm_project_swiglu,
    project_normed,
)
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.normed_rows import add_normed, normed_rows
from outpace.layers.rotary import RotaryEmbedding, rotary_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _rand(*shape, seed, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def _norm(dim, offset, seed, with_weight=True):
    norm = Float32RMSNorm(dim, EPS, offset=offset, with_weight=with_weight).to(DEVICE)
    if with_weight:
        norm.weight.data = _rand(dim, seed=seed, scale=0.3) + (1.0 - offset)
    return norm


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norm_variant_and_softcap_head(offset):
    x, w = _rand(3, 40, seed=1, scale=3), _rand(50, 40, seed=2)
    norm = _norm(40, offset, seed=3)
    ref = torch.tanh(F.linear(norm(x), w) / 2.0) * 2.0
    out = norm_project(normed_rows(x, norm.weight, offset), EPS, w, softcap=2.0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    plain = norm_project(
        normed_rows(x, norm.weight, 1.0 - offset), EPS, w, softcap=2.0
    )  # the other variant
    assert not torch.allclose(plain, ref, atol=1e-3)


def test_gelu_tanh_gate():
    x, gate_up = _rand(4, 32, seed=1, scale=2), _rand(2 * 24, 32, seed=2, scale=0.5)
    norm = _norm(32, 1.0, seed=3)
    g, u = F.linear(norm(x), gate_up).chunk(2, dim=-1)
    out = norm_project_swiglu(
        normed_rows(x, norm.weight, 1.0), EPS, gate_up, act="gelu_pytorch_tanh"
    )
    torch.testing.assert_close(out, ACTIVATIONS["gelu_pytorch_tanh"](g) * u, rtol=1e-5, atol=1e-5)
    silu = norm_project_swiglu(normed_rows(x, norm.weight, 1.0), EPS, gate_up)
    assert not torch.allclose(silu, out, atol=1e-3)


@pytest.mark.parametrize("split_heads", [False, True], ids=["fused", "split_heads"])
@pytest.mark.parametrize(
    "offset,v_norm,v_from_k",
    [(1.0, False, False), (0.0, True, False), (0.0, True, True)],
    ids=["gemma3", "gemma4", "gemma4-k-eq-v"],
)
def test_qkv_with_norm_variants_and_v_norm(offset, v_norm, v_from_k, split_heads):
    """q/k head norms with scale offset + w, v heads normalised without a weight (Gemma 4), partial RoPE;
    with ``v_from_k`` a weight of q and k rows only, v being k's projection before k's norm and RoPE."""
    m, heads, kv_heads, d, hidden = 3, 4, 2, 16, 32
    x, qkv = (
        _rand(m, hidden, seed=1, scale=2),
        _rand((heads + 2 * kv_heads) * d, hidden, seed=2, scale=0.3),
    )
    if (
        v_from_k
    ):  # (the v rows a copy of the k rows for the reference, left out of the kernel's weight)
        qkv[(heads + kv_heads) * d :] = qkv[heads * d : (heads + kv_heads) * d]
    norm, q_norm, k_norm = _norm(hidden, offset, 3), _norm(d, offset, 4), _norm(d, offset, 5)
    rope = RotaryEmbedding(
        d, 64, 1e4, {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    ).to(DEVICE)
    positions, slots = (
        torch.tensor([5, 17, 40], device=DEVICE),
        torch.tensor([2, 9, 13], device=DEVICE),
    )
    q, k, v = F.linear(norm(x), qkv).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = q_norm(q.view(m, heads, d)), k_norm(k.view(m, kv_heads, d)), v.view(m, kv_heads, d)
    if v_norm:
        v = Float32RMSNorm(d, EPS, with_weight=False)(v)
    q, k = rotary_torch(positions, q, k, rope.cos, rope.sin)
    k_cache, v_cache = (torch.zeros(4, 4, kv_heads, d, device=DEVICE) for _ in range(2))
    out = norm_project_qkv(
        normed_rows(x, norm.weight, offset),
        EPS,
        qkv[: (heads + kv_heads) * d] if v_from_k else qkv,
        d,
        heads * d,
        positions,
        rope.cos,
        rope.sin,
        k_cache,
        v_cache,
        slots,
        qk_norm=(q_norm.weight, k_norm.weight, EPS),
        qk_offset=offset,
        v_norm=v_norm,
        split_heads=split_heads,
        v_from_k=v_from_k,
    )
    torch.testing.assert_close(out, q.reshape(m, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache.view(-1, kv_heads, d)[slots], k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_cache.view(-1, kv_heads, d)[slots], v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_sandwich_residual_add(offset):
    """stream + post_norm(x @ W.T) (times a layer scalar), made ready for the next norm."""
    x, w, stream = _rand(3, 24, seed=1, scale=2), _rand(40, 24, seed=2), _rand(3, 40, seed=3)
    post, after, scalar = (
        _norm(40, offset, 4),
        _norm(40, offset, 5),
        torch.tensor([0.7], device=DEVICE),
    )
    mid = stream + post(F.linear(x, w))
    rows = add_normed(
        project_normed(x, w, post.weight, offset), EPS, stream, (after.weight, offset)
    )
    torch.testing.assert_close(rows.stream, mid, rtol=1e-5, atol=1e-5)
    head = _rand(30, 40, seed=6)
    torch.testing.assert_close(
        norm_project(rows, EPS, head), F.linear(after(mid), head), rtol=1e-5, atol=1e-5
    )
    scaled = add_normed(project_normed(x, w, post.weight, offset), EPS, stream, scale=scalar)
    torch.testing.assert_close(scaled, mid * 0.7, rtol=1e-5, atol=1e-5)


# ---- whole layers -------------------------------------------------------------------------------------------
# power-of-two head dims (the fused q/k norms need them); Gemma 4 with per-layer inputs and wider full layers
LAYERS = {
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **dict(GEMMA3_TEXT, head_dim=8, num_hidden_layers=3)
    ),
    "gemma4": lambda: transformers.Gemma4TextConfig(
        **dict(
            GEMMA4_TEXT,
            head_dim=8,
            global_head_dim=16,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    ),
    # a MoE block in every layer: the attention blocks alone run fused (the full one, last as transformers
    # requires, has k = v: q and k packed, v from k's projection)
    "gemma4-moe": lambda: transformers.Gemma4TextConfig(
        **dict(
            GEMMA4_TEXT,
            head_dim=8,
            global_head_dim=16,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            attention_k_eq_v=True,
            num_global_key_value_heads=5,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=24,
        )
    ),
}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    cache = {}

    def get(variant):
        if variant not in cache:
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(
                LAYERS[variant](), dtype=torch.float32
            )
            with torch.no_grad():
                for name, t in model.state_dict().items():
                    if "norm" in name or "scal" in name:
                        t.add_(torch.randn_like(t) * 0.1)
            cache[variant] = save_hf_model(model.eval(), tmp_path_factory.mktemp(variant))
        return cache[variant]

    return get


def _decode(path, monkeypatch, fusable):
    """Prefill two sequences longer than the window of 7, then one decode forward with ``fusable``
    deciding the fused path -> (logits [2, vocab], the KV caches, layers that ran fused)."""
    import outpace.layers.fused_decoder as fused_decoder
    import outpace.layers.fused_sandwich as fused_sandwich
    from outpace.attention import build_paged_metadata, forward_context
    from outpace.attention.triton_backend import TritonAttentionBackend
    from outpace.cache.block_pool import BlockPool
    from outpace.cache.kv_cache import bind_kv_cache
    from outpace.models.loader import load_model

    model = load_model(path, torch.float32, DEVICE, progress=False)
    backend, tables, lens = TritonAttentionBackend(), [[3, 1], [0, 2]], [13, 20]
    caches = bind_kv_cache(model.model, BlockPool(5, 16), torch.float32, DEVICE)
    ids = (torch.arange(sum(lens)) * 7 % 211).to(DEVICE)
    positions = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    with (
        torch.inference_mode(),
        forward_context(build_paged_metadata(tables, [0, 0], lens, 16, DEVICE), backend),
    ):
        model(ids, positions)
    fused = []
    monkeypatch.setattr(
        fused_decoder, "fusable_rows", fusable
    )  # (the head's rule and fusable_qkv's)
    for module, name in [
        ("outpace.models.gemma", "sandwich_rows_fused"),
        ("outpace.models.gemma4", "sandwich_rows_fused"),
        ("outpace.models.gemma4", "attention_block_fused"),  # (a MoE layer's attention block)
    ]:
        real = getattr(fused_sandwich, name)
        monkeypatch.setattr(
            f"{module}.{name}", lambda *a, real=real, **kw: fused.append(1) or real(*a, **kw)
        )
    with (
        torch.inference_mode(),
        forward_context(build_paged_metadata(tables, lens, [1, 1], 16, DEVICE), backend),
    ):
        out = model(torch.tensor([7, 8], device=DEVICE), torch.tensor(lens, device=DEVICE))
        logits = model.compute_logits(out.hidden_states)
    monkeypatch.undo()
    return logits.float(), [torch.stack(c).float() for c in caches], len(fused)


@pytest.mark.parametrize("variant", list(LAYERS))
def test_fused_gemma_layers_compute_what_the_eager_ones_do(variant, gemma, monkeypatch):
    ref_logits, ref_caches, none = _decode(gemma(variant), monkeypatch, lambda x, w: False)
    logits, caches, fused = _decode(gemma(variant), monkeypatch, lambda x, w: True)
    assert (none, fused) == (0, 3), "every layer should run fused"
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


# (quantization, config): a Gemma 3 in block FP8 (q, k and v of 32, 16 and 16 rows: whole 16-row blocks, so that
# they pack) and a Gemma 4 in INT4 (Gemma 4 QAT's layout, groups of 8: every width a multiple of 8), both
# with their q/k/v packed
QUANTIZED_GEMMAS = {
    "fp8-gemma3": lambda: transformers.Gemma3TextConfig(
        **dict(
            GEMMA3_TEXT,
            head_dim=8,
            num_hidden_layers=3,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ),
    "int4-gemma4": lambda: transformers.Gemma4TextConfig(
        **dict(
            GEMMA4_TEXT,
            hidden_size=64,
            intermediate_size=96,
            num_attention_heads=4,
            head_dim=8,
            global_head_dim=16,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    ),
}


@pytest.mark.skipif(
    DEVICE == "cuda", reason="16-column FP8 blocks: the GPU's fp8 prefill takes 64 or more"
)
@pytest.mark.parametrize("variant", list(QUANTIZED_GEMMAS))
def test_quantized_gemma_runs_fused_where_the_gpu_leaves_it_to_the_quantized_product(
    variant, tmp_path, monkeypatch
):
    """On the GPU outside batch-invariant mode the fused kernels read no fp8 or INT4 weight (``fused_rows_apply``
    says no) and the quantized product serves them (``fusable_qkv``). Those answers emulated, a Gemma 3 in block
    FP8 and a Gemma 4 in INT4 still run every layer fused (q/k/v through the quantized product and the per-head
    kernel, the GELU-tanh gating and the sandwich norms readied in the product's store) and give the dequantized
    twin's logits and KV. (Gemma's layers asked ``fusable_rows``: Gemma-3-12B in FP8 ran eagerly, 970 launches a
    step against bf16's 443; INT4 projections did not pack and ran eagerly everywhere.)"""
    import outpace.layers.fused_sandwich as fused_sandwich
    from helpers.quantized_checkpoints import (
        block_fp8_config,
        int4_config,
        is_projection,
        write_quantized,
    )
    from outpace.layers.quant.fp8_weight import Fp8Weight
    from outpace.layers.quant.int4_weight import Int4Weight

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        QUANTIZED_GEMMAS[variant](), dtype=torch.float32
    )
    src = save_hf_model(model.eval(), tmp_path / "src")
    method, config = (
        ("fp8_block", block_fp8_config((16, 16)))
        if variant.startswith("fp8")
        else ("int4_group", int4_config(8))
    )
    quantized, reference = write_quantized(src, tmp_path / "q", method, is_projection, config)
    ref_logits, ref_caches, _ = _decode(reference, monkeypatch, lambda x, w: False)
    monkeypatch.setattr(fused_sandwich, "fusable_qkv", lambda x, w: x.shape[0] <= 16)
    logits, caches, fused = _decode(
        quantized,
        monkeypatch,
        lambda x, w: x.shape[0] <= 16 and not isinstance(w, (Fp8Weight, Int4Weight)),
    )
    assert fused == 3, "every layer should run fused"
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(LAYERS))
def test_cuda_graphs_and_triton_give_the_eager_tokens(variant, gemma):
    """fp32 on the GPU: CUDA graphs and the Triton backend (windows of 7 under 40-token sequences) give
    the tokens of eager torch attention."""
    from outpace import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[3, 17, 99, 150, 8, 42, 7, 3, 17, 99, 150, 8, 61, 5], [5, 9, 200]]
    runs = {}
    for name, engine in {
        "eager": dict(attention_backend="torch", cuda_graphs=False),
        "graphs": dict(attention_backend="triton", cuda_graphs=True),
    }.items():
        llm = LLM(str(gemma(variant)), device="cuda", dtype="float32", block_size=16, **engine)
        runs[name] = [o.token_ids for o in llm.generate(prompts, params)]
    assert runs["graphs"] == runs["eager"]
