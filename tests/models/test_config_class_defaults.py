"""A config.json that leaves a field out reads as transformers reads it: with the default of the family's config class
(MixtralConfig's rms_norm_eps 1e-5 and rope_theta 1e6, Qwen3Config's head_dim 128, Gemma3TextConfig's tied head,
Ministral3Config's YaRN RoPE ...), not the common layout's (models/config_hooks.py ``class_defaults``). Before, outpace
read the common defaults (rms_norm_eps 1e-6, rope_theta 1e4, head_dim hidden_size // num_attention_heads, an untied
head, max_position_embeddings 4096), and its logits differed from transformers' or a valid checkpoint was refused. So
too the fields a family reads beside ModelConfig (its mixture's, MLA's: Qwen3_5MoeTextConfig's 256 experts, 8 a token,
not Qwen3NextConfig's 512 and 10), and num_key_value_heads (MistralConfig's 8, not num_attention_heads)."""

import dataclasses

import pytest
import transformers

from helpers.step3p5_checkpoints import CONFIG as STEP3P5
from outpace.model_config import ModelConfig
from outpace.models.deepseek import DeepseekConfig
from outpace.models.gemma4 import Gemma4Config
from outpace.models.mixtral import mixtral_routing
from outpace.models.qwen3_moe import Qwen3MoeConfig
from outpace.models.qwen3_next import Qwen3NextConfig
from outpace.models.step3p5_config import Step3p5Config
from outpace.validation import ConfigError

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
    "Qwen2VLForConditionalGeneration": ("Qwen2VLTextConfig", {}),
    "Qwen2_5_VLForConditionalGeneration": ("Qwen2_5_VLTextConfig", {}),
    "Qwen3VLForConditionalGeneration": ("Qwen3VLTextConfig", {}),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", MIXTURE),
    # the mixtures' fields left out too (Qwen3MoeConfig's 128 experts, 8 a token; Qwen3VLMoeTextConfig's 60, 4)
    "Qwen3MoeForCausalLM/defaults": ("Qwen3MoeConfig", {}),
    "Qwen3VLMoeForConditionalGeneration": ("Qwen3VLMoeTextConfig", {}),
    "Qwen3_5ForCausalLM": (
        "Qwen3_5TextConfig",
        {"num_hidden_layers": 4, "linear_num_key_heads": 2},
    ),
    # Qwen3_5MoeTextConfig's 256 experts, 8 per token (Qwen3NextConfig's 512, 10)
    "Qwen3_5MoeForCausalLM": (
        "Qwen3_5MoeTextConfig",
        {"num_hidden_layers": 4, "linear_num_key_heads": 2},
    ),
    "Qwen3NextForCausalLM": (
        "Qwen3NextConfig",
        {"num_hidden_layers": 4, "linear_num_key_heads": 2},
    ),
    # MLA: as many kv heads as heads; DeepseekV2Config's num_experts_per_tok is None (required)
    "DeepseekV2ForCausalLM": (
        "DeepseekV2Config",
        {"num_key_value_heads": 4, "num_experts_per_tok": 2},
    ),
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", {"num_key_value_heads": 4}),
    "KimiK25ForConditionalGeneration": ("DeepseekV3Config", {"num_key_value_heads": 4}),
    "Mistral4ForCausalLM": ("Mistral4Config", {"num_key_value_heads": 4}),
    "Gemma3ForCausalLM": ("Gemma3TextConfig", {}),
    "Gemma4ForCausalLM": ("Gemma4TextConfig", {"hidden_size_per_layer_input": 8}),
    "Gemma4UnifiedForCausalLM": ("Gemma4UnifiedTextConfig", {}),
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
    # the mixtures' and MLA's, which the families read beside ModelConfig (``FAMILY_READINGS``)
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "n_shared_experts",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "first_k_dense_replace",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "rope_interleave",
    "attention_bias",
    "mlp_bias",
    "num_nextn_predict_layers",
)
# the names of one field (a class's attribute_map)
ALIASES = {"num_local_experts": "num_experts", "num_experts": "num_local_experts"}
# fields that a multimodal checkpoint's top level gives, not its text config
NOT_FLAT = {
    (
        "Qwen3VLMoeForConditionalGeneration",
        "tie_word_embeddings",
    ): "Qwen3VLMoeConfig's (False) ties",
}
# what a family reads from the config beyond ModelConfig, by architecture's prefix
FAMILY_READINGS = {
    "Deepseek": DeepseekConfig.from_model_config,
    "Kimi": DeepseekConfig.from_model_config,
    "Mistral4": DeepseekConfig.from_model_config,
    "Mixtral": mixtral_routing,
    "Qwen3Moe": Qwen3MoeConfig.from_model_config,
    "Qwen3VLMoe": Qwen3MoeConfig.from_model_config,
    "Qwen3Next": Qwen3NextConfig.from_model_config,
    "Qwen3_5": Qwen3NextConfig.from_model_config,
}
# keys of a default RoPE that no RoPE computation reads (Ministral3Config writes the context length beside it)
UNREAD = ("type", "max_position_embeddings")


