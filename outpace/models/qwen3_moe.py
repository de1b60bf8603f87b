"""Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B, the Qwen3-Coder MoE models): Qwen3's layers
(models/qwen3.py: per-head q/k RMSNorm; a sliding window on every layer with use_sliding_window) whose MLP is a
sparse mixture of experts on every ``decoder_sparse_step``-th layer outside ``mlp_only_layers`` (transformers
Qwen3MoeDecoderLayer; vLLM's qwen3_moe.py alike), a dense SwiGLU MLP of ``intermediate_size`` on the others.

The mixture (transformers Qwen3MoeSparseMoeBlock and Qwen3MoeTopKRouter): a softmax over the router's logits
keeps ``num_experts_per_tok`` experts, their probabilities renormalised with ``norm_topk_prob``, no shared
expert: layers/moe.py ``MoE`` with none, its ``Router`` scoring in float32. Checkpoint names are the hub's
(``mlp.gate.weight``, ``mlp.experts.{e}.{gate,up,down}_proj.weight``, which transformers' save_pretrained
writes too); transformers 5 writes the expert count as ``num_local_experts``, the hub's configs as
``num_experts``.

Few rows on the GPU take the fused residual stack of models/mixture_stack.py (its layer and forward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from outpace.layers.decoder import GatedMLP
from outpace.layers.moe import MoE, stacked_experts
from outpace.layers.router import Routing
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import empty_if_all_full
from outpace.models.mixture_stack import (
    MixtureLayer,
    MixtureStack,
    expert_counts,
    mixture_layers,
)
from outpace.models.multimodal import TextOfMultimodal
from outpace.models.qwen3 import Qwen3ForCausalLM
from outpace.validation import ConfigFields, is_int, require

VL_MOE = "Qwen3VLMoeForConditionalGeneration"


@dataclass(frozen=True)
class Qwen3MoeConfig:
    """The mixture's fields of a Qwen3MoeConfig beyond ``ModelConfig``'s."""

    routing: Routing
    moe_intermediate_size: int
    moe_layers: frozenset[int]  # the layers whose MLP is the mixture
    # Qwen3-VL-MoE's checkpoints stack each layer's experts, transposed (``stacked_experts``)
    stacked: bool = False

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> Qwen3MoeConfig:
        raw, o = cfg.raw, "ModelConfig"
        # Qwen3-VL-MoE's router always renormalises (transformers Qwen3VLMoeTextTopKRouter; its config has no
        # norm_topk_prob): one that says otherwise is refused
        vl = cfg.architecture == VL_MOE
        if vl:
            given = raw.get("norm_topk_prob", True)
            require(
                o, "norm_topk_prob", given, given is True, "true or absent in a Qwen3-VL-MoE config"
            )
        experts, top_k = expert_counts(
            raw.get("num_experts", raw.get("num_local_experts", 128)),
            raw.get("num_experts_per_tok", 8),
        )
        size = raw.get("moe_intermediate_size", 768)
        require(o, "moe_intermediate_size", size, is_int(size) and size > 0, "a positive integer")
        return cls(
            routing=Routing(
                max(experts, 1),
                max(top_k, 1),
                "softmax",
                normalize=vl or bool(raw.get("norm_topk_prob", False)),
            ),
            stacked=vl,
            moe_intermediate_size=size,
            moe_layers=mixture_layers(cfg, experts),
        )


class Qwen3MoeForCausalLM(MixtureStack, Qwen3ForCausalLM):
    # Qwen3MoeConfig's (its head_dim, None, is hidden_size // num_attention_heads)
    class_defaults = {"max_position_embeddings": 32768, "num_key_value_heads": 4}

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        cfg.boolean("norm_topk_prob", False)  # (bool("x") renormalised before: refused by name now)
        return super().config_overrides(cfg)

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers Qwen3MoeConfig.__post_init__ keeps sliding_window only with use_sliding_window, and
        # Qwen3MoeAttention then slides on every layer (no max_window_layers, no layer_types)
        if not cfg.boolean("use_sliding_window", False):
            return ()
        return empty_if_all_full((cfg.optional_integer("sliding_window", 4096),) * num_layers)

    @classmethod
    def layer_factory(cls, cfg: ModelConfig) -> Callable[..., nn.Module]:
        moe = Qwen3MoeConfig.from_model_config(cfg)

        def mixture() -> MoE:
            def mlp(size: int, bias: bool, **shard) -> GatedMLP:
                return GatedMLP(cfg.hidden_size, size, cfg.hidden_act, bias, **shard)

            experts = (
                stacked_experts(
                    cfg.hidden_act,
                    moe.routing.num_experts,
                    cfg.hidden_size,
                    moe.moe_intermediate_size,
                )
                if moe.stacked
                else None
            )
            return MoE(
                cfg.hidden_size, moe.routing, moe.moe_intermediate_size, 0, mlp, experts=experts
            )

        return lambda cfg, rotary, window, i: MixtureLayer(
            cfg, rotary, window, mixture() if i in moe.moe_layers else None
        )


class Qwen3VLMoeTextForCausalLM(TextOfMultimodal, Qwen3MoeForCausalLM):
    """A Qwen3VLMoeForConditionalGeneration checkpoint's text model (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-MoE's,
    its router always renormalising, its experts stacked (``stacked_experts``), its rotary sections turning text
    positions as plain RoPE does (models/qwen3.py); the vision tower skipped."""

    TOWERS = ("model.visual",)
    # Qwen3VLMoeTextConfig's (its default_theta, 5e5; its head_dim, None, is hidden_size // num_attention_heads),
    # its mixture's too (Qwen3MoeConfig's are 128 experts of width 768, 8 per token)
    class_defaults = {
        "max_position_embeddings": 128000,
        "rope_theta": 5e5,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
    }

    @classmethod
    def config_defaults(cls, cfg: ConfigFields) -> dict:
        # num_local_experts is the class's name of num_experts (its attribute_map)
        given = {"num_experts"} if "num_local_experts" in cfg else set()
        return {k: v for k, v in super().config_defaults(cfg).items() if k not in given}
