"""MistralForCausalLM: the Llama family's layers (models/llama.py) without biases, every layer sliding."""

from __future__ import annotations

from outpace.models.config_hooks import checked_windows
from outpace.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_overrides(cls, cfg: dict) -> dict:
        return {}  # MistralAttention and MistralMLP have no biases

    @classmethod
    def layer_windows(cls, cfg: dict, num_layers: int) -> tuple[int | None, ...]:
        # transformers MistralConfig: sliding_window defaults to 4096; MistralAttention applies it to
        # every layer (None: full attention).
        window = cfg.get("sliding_window", 4096)
        return checked_windows((window,) * num_layers, window)
