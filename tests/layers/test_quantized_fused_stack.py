"""The fused few-row stack over quantized weights as the GPU serves them on its normal path: the fused kernels read
no fp8 or INT4 weight there, the quantized product (layers/quant/quant_matmul_kernel.py) serves both with each
epilogue, and a block-FP8 or INT4 Llama decodes fused all the same (those answers emulated on the CPU, where the
kernels run in Triton's interpreter in float32). INT4 weights (layers/quant/int4_weight.py ``Int4Weight``:
compressed-tensors' pack-quantized projections, Gemma 4 QAT's) pack q/k/v and gate/up with their group scales, and
batch-invariant mode keeps them off the fused stack (the quantized product is not batch-invariant). Gemma's layers:
tests/layers/test_gemma_fused.py."""

import pytest
import torch

pytest.importorskip("triton")

from helpers.fused_decode import decode_forward, record_qkv_weights  # noqa: E402
from helpers.quantized_checkpoints import (  # noqa: E402
    block_fp8_config,
    int4_config,
    is_projection,
    write_quantized,
)
from helpers.spec_models import random_llama  # noqa: E402
from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers import fused_decoder  # noqa: E402
from outpace.layers.decoder import PackedProjection  # noqa: E402
from outpace.layers.quant.fp8_weight import Fp8Weight  # noqa: E402
from outpace.layers.quant.int4_weight import Int4Weight  # noqa: E402
from outpace.models.loader import load_model  # noqa: E402

# a format's quantization_config for the tests' small Llama: block FP8 in 16 x 16 blocks (q/k/v of 32, 16 and 16
# rows: whole blocks, so that they pack), INT4 in Kimi-K2-Thinking's layout with groups of 8
CONFIGS = {"fp8_block": lambda: block_fp8_config((16, 16)), "int4_group": lambda: int4_config(8)}
KERNEL_WEIGHTS = {"fp8_block": Fp8Weight, "int4_group": Int4Weight}


def quantized_llama(tmp, method: str):
    """(a small random Llama quantized as ``method``, its dequantized twin)."""
    src = random_llama(tmp / "src", vocab_size=50, seed=0, std=0.2)
    return write_quantized(src, tmp / "q", method, is_projection, CONFIGS[method]())


@pytest.fixture(scope="module")
def int4_llama(tmp_path_factory):
    return quantized_llama(tmp_path_factory.mktemp("int4_llama"), "int4_group")


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


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="16-column FP8 blocks: the GPU's fp8 prefill takes 64 or more"
)
@pytest.mark.parametrize("method", list(CONFIGS))
def test_a_quantized_llama_runs_fused_where_the_gpu_leaves_it_to_the_quantized_product(
    method, tmp_path, monkeypatch
):
    """The GPU's answers emulated (the fused kernels read no quantized weight on the normal path; the quantized
    product serves few rows of it: ``fusable_qkv``, ``fusable_output``), a block-FP8 or INT4 Llama's decode forward
    runs every layer fused, its packed q/k/v through ``norm_project_qkv``, and gives the dequantized twin's logits
    and KV. (The attention block asked ``fusable_rows`` until 2026-12-06, and Qwen3-30B-A3B-FP8's layers ran
    eagerly: 16 launches a layer against bf16's 11; INT4 q/k/v did not pack.)"""
    quantized, reference = quantized_llama(tmp_path, method)
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
    assert len(qkv_weights) == 2  # both layers
    assert all(isinstance(w, KERNEL_WEIGHTS[method]) for w in qkv_weights)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
