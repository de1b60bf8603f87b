"""Qwen3ForCausalLM: the Llama family's layers (models/llama.py) with per-head q/k RMSNorm, its
attention bias on q, k, v and o, and Qwen2's sliding windows (models/qwen2.py); and the text model of a
Qwen3VLForConditionalGeneration checkpoint (Qwen3-VL's dense models): Qwen3's, its rotary sections
(mrope_section, interleaved) turning text positions as plain RoPE does (the three position streams are equal) and
its DeepStack visual inputs absent for text."""

from __future__ import annotations

from outpace.models.multimodal import TextOfMultimodal
from outpace.models.qwen2 import Qwen2ForCausalLM
from outpace.validation import ConfigFields


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    # Qwen3Config's
    class_defaults = {"max_position_embeddings": 32768, "head_dim": 128, "num_key_value_heads": 32}

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        bias = cfg.boolean("attention_bias", False)  # Qwen3Attention: on q/k/v/o
        return {"attention_bias": bias, "attention_out_bias": bias, "qk_norm": True}


class Qwen3VLTextForCausalLM(TextOfMultimodal, Qwen3ForCausalLM):
    """A Qwen3VLForConditionalGeneration checkpoint's text model (module docstring), the vision tower skipped."""

    TOWERS = ("model.visual",)
    # Qwen3VLTextConfig's (its default_theta, 5e5)
    class_defaults = {
        "max_position_embeddings": 128000,
        "head_dim": 128,
        "rope_theta": 5e5,
        "num_key_value_heads": 32,
    }
