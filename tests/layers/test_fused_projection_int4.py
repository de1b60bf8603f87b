"""The fused few-row stack over INT4 weights (layers/quant/int4_weight.py ``Int4Weight``: compressed-tensors'
pack-quantized projections, Gemma 4 QAT's): q/k/v and gate/up pack with their group scales, the quantized product
(format "int4_group") serves them with each epilogue on the GPU's normal path, and batch-invariant mode keeps them
off the fused stack (the quantized product is not batch-invariant). On the CPU the kernels run in Triton's
interpreter in float32; the GPU's answers of which kernel reads which weight are emulated where the test says so.
Gemma's layers: tests/layers/test_gemma_fused.py."""

import pytest
import torch

pytest.importorskip("triton")

from helpers.fused_decode import decode_forward, record_qkv_weights  # noqa: E402
from helpers.quantized_checkpoints import int4_config, is_projection, write_quantized  # noqa: E402
from helpers.spec_models import random_llama  # noqa: E402
from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers import fused_decoder  # noqa: E402
from outpace.layers.decoder import PackedProjection  # noqa: E402
from outpace.layers.quant.fp8_weight import Fp8Weight  # noqa: E402
from outpace.layers.quant.int4_weight import Int4Weight  # noqa: E402
from outpace.models.loader import load_model  # noqa: E402


@pytest.fixture(scope="module")
def int4_llama(tmp_path_factory):
    """(an INT4 Llama in Kimi-K2-Thinking's layout with groups of 8, its dequantized twin)."""
    tmp = tmp_path_factory.mktemp("int4_llama")
    src = random_llama(tmp / "src", vocab_size=50, seed=0, std=0.2)
    return write_quantized(src, tmp / "q", "int4_group", is_projection, int4_config(8))


def test_int4_projections_pack_with_their_group_scales(int4_llama):
    """q/k/v and gate/up pack as one INT4 weight each: every projection's stored words and scales become views of
    the packed rows, and the packed product is the parts' products side by side."""
    model = load_model(int4_llama[0], torch.float32, "cpu", progress=False)
    layer = model.model.layers[0]
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    for packed, parts in (
        (
            layer.self_attn.qkv,
            [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
        ),
        (layer.mlp.gate_up, [layer.mlp.gate_proj, layer.mlp.up_proj]),
    ):
        assert isinstance(packed, PackedProjection) and isinstance(packed.weight, Int4Weight)
        start = 0
        for part in parts:
            rows = part.out_features
            assert part.stored_weight.data_ptr() == packed.weight.rows(start).weight.data_ptr()
            assert part.scale.data_ptr() == packed.weight.rows(start).scale.data_ptr()
            start += rows
        torch.testing.assert_close(
            torch.cat(packed(x), dim=-1), torch.cat([p(x) for p in parts], dim=-1)
        )


def test_an_int4_weight_keeps_its_rows_scales():
    from outpace.layers.quant.dequantize import quantize_int4_group

    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(2))
    packed, scale = quantize_int4_group(w, 16)
    weight = Int4Weight(packed, scale, 16)
    assert weight.shape == (24, 64) and weight.scale_block == (1, 16)
    torch.testing.assert_close(weight.rows(5, 17).dequantized(), weight.dequantized()[5:17])
    halves = Int4Weight.packed([weight.rows(0, 7), weight.rows(7)])
    torch.testing.assert_close(halves.dequantized(), weight.dequantized())


def test_batch_invariant_mode_keeps_int4_off_the_fused_stack(int4_llama):
    """Outside the mode the fused layers read an INT4 projection through the quantized product; in it, nothing of
    theirs reads INT4 (``fused_weight`` None: the layer runs eagerly)."""
    model = load_model(int4_llama[0], torch.float32, "cpu", progress=False)
    attn = model.model.layers[0].self_attn
    assert isinstance(fused_decoder.fused_weight(attn.o_proj), Int4Weight)
    assert isinstance(fused_decoder.fused_weight(attn.qkv), Int4Weight)
    with forward_settings(batch_invariant=True):
        assert fused_decoder.fused_weight(attn.o_proj) is None
        assert fused_decoder.fused_weight(attn.qkv) is None


def test_int4_llama_runs_fused_where_the_gpu_leaves_int4_to_the_quantized_product(
    int4_llama, monkeypatch
):
    """The GPU's answers emulated (the fused kernels read no quantized weight on the normal path; the quantized
    product serves few rows of it), an INT4 Llama's decode forward runs every layer fused, its packed INT4 q/k/v
    through ``norm_project_qkv``, and gives the dequantized twin's logits and KV."""
    quantized, reference = int4_llama
    ref_logits, ref_caches = decode_forward(
        reference, monkeypatch, torch.float32, lambda x, w: False
    )
    few = lambda x, w: x.shape[0] <= 16  # noqa: E731 (the quantized product's rows)
    monkeypatch.setattr(fused_decoder, "fusable_qkv", few)
    monkeypatch.setattr(fused_decoder, "fusable_output", few)
    qkv_weights = record_qkv_weights(monkeypatch)
    logits, caches = decode_forward(
        quantized,
        monkeypatch,
        torch.float32,
        lambda x, w: few(x, w) and not isinstance(w, (Fp8Weight, Int4Weight)),
    )
    assert len(qkv_weights) == 2 and all(isinstance(w, Int4Weight) for w in qkv_weights)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
