"""MistralForCausalLM: the Llama family's layers (models/llama.py) without biases, every layer sliding; and the text
model of a Mistral3ForConditionalGeneration checkpoint (Mistral-Small-3.1 / 3.2, Magistral-Small, Devstral-Small)."""

from __future__ import annotations

from outpace.models.config_hooks import empty_if_all_full
from outpace.models.llama import LlamaForCausalLM
from outpace.models.multimodal import TextOfMultimodal, llava_text_name
from outpace.validation import ConfigFields


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        return {}  # MistralAttention and MistralMLP have no biases

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers MistralConfig: sliding_window defaults to 4096; MistralAttention applies it to
        # every layer (None: full attention).
        return empty_if_all_full((cfg.optional_integer("sliding_window", 4096),) * num_layers)


class Mistral3TextForCausalLM(TextOfMultimodal, MistralForCausalLM):
    """A Mistral3ForConditionalGeneration checkpoint's Mistral text model: its tensors under ``language_model.``
    (``language_model.model.layers.0...``, ``language_model.lm_head.weight``: the source patterns of
    transformers' llava conversion_mapping, which mistral3 shares, and what its save_pretrained writes), the
    Pixtral vision tower and the projector skipped."""

    TOWERS = ("vision_tower", "multi_modal_projector")
    text_name = staticmethod(llava_text_name)