def read(config: dict) -> tuple:
    """``config`` read, its RoPE parameters without the keys nothing reads, and what its family reads beside."""
    cfg = ModelConfig.from_dict(config)
    scaling = cfg.rope_scaling and {
        "rope_type": cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type")),
        **{k: v for k, v in cfg.rope_scaling.items() if k not in UNREAD},
    }
    if scaling and scaling["rope_type"] != "proportional":  # (the only RoPE whose tables read it)
        scaling.pop("partial_rotary_factor", None)
    cfg = dataclasses.replace(cfg, rope_scaling=scaling)
    family = [f for prefix, f in FAMILY_READINGS.items() if cfg.architecture.startswith(prefix)]
    return cfg, family[0](cfg) if family else None


def written(arch: str, **changes) -> dict:
    """The config.json transformers writes for ``arch``'s config class at FAMILIES' sizes (``changes`` applied,
    a None deleting a size)."""
    config_class, sizes = FAMILIES[arch]
    sizes = {k: v for k, v in {**SIZES, **sizes, **changes}.items() if v is not None}
    config = getattr(transformers, config_class)(**sizes)
    return {**config.to_dict(), "architectures": [arch.split("/")[0]]}


def left_out_cases() -> list:
    """(architecture, field) for each field of FIELDS that the class writes of its own (not one of the sizes it is
    built with) and that its text config gives."""
    cases = []
    for arch, (_, sizes) in FAMILIES.items():
        config = written(arch)
        for field in FIELDS:
            own = field in config and field not in sizes and ALIASES.get(field) not in sizes
            if own and (arch, field) not in NOT_FLAT:
                cases.append(pytest.param(arch, field, id=f"{arch}-{field}"))
    return cases


@pytest.mark.parametrize(("arch", "field"), left_out_cases())
def test_a_field_left_out_reads_as_its_config_class_default(arch, field):
    config_class = FAMILIES[arch][0]
    given = written(arch)
    left_out = {k: v for k, v in given.items() if k != field}
    # transformers reads the config without the field as its class's default, the value written
    reread = getattr(transformers, config_class)(
        **{k: v for k, v in left_out.items() if k != "architectures"}
    )
    assert reread.to_dict()[field] == given[field]
    assert read(left_out) == read(given)


# (MLA families give num_key_value_heads among their sizes: as many kv heads as heads)
@pytest.mark.parametrize(
    "arch", [arch for arch, (_, sizes) in FAMILIES.items() if "num_key_value_heads" not in sizes]
)
def test_kv_heads_left_out_read_as_the_config_class_count(arch):
    """num_key_value_heads left out: the class's count (MistralConfig's 8, Qwen2Config's 32 ...), whatever
    num_attention_heads is, as transformers reads it (LlamaConfig's, None, is num_attention_heads); before,
    outpace read num_attention_heads, and refused a grouped-query checkpoint's k_proj and v_proj by their shapes."""
    given = written(arch, num_attention_heads=64, hidden_size=1024, num_key_value_heads=None)
    left_out = {k: v for k, v in given.items() if k != "num_key_value_heads"}
    assert read(left_out) == read(given)


@pytest.mark.parametrize(("field", "value"), [("rms_norm_eps", 1e-5), ("num_attention_groups", 8)])
def test_step3p5_fields_left_out_read_as_its_config_class(field, value):
    """Step-3.5-Flash's config class is remote code: vLLM's Step3p5Config (the source of step3p5_config.py's
    defaults) gives rms_norm_eps 1e-5 and num_attention_groups (its kv heads) 8; before, outpace read 1e-6 and
    num_attention_heads."""
    written = {**STEP3P5, "num_attention_heads": 16, field: value}
    left_out = {k: v for k, v in written.items() if k != field}
    cfgs = [ModelConfig.from_dict(c) for c in (left_out, written)]
    assert cfgs[0] == cfgs[1]
    assert Step3p5Config.from_model_config(cfgs[0]) == Step3p5Config.from_model_config(cfgs[1])


@pytest.mark.parametrize("field", ["num_experts", "top_k_experts", "moe_intermediate_size"])
def test_gemma4_moe_sizes_left_out_are_refused_by_name(field):
    """Gemma4TextConfig gives the MoE block's sizes no default (None): a config with enable_moe_block that leaves one
    out is refused naming it (a bare KeyError before)."""
    moe = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)
    written = transformers.Gemma4TextConfig(**SIZES, hidden_size_per_layer_input=8, **moe).to_dict()
    left_out = {k: v for k, v in written.items() if k != field}
    cfg = ModelConfig.from_dict({**left_out, "architectures": ["Gemma4ForCausalLM"]})
    with pytest.raises(ConfigError, match=field):
        Gemma4Config.from_model_config(cfg)
