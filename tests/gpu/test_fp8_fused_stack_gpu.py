"""GPU-only (skipped without CUDA): a block-FP8 Qwen3-MoE (Qwen3-30B-A3B-FP8's layout at a small shape of
whole 128 x 128 blocks) decodes on the fused few-row stack with the GPU's own rules of which kernel serves which
weight (nothing forced): every layer's packed fp8 q/k/v through ``norm_project_qkv`` (the quantized product,
then the per-head kernel), and one decode forward's logits and KV caches those of the same checkpoint run
eagerly, to bf16 rounding. (Against the dequantized twin in float32 both paths are 0.11 apart on the H100: the
eager fp8 path quantizes its activations per token, 1 x 128; fused and eager were 0.0033 apart:
benchmarks/scripts/diag_fp8_fused_error.py. The CPU tests compare with the twin: test_fused_projection_fp8.py.)

Run: python -m pytest -q tests/gpu/test_fp8_fused_stack_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from helpers.fused_decode import decode_forward, record_qkv_weights
from helpers.hf_models import save_hf_model
from helpers.quantized_checkpoints import block_fp8_config, is_projection, write_quantized
from helpers.qwen3_moe_models import BLOCK_128, make_qwen3_moe
from outpace.layers import fused_decoder
from outpace.layers.quant.fp8_weight import Fp8Weight

pytestmark = pytest.mark.gpu  # (tests/conftest.py skips it without a CUDA device)


def test_block_fp8_qwen3_moe_decodes_on_the_fused_stack(tmp_path, monkeypatch):
    src = save_hf_model(make_qwen3_moe("renormalised", **BLOCK_128), tmp_path / "bf16")
    config = block_fp8_config((128, 128), modules_to_not_convert=["lm_head"])
    q_dir, _ = write_quantized(src, tmp_path, "fp8_block", is_projection, config, torch.bfloat16)
    eager_logits, eager_caches = decode_forward(
        q_dir, monkeypatch, torch.bfloat16, lambda x, w: False
    )
    qkv_weights = record_qkv_weights(monkeypatch)
    logits, caches = decode_forward(q_dir, monkeypatch, torch.bfloat16, fused_decoder.fusable_rows)
    assert len(qkv_weights) == 4 and all(isinstance(w, Fp8Weight) for w in qkv_weights)
    err = ((logits - eager_logits).norm() / eager_logits.norm()).item()
    assert err < 2e-2, err
    for c, r in zip(caches, eager_caches, strict=True):  # k and v as the fused kernel wrote them
        assert ((c - r).norm() / r.norm()).item() < 2e-2
