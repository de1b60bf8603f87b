"""Step-3.5's attention on the fused few-row path (models/step3p5.py ``Step3p5Attention.attend_rows``: q/k/v
and the head-wise gate's rows in one projection launch, then the per-head kernel: zero-centred head norms,
RoPE, the cache write), forced on with the kernels in Triton's interpreter on the CPU: a random Step-3.5 checkpoint of a
power-of-two head_dim gives the eager path's logits and KV cache after one decode forward, every layer fused
(the sliding ones turn whole heads, the full-attention ones half of each: the per-head kernel's partial
rotary); in bf16-style weights and in Step-3.5-Flash-FP8's layout (block-FP8 q/k/v through the quantized
product, g_proj kept in its dtype: projected apart, its input norm folded in as well)."""

import pytest
import torch

pytest.importorskip("triton")

from helpers.fused_decode import decode_forward  # noqa: E402
from helpers.quantized_checkpoints import (  # noqa: E402
    block_fp8_config,
    is_projection,
    write_quantized,
)
from helpers.step3p5_checkpoints import CONFIG, write_checkpoint  # noqa: E402
from outpace.layers.quant.fp8_weight import Fp8Weight  # noqa: E402
from outpace.models.step3p5 import Step3p5Attention  # noqa: E402

_INTERPRETER_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the interpreter's: the GPU's fp8 prefill takes scale blocks of 64 columns or more"
    " (fp8_linear_kernel.py says so), this checkpoint's are 8 (its hidden size is 40)",
)


@pytest.mark.parametrize(
    "weights",
    [
        "float32",
        pytest.param("block_fp8", marks=_INTERPRETER_ONLY),
        pytest.param("block_fp8_gate", marks=_INTERPRETER_ONLY),
    ],
)
def test_step3p5_layers_fused_compute_the_eager_forward(tmp_path, monkeypatch, weights):
    cfg = {
        **CONFIG,
        "head_dim": 16,
        "attention_other_setting": {**CONFIG["attention_other_setting"], "head_dim": 16},
    }
    (tmp_path / "source").mkdir()
    path, _ = write_checkpoint(tmp_path / "source", cfg)
    # Step-3.5-Flash-FP8: the head-wise gate g_proj stays unquantized; block_fp8_gate: it too in fp8, packed
    # after q/k/v (its rows projected in their launch, the input norm folded into the quantized product's store)
    if weights != "float32":
        path, _ = write_quantized(
            path,
            tmp_path,
            "fp8_block",
            lambda name: is_projection(name) and (weights != "block_fp8" or ".g_proj." not in name),
            block_fp8_config((8, 8)),  # (8-row blocks: the dense gate/up, 56 rows each, pack)
        )
    ref_logits, ref_caches = decode_forward(path, monkeypatch, torch.float32, lambda x, w: False)
    gated_in_one = []
    real_gate = Step3p5Attention.attend_rows.__globals__["attend_fused_qkv_gate"]
    monkeypatch.setattr(
        "outpace.models.step3p5.attend_fused_qkv_gate",
        lambda *a, **k: gated_in_one.append(1) or real_gate(*a, **k),
    )
    fused, packed, normalised = [], [], []
    real = Step3p5Attention.attend_rows

    def counted(self, positions, rows, eps):
        fused.append(self.attn.sliding_window)
        packed.append(type(self.in_proj.weight))
        normalised.append(isinstance(rows, torch.Tensor))
        return real(self, positions, rows, eps)

    monkeypatch.setattr(Step3p5Attention, "attend_rows", counted)
    logits, caches = decode_forward(path, monkeypatch, torch.float32, lambda x, w: True)
    windows = [
        cfg["sliding_window"] if t == "sliding_attention" else None
        for t in cfg["layer_types"][: cfg["num_hidden_layers"]]
    ]
    assert fused == windows  # every layer fused, full attention too
    assert set(packed) == {torch.Tensor if weights == "float32" else Fp8Weight}
    # the layers run as one fused stack, each reading the stream through its input norm
    # (Step3p5DecoderLayer.forward_fused): in block FP8 q/k/v through the quantized product and the per-head
    # kernel, the bf16 gate stored apart through a norm-folding launch of its own; a packed gate in q/k/v's
    # launch (``attend_fused_qkv_gate``) in float32 and in fp8
    assert set(normalised) == {False}
    assert len(gated_in_one) == (0 if weights == "block_fp8" else len(windows))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
