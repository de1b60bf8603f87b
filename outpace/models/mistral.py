"""MistralForCausalLM: the Llama family's layers (models/llama.py) without biases, every layer sliding; Ministral 3's
text model (Ministral3ForCausalLM); and the text model of a Mistral3ForConditionalGeneration checkpoint (Mistral-Small-3.1
/ 3.2, Magistral-Small, Devstral-Small, whose text model is Mistral's, and the Ministral 3 releases, whose text model
is Ministral 3's)."""

from __future__ import annotations

from outpace.models.config_hooks import empty_if_all_full, windows_of_layer_types
from outpace.models.llama import LlamaForCausalLM
from outpace.models.multimodal import TextOfMultimodal, llava_text_name
from outpace.validation import ConfigFields

# transformers Ministral3Config.__post_init__'s rope_parameters where the config gives none
MINISTRAL3_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1e6,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's text models, and Ministral 3's (transformers' ministral3: Mistral's layers with the query
    scaled by position, ``llama_4_scaling_beta``, which the Llama family's rotary applies)."""

    query_scaling = True
    # MistralConfig's (MinistralConfig's too)
    class_defaults = {"max_position_embeddings": 131072, "num_key_value_heads": 8}

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        return {}  # MistralAttention and MistralMLP have no biases

    @classmethod
    def config_defaults(cls, cfg: ConfigFields) -> dict:
        if cfg.get("model_type") != "ministral3":
            return super().config_defaults(cfg)
        # Ministral3Config's; its __post_init__ gives rope_parameters where the file has none (a top-level
        # rope_theta then unread) and replaces a null head_dim by hidden_size // num_attention_heads
        defaults = {
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-5,
            "head_dim": 128,
            "num_key_value_heads": 8,
        }
        out = {k: v for k, v in defaults.items() if k not in cfg}
        if cfg.get("rope_parameters") is None and not cfg.get("rope_scaling"):
            out["rope_parameters"] = dict(MINISTRAL3_ROPE)
        return out

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers MistralConfig: sliding_window defaults to 4096, Ministral3Config's to None;
        # their attention applies it to every layer (None: full attention).
        default = None if cfg.get("model_type") == "ministral3" else 4096
        return empty_if_all_full((cfg.optional_integer("sliding_window", default),) * num_layers)


class MinistralForCausalLM(MistralForCausalLM):
    """transformers' Ministral (Ministral-8B's interleaved attention): Mistral's layers, each sliding or full as
    ``layer_types`` says (MinistralConfig derives them from ``sliding_window``: every layer alike when absent)."""

    query_scaling = False

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        window = cfg.optional_integer("sliding_window", 4096)
        kind = "sliding_attention" if window is not None else "full_attention"
        types = cfg.strings("layer_types") or [kind] * num_layers
        return windows_of_layer_types(cfg, types, window, num_layers, "a sliding_window")


class Mistral3TextForCausalLM(TextOfMultimodal, MistralForCausalLM):
    """A Mistral3ForConditionalGeneration checkpoint's Mistral text model: its tensors under ``language_model.``
    (``language_model.model.layers.0...``, ``language_model.lm_head.weight``: the source patterns of
    transformers' llava conversion_mapping, which mistral3 shares, and what its save_pretrained writes), the
    Pixtral vision tower and the projector skipped."""

    TOWERS = ("vision_tower", "multi_modal_projector")
    text_name = staticmethod(llava_text_name)
