"""A config.json that leaves a field out reads as transformers reads it: with the default of the family's config class
(MixtralConfig's rms_norm_eps 1e-5 and rope_theta 1e6, Qwen3Config's head_dim 128, Gemma3TextConfig's tied head,
Ministral3Config's YaRN RoPE ...), not the common layout's (models/config_hooks.py ``class_defaults``). Before, outpace
read the common defaults (rms_norm_eps 1e-6, rope_theta 1e4, head_dim hidden_size // num_attention_heads, an untied
head, max_position_embeddings 4096), and its logits differed from transformers' or a valid checkpoint was refused."""

import dataclasses

import pytest
import transformers

from outpace.model_config import ModelConfig

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
)
MIXTURE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
# architecture -> (transformers config class, the sizes it is built with beside SIZES)
FAMILIES = {
    "LlamaForCausalLM": ("LlamaConfig", {}),
    "MistralForCausalLM": ("MistralConfig", {}),
    "Ministral3ForCausalLM": ("Ministral3Config", {}),
    "MinistralForCausalLM": ("MinistralConfig", {"head_dim": 8}),
    "MixtralForCausalLM": ("MixtralConfig", {"num_local_experts": 4}),
    "Qwen2ForCausalLM": ("Qwen2Config", {}),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", {**MIXTURE, "shared_expert_intermediate_size": 16}),
    "Qwen3ForCausalLM": ("Qwen3Config", {}),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", MIXTURE),
    "Qwen3_5ForCausalLM": (
        "Qwen3_5TextConfig",
        {"num_hidden_layers": 4, "linear_num_key_heads": 2},
    ),
    "Gemma3ForCausalLM": ("Gemma3TextConfig", {}),
    "Gemma4ForCausalLM": ("Gemma4TextConfig", {"hidden_size_per_layer_input": 8}),
    "NemotronHForCausalLM": (
        "NemotronHConfig",
        {"layers_block_type": ["mamba", "attention"], "mamba_num_heads": 4, "n_groups": 2},
    ),
}
# the fields whose class defaults differ from the common layout's somewhere
FIELDS = (
    "max_position_embeddings",
    "rms_norm_eps",
    "head_dim",
    "tie_word_embeddings",
    "rope_parameters",
)
# keys of a default RoPE that no RoPE computation reads (Ministral3Config writes the context length beside it)
UNREAD = ("type", "max_position_embeddings")


def read(config: dict) -> ModelConfig:
    """``config`` read, its RoPE parameters without the keys nothing reads."""
    cfg = ModelConfig.from_dict(config)
    scaling = cfg.rope_scaling and {k: v for k, v in cfg.rope_scaling.items() if k not in UNREAD}
    return dataclasses.replace(cfg, rope_scaling=scaling)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_a_field_left_out_reads_as_its_config_class_default(arch, field):
    config_class, sizes = FAMILIES[arch]
    sizes = {**SIZES, **sizes}
    written = {**getattr(transformers, config_class)(**sizes).to_dict(), "architectures": [arch]}
    if field not in written or field in sizes:
        pytest.skip(f"{config_class} writes no {field} of its own")
    left_out = {k: v for k, v in written.items() if k != field}
    # transformers reads the config without the field as its class's default, the value written
    reread = getattr(transformers, config_class)(
        **{k: v for k, v in left_out.items() if k != "architectures"}
    )
    assert reread.to_dict()[field] == written[field]
    assert read(left_out) == read(written)
