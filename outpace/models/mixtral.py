"""MixtralForCausalLM (Mixtral-8x7B, Mixtral-8x22B): Mistral's layers (models/mistral.py, no biases) whose every MLP is a
sparse mixture of experts (transformers MixtralSparseMoeBlock and MixtralTopKRouter; vLLM's mixtral.py alike): a
softmax over the router's logits keeps ``num_experts_per_tok`` of ``num_local_experts`` experts, their
probabilities renormalised, no shared expert: layers/moe.py ``MoE``. The window is ``sliding_window`` on every
layer, None by default (MixtralConfig's).

Checkpoint names are the hub's, which transformers 5 also writes (its conversion_mapping folds them into stacks
at load and back at save): ``block_sparse_moe.gate.weight`` (the router) and ``block_sparse_moe.experts.{e}.w1``
(gate), ``w3`` (up) and ``w2`` (down); ``checkpoint_name`` maps the mixture's parameters to them.

Few rows on the GPU take the fused residual stack of models/mixture_stack.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torch import nn

from outpace.layers.decoder import GatedMLP
from outpace.layers.moe import MoE
from outpace.layers.router import Routing
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import empty_if_all_full
from outpace.models.mistral import MistralForCausalLM
from outpace.models.mixture_stack import MixtureLayer, MixtureStack, expert_counts
from outpace.validation import ConfigFields

# the experts' projections as Mixtral's checkpoints name them
EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def mixtral_routing(cfg: ModelConfig) -> Routing:
    """``num_experts_per_tok`` of ``num_local_experts`` by softmax, renormalised (MixtralTopKRouter)."""
    raw = cfg.raw
    experts, top_k = expert_counts(
        raw.get("num_local_experts", 8),
        raw.get("num_experts_per_tok", 2),
        "num_local_experts",
        dense_allowed=False,
    )
    return Routing(experts, top_k, "softmax", normalize=True)


class MixtralForCausalLM(MixtureStack, MistralForCausalLM):
    query_scaling = False  # (Ministral 3's; MixtralConfig's rope has none)
    # MixtralConfig's (its default_theta, 1e6)
    class_defaults = {
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "num_key_value_heads": 8,
    }

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers MixtralConfig: sliding_window defaults to None; MixtralAttention applies it to every layer
        return empty_if_all_full((cfg.optional_integer("sliding_window", None),) * num_layers)

    @classmethod
    def layer_factory(cls, cfg: ModelConfig) -> Callable[..., nn.Module]:
        routing = mixtral_routing(cfg)

        def mixture() -> MoE:
            def mlp(size: int, bias: bool, **shard) -> GatedMLP:
                return GatedMLP(cfg.hidden_size, size, cfg.hidden_act, bias, **shard)

            return MoE(cfg.hidden_size, routing, cfg.intermediate_size, 0, mlp)

        return lambda cfg, rotary, window, i: MixtureLayer(cfg, rotary, window, mixture())

    def checkpoint_name(self, param_name: str) -> str:
        """``*.mlp.gate.*`` / ``*.mlp.experts.{e}.{gate,up,down}_proj.*`` -> ``*.block_sparse_moe.gate.*`` /
        ``*.block_sparse_moe.experts.{e}.{w1,w3,w2}.*``; the others as Llama's."""
        name = re.sub(
            r"\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.",
            lambda m: f".mlp.experts.{m.group(1)}.{EXPERT_NAMES[m.group(2)]}.",
            param_name,
        )
        name = name.replace(".mlp.", ".block_sparse_moe.")
        return super().checkpoint_name(name)
