"""Step-3.5's attention on the fused few-row path (models/step3p5.py ``Step3p5Attention.forward_fused``: q/k/v
with their zero-centred head norms, RoPE and the cache write in one kernel, the head-wise gate's rows in
another), forced on with the kernels in Triton's interpreter on the CPU: a random Step-3.5 checkpoint of a
power-of-two head_dim gives the eager path's logits and KV cache after one decode forward; its sliding layers
(RoPE over whole heads) take the fused path, its full-attention ones (half of each head turned) do not."""

import pytest
import torch

pytest.importorskip("triton")

from helpers.fused_decode import decode_forward  # noqa: E402
from helpers.step3p5_checkpoints import CONFIG, TYPES, write_checkpoint  # noqa: E402
from outpace.models.step3p5 import Step3p5Attention  # noqa: E402


def test_step3p5_sliding_layers_fused_compute_the_eager_forward(tmp_path, monkeypatch):
    cfg = {
        **CONFIG,
        "head_dim": 16,
        "attention_other_setting": {**CONFIG["attention_other_setting"], "head_dim": 16},
    }
    path, _ = write_checkpoint(tmp_path, cfg)
    ref_logits, ref_caches = decode_forward(path, monkeypatch, torch.float32, lambda x, w: False)
    fused = []
    real = Step3p5Attention.forward_fused

    def counted(self, positions, x):
        fused.append(self.attn.sliding_window)
        return real(self, positions, x)

    monkeypatch.setattr(Step3p5Attention, "forward_fused", counted)
    logits, caches = decode_forward(path, monkeypatch, torch.float32, lambda x, w: True)
    sliding = TYPES[: cfg["num_hidden_layers"]].count("sliding_attention")
    assert fused == [cfg["sliding_window"]] * sliding  # every sliding layer fused, no full one
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
