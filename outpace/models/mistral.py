"""MistralForCausalLM: the Llama family's layers (models/llama.py) without biases, every layer sliding."""

from __future__ import annotations

from outpace.models.config_hooks import empty_if_all_full
from outpace.models.llama import LlamaForCausalLM
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
