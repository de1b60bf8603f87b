"""Qwen3ForCausalLM: the Llama family's layers (models/llama.py) with per-head q/k RMSNorm, its
attention bias on q, k, v and o, and Qwen2's sliding windows (models/qwen2.py)."""

from __future__ import annotations

from outpace.models.qwen2 import Qwen2ForCausalLM
from outpace.validation import ConfigFields


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        bias = cfg.boolean("attention_bias", False)  # Qwen3Attention: on q/k/v/o
        return {"attention_bias": bias, "attention_out_bias": bias, "qk_norm": True}
