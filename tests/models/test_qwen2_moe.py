"""Qwen2MoeForCausalLM's config: every field of transformers' Qwen2MoeConfig implemented (another value changes what
is built), irrelevant to inference, or refused by name. Its outputs against transformers: tests/models/test_parity.py
(variants qwen2-moe, qwen2-moe-window); under tensor parallelism: tests/distributed/test_tensor_parallel_families.py."""

import pytest
import torch
import transformers

from helpers.config_walk import COMMON_IRRELEVANT
from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model
from outpace.validation import ConfigError

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
)
IRRELEVANT = COMMON_IRRELEVANT | {"output_router_logits", "router_aux_loss_coef"}
# field -> another value (with SMALL's sizes): what is built must then differ
IMPLEMENTED = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "hidden_act": "gelu",
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
    "eos_token_id": 7,
    "dtype": "bfloat16",
    "qkv_bias": False,
    "use_sliding_window": True,
    "sliding_window": 16,
    "max_window_layers": 1,
    "layer_types": ["sliding_attention"] + ["full_attention"] * 3,
    "decoder_sparse_step": 2,
    "moe_intermediate_size": 8,
    "shared_expert_intermediate_size": 12,
    "num_experts_per_tok": 3,
    "num_experts": 6,
    "norm_topk_prob": True,
    "mlp_only_layers": [0],
}
# changes a field needs to matter
CONTEXT = {
    "num_hidden_layers": {"layer_types": None},
    "sliding_window": {"use_sliding_window": True, "sliding_window": 8, "layer_types": None},
    "max_window_layers": {"use_sliding_window": True, "sliding_window": 16, "layer_types": None},
    "use_sliding_window": {"sliding_window": 16, "layer_types": None},
    "layer_types": {"use_sliding_window": True, "sliding_window": 16},
}


def described(cfg: dict) -> tuple:
    """What outpace builds from a config: its ModelConfig and each layer's mixture (routing, widths) or
    dense MLP width."""
    model_cfg = ModelConfig.from_dict(cfg)
    layers = build_model(model_cfg, torch.float32).model.layers
    mlps = tuple(
        (m.gate.routing, m.experts[0].gate_proj.weight.shape, m.shared_expert.up_proj.weight.shape)
        if isinstance(m := layer.mlp, SparseMoeWithSharedExpert)
        else m.up_proj.weight.shape
        for layer in layers
    )
    biases = tuple(layer.self_attn.q_proj.bias is not None for layer in layers)
    return model_cfg, mlps, biases


def base() -> dict:
    cfg = transformers.Qwen2MoeConfig(**SMALL).to_dict()
    return {**cfg, "architectures": ["Qwen2MoeForCausalLM"]}


def test_every_field_is_implemented_or_irrelevant():
    cfg = base()
    unknown = sorted(set(cfg) - set(IMPLEMENTED) - IRRELEVANT - {"architectures"})
    assert not unknown, f"Qwen2MoeConfig fields nobody decided on: {unknown}"
    for name, value in IMPLEMENTED.items():
        assert name in cfg, name
        context = CONTEXT.get(name, {})
        assert described({**cfg, **context}) != described({**cfg, **context, name: value}), (
            f"{name}={value!r} changes nothing"
        )
    for name in set(cfg) & IRRELEVANT:
        changed = "changed" if cfg[name] is None else not cfg[name]
        assert ModelConfig.from_dict({**cfg, name: changed}) == ModelConfig.from_dict(cfg), name


def test_bad_mixture_fields_are_refused_by_name():
    for field, value in (("num_experts_per_tok", 5), ("decoder_sparse_step", 0)):
        with pytest.raises(ConfigError, match=field):
            build_model(ModelConfig.from_dict({**base(), field: value}), torch.float32)
