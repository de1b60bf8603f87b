"""Family fields of a wrong type or out of range are refused by name (a ConfigError naming the field, and the file
where the check reads config.json), not met as a bare TypeError, ValueError or ZeroDivisionError at build nor
read as truthy (``bool("x")``). Each case failed before its check was added."""

import copy

import pytest
import transformers

from helpers.config_walk import built
from helpers.deepseek_models import MISTRAL4
from helpers.deepseek_models import SMALL as DEEPSEEK_SMALL
from helpers.deepseek_models import VARIANTS as DEEPSEEK_VARIANTS
from helpers.gemma_models import GEMMA3_TEXT, GEMMA4_TEXT
from helpers.hf_models import QWEN2_MOE, SMALL
from helpers.hybrid_models import HYBRIDS
from helpers.qwen3_moe_models import BASE as QWEN3_MOE
from outpace.model_config import ModelConfig
from outpace.validation import ConfigError

SOURCE = "ckpt/config.json"


def written(cls: str, arch: str, **fields) -> dict:
    return {**getattr(transformers, cls)(**fields).to_dict(), "architectures": [arch]}


def config_of(family: str) -> dict:
    if family == "qwen3_next":
        cls, fields = HYBRIDS["qwen3_next"]
        return written(cls, "Qwen3NextForCausalLM", **fields)
    if family == "qwen2_moe":
        return written("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **SMALL, **QWEN2_MOE)
    if family == "qwen3_moe":
        return written("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **QWEN3_MOE)
    if family in ("v3-yarn", "v2-group"):
        cls, extra = DEEPSEEK_VARIANTS[family]
        arch = cls.replace("Config", "ForCausalLM")
        return written(cls, arch, **copy.deepcopy({**DEEPSEEK_SMALL, **extra}))
    if family == "mistral4":
        from transformers.models.mistral4 import Mistral4Config

        return {
            **Mistral4Config(**copy.deepcopy(MISTRAL4)).to_dict(),
            "architectures": ["Mistral4ForCausalLM"],
        }
    if family == "gemma3":
        return written("Gemma3TextConfig", "Gemma3ForCausalLM", **copy.deepcopy(GEMMA3_TEXT))
    return written("Gemma4TextConfig", "Gemma4ForCausalLM", **copy.deepcopy(GEMMA4_TEXT))


CASES = [
    # Qwen3-Next: read from the raw dict, they met % and range() at build
    ("qwen3_next", "layer_types", 5),
    ("qwen3_next", "decoder_sparse_step", 0),
    ("qwen3_next", "decoder_sparse_step", "x"),
    ("qwen3_next", "linear_num_key_heads", 0),
    ("qwen3_next", "linear_num_value_heads", "x"),
    ("qwen3_next", "linear_conv_kernel_dim", -1),
    ("qwen3_next", "linear_key_head_dim", "x"),
    ("qwen3_next", "num_experts_per_tok", "x"),
    ("qwen3_next", "mlp_only_layers", "x"),
    ("qwen3_next", "mlp_only_layers", ["x"]),  # (accepted before: no layer index is "x")
    ("qwen3_next", "full_attention_interval", "x"),
    ("qwen3_next", "shared_expert_intermediate_size", "x"),
    ("qwen3_next", "norm_topk_prob", "x"),
    # Qwen2-MoE and Qwen3-MoE: bool("x") renormalised; a string width met torch.empty
    ("qwen2_moe", "norm_topk_prob", "x"),
    ("qwen2_moe", "shared_expert_intermediate_size", "x"),
    ("qwen2_moe", "moe_intermediate_size", "x"),
    ("qwen3_moe", "norm_topk_prob", "x"),
    # DeepSeek and Mistral 4: float("x") at build; a scale of 0 (transformers refuses it) dropped the experts
    ("v3-yarn", "routed_scaling_factor", "x"),
    ("v2-group", "routed_scaling_factor", 0),
    ("mistral4", "routed_scaling_factor", "x"),
    ("v3-yarn", "norm_topk_prob", "x"),
    ("v2-group", "attention_bias", "yes"),
    ("v3-yarn", "n_shared_experts", "x"),
    # Gemma: a cap of 0 divides by 0 (NaN logits), a string one met float(); so did query_pre_attn_scalar
    ("gemma3", "final_logit_softcapping", 0),
    ("gemma3", "final_logit_softcapping", "x"),
    ("gemma4", "final_logit_softcapping", 0),
    ("gemma3", "query_pre_attn_scalar", 0),
    ("gemma3", "query_pre_attn_scalar", "x"),
]


@pytest.mark.parametrize("family, field, value", CASES)
def test_a_wrong_value_is_refused_by_name(family, field, value):
    cfg = {**config_of(family), field: value}
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict(cfg, SOURCE)
        built(cfg)  # (DeepSeek's checks run when its model is built)
    message = str(err.value)
    assert field in message and repr(value) in message, message


@pytest.mark.parametrize("family", ["qwen3_next", "qwen2_moe", "qwen3_moe", "gemma3", "gemma4"])
def test_the_family_checks_read_config_json_by_file_name(family):
    cfg = {**config_of(family), "norm_topk_prob": "x", "final_logit_softcapping": 0}
    with pytest.raises(ConfigError, match=SOURCE):
        ModelConfig.from_dict(cfg, SOURCE)


@pytest.mark.parametrize(
    "family", ["qwen3_next", "qwen2_moe", "qwen3_moe", "v3-yarn", "v2-group", "gemma3"]
)
def test_the_unmutated_configs_build(family):
    built(config_of(family))


def test_a_negative_softcap_computes_what_its_absolute_value_does():
    """cap * tanh(x / cap) is odd in cap: transformers computes the same for -c as for c, and so it loads."""
    ModelConfig.from_dict({**config_of("gemma3"), "final_logit_softcapping": -0.5})


def test_checks_of_model_config_fields_name_the_file():
    """__post_init__'s checks (num_key_value_heads dividing the heads, rms_norm_eps below 1, the dtype) said
    ``ModelConfig.field`` alone: from_dict names the file too."""
    base = written("LlamaConfig", "LlamaForCausalLM", **SMALL)
    for field, value in (("num_key_value_heads", 4), ("rms_norm_eps", 1.0), ("dtype", "int8")):
        with pytest.raises(ConfigError) as err:
            ModelConfig.from_dict({**base, field: value}, SOURCE)
        assert str(err.value).startswith(f"{SOURCE}: ") and repr(value) in str(err.value)
