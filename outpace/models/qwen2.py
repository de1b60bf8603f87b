"""Qwen2ForCausalLM: the Llama family's layers (models/llama.py) with biases on q, k and v, and
sliding windows on the layers from max_window_layers on; and the text model of a Qwen2-VL or Qwen2.5-VL
checkpoint: Qwen2's, its rotary sections (mrope_section) turning text positions as plain RoPE does (the three
position streams are equal)."""

from __future__ import annotations

from outpace.models.config_hooks import windows_of_layer_types
from outpace.models.llama import LlamaForCausalLM
from outpace.models.multimodal import TextOfMultimodal, own_text_name
from outpace.validation import ConfigFields


class Qwen2ForCausalLM(LlamaForCausalLM):
    class_defaults = {"max_position_embeddings": 32768, "num_key_value_heads": 32}  # Qwen2Config's

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        return {"attention_bias": True}  # Qwen2Attention: biases on q/k/v, always; none on o

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers Qwen2Config / Qwen3Config.__post_init__: sliding_window only with
        # use_sliding_window; without layer_types, the layers from max_window_layers on slide.
        # Qwen2Attention: a layer of type "sliding_attention" uses sliding_window (and
        # create_sliding_window_causal_mask needs one).
        sliding = cfg.boolean("use_sliding_window", False)
        window = cfg.optional_integer("sliding_window", 4096) if sliding else None
        first_sliding = cfg.integer("max_window_layers", 28, minimum=0)
        types = cfg.strings("layer_types") or [
            "sliding_attention" if window is not None and i >= first_sliding else "full_attention"
            for i in range(num_layers)
        ]
        return windows_of_layer_types(
            cfg, types, window, num_layers, "use_sliding_window and a sliding_window"
        )


class Qwen2VLTextForCausalLM(TextOfMultimodal, Qwen2ForCausalLM):
    """A Qwen2VLForConditionalGeneration or Qwen2_5_VLForConditionalGeneration checkpoint's text model (module
    docstring), the vision tower (``visual.*``) skipped."""

    TOWERS = ("visual",)
    text_name = staticmethod(own_text_name)
    # Qwen2VLTextConfig's and Qwen2_5_VLTextConfig's (their default_theta, 1e6)
    class_defaults = {
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "num_key_value_heads": 8,
    }

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        # the hub's configs name the sections' rope "mrope" (rope_scaling type), which transformers'
        # Qwen2VLTextConfig reads as the default RoPE over the sections
        out = super().config_overrides(cfg)
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type")) == "mrope":
            out["rope_scaling"] = None
        return out
