"""Every field of the hybrids' transformers config classes (Qwen3NextConfig, Qwen3_5TextConfig, Qwen3_5MoeTextConfig,
NemotronHConfig) is implemented, irrelevant to inference, or refused at load with a ConfigError naming it.

The walk takes each class's config at small sizes (``to_dict``); a field none of the tables below knows fails the
test, so a transformers upgrade that adds one has to be looked at. What a config builds is the model itself, on
the meta device, described by its ModelConfig, its parameters' and buffers' names and shapes, and every plain
attribute of every module (an activation's name, a routing rule, an eps): "implemented" is checked by another
value changing that description, "irrelevant" by it not changing."""

from __future__ import annotations

import pytest
import transformers

from helpers.config_walk import COMMON_IRRELEVANT, TEXT_MODEL_IMPLEMENTED, built, walk_fields
from outpace.validation import ConfigError

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
QWEN_SIZES = dict(
    SIZES,
    num_hidden_layers=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
)
MOE_SIZES = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
)
NEMOTRON_SIZES = dict(
    SIZES,
    mamba_num_heads=4,
    mamba_head_dim=8,
    n_groups=2,
    ssm_state_size=8,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=16,
    layers_block_type=["mamba", "attention", "moe", "mlp"],
)
CONFIGS = {
    "Qwen3NextForCausalLM": (transformers.Qwen3NextConfig, dict(QWEN_SIZES, **MOE_SIZES)),
    "Qwen3_5ForCausalLM": (transformers.Qwen3_5TextConfig, QWEN_SIZES),
    "Qwen3_5MoeForCausalLM": (transformers.Qwen3_5MoeTextConfig, dict(QWEN_SIZES, **MOE_SIZES)),
    "NemotronHForCausalLM": (transformers.NemotronHConfig, NEMOTRON_SIZES),
}


def base_config(arch: str) -> dict:
    cls, sizes = CONFIGS[arch]
    return {**cls(**sizes).to_dict(), "architectures": [arch]}


# Fields that do not change what inference computes, and why.
IRRELEVANT = COMMON_IRRELEVANT | {
    "output_router_logits",
    "router_aux_loss_coef",  # training losses
}
# Nemotron-H's, read by neither transformers' modeling_nemotron_h nor what it computes
NEMOTRON_IRRELEVANT = {
    "expand",  # the mixer's width is mamba_num_heads * mamba_head_dim
    "residual_in_fp32",
    "mamba_proj_bias",  # (use_bias gives in_proj's and out_proj's)
    "n_shared_experts",  # the shared expert's width is moe_shared_expert_intermediate_size
    "time_step_limit",  # transformers clamps dt by (time_step_min, inf)
    "attention_bias",  # NemotronHAttention's projections have no bias whatever it says
    "hidden_dropout",
    "rescale_prenorm_residual",
    "time_step_floor",
    "time_step_max",  # initialisation of dt_bias
    "chunk_size",  # the prefill scan's chunking: the same sums
    "use_mamba_kernels",
    "moe_shared_expert_overlap",  # which kernels run
    "num_logits_to_keep",  # which rows transformers' forward returns
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2}
# field -> (another value, or a function of the base config giving one; other changes that let it matter)
IMPLEMENTED = {
    **TEXT_MODEL_IMPLEMENTED,
    "layer_types": (lambda base: list(reversed(base["layer_types"])), {}),
    "attention_bias": (True, {}),
    "linear_conv_kernel_dim": (3, {}),
    "linear_key_head_dim": (16, {}),
    "linear_value_head_dim": (16, {}),
    "linear_num_key_heads": (4, {}),
    "linear_num_value_heads": (8, {}),
    "num_experts": (8, {}),
    "num_experts_per_tok": (3, {}),
    "moe_intermediate_size": (24, {}),
    "shared_expert_intermediate_size": (24, {}),
    "norm_topk_prob": (False, {}),
    "decoder_sparse_step": (2, {}),
    "mlp_only_layers": ([1], {}),
    # Nemotron-H
    "layer_norm_epsilon": (3e-5, {}),
    "layers_block_type": (["attention", "mamba", "mlp", "moe"], {}),
    "mamba_head_dim": (16, {}),
    "mamba_num_heads": (8, {}),
    "mamba_hidden_act": ("gelu", {}),
    "n_groups": (4, {}),
    "ssm_state_size": (16, {}),
    "conv_kernel": (3, {}),
    "use_bias": (True, {}),
    "use_conv_bias": (False, {}),
    "time_step_min": (0.01, {}),
    "mlp_hidden_act": ("silu", {}),
    "mlp_bias": (True, {}),
    "n_routed_experts": (8, {}),
    "moe_shared_expert_intermediate_size": (24, {}),
    "moe_latent_size": (16, {}),
    "n_group": (2, {"topk_group": 1}),
    "topk_group": (2, {"n_group": 2}),
    "routed_scaling_factor": (2.5, {}),
    "num_nextn_predict_layers": (1, {}),
    "mtp_layers_block_type": (["moe", "attention"], {"num_nextn_predict_layers": 1}),
}
# field -> a value refused by name
REFUSED = {
    "sliding_window": 16,  # Nemotron-H: transformers' attention has no window; vLLM's has one
    "mamba_ssm_cache_dtype": "bfloat16",  # the state outpace keeps is float32
}


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_every_field_is_implemented_irrelevant_or_refused(arch):
    base = base_config(arch)
    irrelevant = IRRELEVANT | (NEMOTRON_IRRELEVANT if arch.startswith("NemotronH") else set())
    implemented = {k: v for k, v in IMPLEMENTED.items() if k not in irrelevant}
    walk_fields(arch, {k: v for k, v in base.items() if k not in REFUSED}, implemented, irrelevant)
    for name in sorted(set(base) & set(REFUSED)):
        with pytest.raises(ConfigError, match=name):
            built({**base, name: REFUSED[name]})


@pytest.mark.parametrize("arch", [a for a in CONFIGS if a.startswith("Qwen")])
def test_qwens_hub_only_fields_are_refused_where_they_ask_for_another_model(arch):
    """Qwen's hub configs carry attn_output_gate and mtp_use_dedicated_embeddings, which transformers' config
    classes do not read: their published values load, the others are refused by name (they loaded, computing the
    gated attention and the shared embedding all the same; found by fuzzing the loader)."""
    base = base_config(arch)
    built({**base, "attn_output_gate": True, "mtp_use_dedicated_embeddings": False})
    for name, value in (("attn_output_gate", False), ("mtp_use_dedicated_embeddings", True)):
        with pytest.raises(ConfigError, match=f"{name}={value!r}"):
            built({**base, name: value})
