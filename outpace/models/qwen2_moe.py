"""Qwen2MoeForCausalLM (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's layers (models/qwen2.py) whose MLP is a
mixture of experts beside a sigmoid-gated shared expert (layers/gated_shared_moe.py) on every
``decoder_sparse_step``-th layer outside ``mlp_only_layers``, a dense SwiGLU MLP of ``intermediate_size`` on the
others (transformers Qwen2MoeDecoderLayer and Qwen2MoeSparseMoeBlock; vLLM's qwen2_moe.py alike). Biases on q, k
and v with ``qkv_bias`` (none on o). Sliding windows as Qwen2MoeConfig places them: with use_sliding_window,
layers of an odd count before max_window_layers (``layer_types`` when the config gives them).

Few rows on the GPU take the fused residual stack of models/mixture_stack.py (its layer and forward)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
from outpace.layers.router import Routing
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import windows_of_layer_types
from outpace.models.mixture_stack import (
    MixtureLayer,
    MixtureStack,
    expert_counts,
    mixture_layers,
)
from outpace.models.qwen2 import Qwen2ForCausalLM
from outpace.validation import ConfigFields


class Qwen2MoeForCausalLM(MixtureStack, Qwen2ForCausalLM):
    # Qwen2MoeConfig's
    class_defaults = {"max_position_embeddings": 32768, "num_key_value_heads": 16}

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        # the widths and the flag layer_factory reads, of their types (a string there met a bare TypeError)
        cfg.integer("moe_intermediate_size", None)
        cfg.integer("shared_expert_intermediate_size", None)
        cfg.boolean("norm_topk_prob", False)
        # Qwen2MoeAttention: q/k/v biases with qkv_bias (default true), none on o_proj
        return {"attention_bias": cfg.boolean("qkv_bias", True), "attention_out_bias": False}

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers Qwen2MoeConfig.__post_init__: sliding_window only with use_sliding_window; without
        # layer_types, the layers i with (i + 1) odd before max_window_layers slide
        sliding = cfg.boolean("use_sliding_window", False)
        window = cfg.optional_integer("sliding_window", 4096) if sliding else None
        first_full = cfg.integer("max_window_layers", 28, minimum=0)
        types = cfg.strings("layer_types") or [
            "sliding_attention" if sliding and (i + 1) % 2 and i < first_full else "full_attention"
            for i in range(num_layers)
        ]
        return windows_of_layer_types(
            cfg, types, window, num_layers, "use_sliding_window and a sliding_window"
        )

    @classmethod
    def layer_factory(cls, cfg: ModelConfig) -> Callable[..., nn.Module]:
        raw = cfg.raw
        experts, top_k = expert_counts(
            raw.get("num_experts", 60), raw.get("num_experts_per_tok", 4)
        )
        moe = mixture_layers(cfg, experts)
        routing = Routing(
            max(experts, 1),
            max(top_k, 1),
            "softmax",
            normalize=bool(raw.get("norm_topk_prob", False)),
        )

        def mixture() -> SparseMoeWithSharedExpert:
            return SparseMoeWithSharedExpert(
                cfg.hidden_size,
                routing,
                raw.get("moe_intermediate_size", 1408),
                raw.get("shared_expert_intermediate_size", 5632),
                cfg.hidden_act,
            )

        return lambda cfg, rotary, window, i: MixtureLayer(
            cfg, rotary, window, mixture() if i in moe else None
        )
