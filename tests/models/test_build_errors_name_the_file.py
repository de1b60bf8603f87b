"""A config.json value refused while the model is built (the families' checks that read ``ModelConfig.raw``:
DeepSeek's routing and MLA, the MoE stack's expert counts, Qwen3-Next's and Qwen3.5's, Nemotron-H's, Gemma's,
Step-3.5's) names the config.json file as well as the field, as the checks run while it is parsed do
(``ModelConfig.from_dict``): before, these said ``ModelConfig.field=value`` alone. And Step-3.5's per-layer
lists and typed fields are refused by name rather than met as a bare TypeError or ValueError, or read as truthy.
Each case failed before its fix."""

import copy

import pytest
import torch
import transformers

from helpers.deepseek_models import MISTRAL4
from helpers.deepseek_models import SMALL as DEEPSEEK_SMALL
from helpers.deepseek_models import VARIANTS as DEEPSEEK_VARIANTS
from helpers.gemma_models import GEMMA3_TEXT, GEMMA4_TEXT
from helpers.hf_models import QWEN2_MOE, SMALL
from helpers.hybrid_models import HYBRIDS
from helpers.qwen3_moe_models import BASE as QWEN3_MOE
from helpers.step3p5_checkpoints import CONFIG as STEP3P5
from helpers.step3p5_checkpoints import MTP, N, write_checkpoint
from outpace.model_config import ModelConfig, errors_name_file
from outpace.models.loader import build_model, covering_positions, load_model
from outpace.validation import ConfigError

SOURCE = "ckpt/config.json"
LAYERS = N + MTP  # Step-3.5's per-layer lists cover the MTP layers too


def written(cls: str, arch: str, **fields) -> dict:
    return {
        **getattr(transformers, cls)(**copy.deepcopy(fields)).to_dict(),
        "architectures": [arch],
    }


def config_of(family: str) -> dict:
    if family in ("v3-yarn", "v2-group"):
        cls, extra = DEEPSEEK_VARIANTS[family]
        return written(cls, cls.replace("Config", "ForCausalLM"), **{**DEEPSEEK_SMALL, **extra})
    if family == "mistral4":
        from transformers.models.mistral4 import Mistral4Config

        return {
            **Mistral4Config(**copy.deepcopy(MISTRAL4)).to_dict(),
            "architectures": ["Mistral4ForCausalLM"],
        }
    hybrids = {
        "qwen3_next": "Qwen3NextForCausalLM",
        "qwen3_5": "Qwen3_5ForCausalLM",
        "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
        "nemotron_h": "NemotronHForCausalLM",
    }
    if family in hybrids:
        cls, fields = HYBRIDS[family]
        return written(cls, hybrids[family], **fields)
    if family == "gemma3":
        return written("Gemma3TextConfig", "Gemma3ForCausalLM", **GEMMA3_TEXT)
    if family == "gemma4":
        return written("Gemma4TextConfig", "Gemma4ForCausalLM", **GEMMA4_TEXT)
    if family == "mixtral":
        return written(
            "MixtralConfig",
            "MixtralForCausalLM",
            **SMALL,
            tie_word_embeddings=False,
            num_local_experts=4,
        )
    if family == "qwen2_moe":
        return written("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **SMALL, **QWEN2_MOE)
    if family == "qwen3_moe":
        return written("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **QWEN3_MOE)
    assert family == "step3p5", family
    return copy.deepcopy(STEP3P5)


def built(cfg: dict, source: str = SOURCE) -> torch.nn.Module:
    """The model ``cfg`` builds (on the meta device: no memory), parsed as read from ``source``."""
    return build_model(ModelConfig.from_dict(cfg, source), torch.float32, "meta")


def refusal(cfg: dict) -> str:
    """The message of the ConfigError that building ``cfg`` raises; parsing it must pass (a build-time check)."""
    model_cfg = ModelConfig.from_dict(cfg, SOURCE)
    with pytest.raises(ConfigError) as err:
        build_model(model_cfg, torch.float32, "meta")
    return str(err.value)


# (family, field, a value parsing accepts and building refuses)
BUILD_CASES = [
    # DeepSeek V3 / V2 (deepseek.py _refuse_unimplemented: routing and MLA)
    ("v3-yarn", "scoring_func", "softmax"),
    ("v3-yarn", "n_group", 3),
    ("v2-group", "topk_method", "noaux_tc"),
    # Mistral 4 (DeepSeek's code: _refuse_unimplemented_mistral4, _check_routing)
    ("mistral4", "num_experts_per_tok", 99),
    ("mistral4", "n_group", 3),
    # Qwen3-Next and Qwen3.5 (qwen3_next.py Qwen3NextConfig.from_model_config)
    ("qwen3_next", "linear_num_value_heads", 3),
    ("qwen3_next", "attn_output_gate", False),
    ("qwen3_5", "attn_output_gate", False),
    ("qwen3_5_moe", "mlp_only_layers", [1]),
    # Nemotron-H (nemotron_h.py _refuse_unimplemented)
    ("nemotron_h", "mamba_ssm_cache_dtype", "float16"),
    # Gemma 3 and 4 (gemma.py, gemma4.py from_model_config)
    ("gemma3", "attn_logit_softcapping", 50.0),
    ("gemma4", "use_bidirectional_attention", "all"),
    # the MoE stack (mixture_stack.py expert_counts)
    ("mixtral", "num_local_experts", 0),
    ("mixtral", "num_experts_per_tok", 9),
    ("qwen2_moe", "num_experts_per_tok", 9),
    ("qwen3_moe", "num_experts_per_tok", 99),
    # Step-3.5 (step3p5_config.py)
    ("step3p5", "sink", True),
    ("step3p5", "moe_top_k", 8),
]


@pytest.mark.parametrize("family, field, value", BUILD_CASES)
def test_a_build_time_refusal_names_the_config_file_and_the_field(family, field, value):
    message = refusal({**config_of(family), field: value})
    assert message.startswith(f"{SOURCE}: "), message
    assert field in message and repr(value) in message, message
    assert message.count(SOURCE) == 1, message


@pytest.mark.parametrize("family", sorted({family for family, _, _ in BUILD_CASES}))
def test_the_unmutated_configs_build(family):
    built(config_of(family))


def test_loading_a_checkpoint_names_its_config_json(tmp_path):
    """The path a user gave: load_model reads tmp_path/config.json, and the refusal while building says so."""
    write_checkpoint(tmp_path, {**STEP3P5, "sink": True})
    with pytest.raises(ConfigError) as err:
        load_model(tmp_path, torch.float32)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: "), str(err.value)
    assert "sink=True" in str(err.value)


def test_the_source_travels_with_the_config_and_is_not_part_of_it():
    cfg = config_of("qwen2_moe")
    parsed = ModelConfig.from_dict(cfg, SOURCE)
    assert parsed.source == SOURCE
    assert covering_positions(parsed, 10**5).source == SOURCE  # (dataclasses.replace keeps it)
    assert parsed == ModelConfig.from_dict(cfg, "elsewhere/config.json")
    assert hash(parsed) == hash(ModelConfig.from_dict(cfg, "elsewhere/config.json"))
    assert ModelConfig.from_dict(cfg).source == "config.json"  # from_dict's default name


def test_a_message_that_names_the_file_already_is_kept():
    with pytest.raises(ConfigError) as err, errors_name_file(SOURCE):
        raise ConfigError(f"{SOURCE}: field 'x' must be a number, got 'y'")
    assert str(err.value) == f"{SOURCE}: field 'x' must be a number, got 'y'"
    with pytest.raises(ValueError) as other, errors_name_file(SOURCE):
        raise ValueError("not a config error")  # (only ConfigError is about the file)
    assert str(other.value) == "not a config error"


# Step-3.5's fields of a wrong type (step3p5_config.py _check_types). Before: a bare TypeError or ValueError
# (float("x"), "x" < 0, len(0.5), int("x")), or accepted: [True] * n rotated the whole head, a string
# moe_layers_enum entry 1.5 read as layer 1, "x" taken as true, a yarn_only_types string matched by substring.
STEP3P5_TYPE_CASES = [
    ("partial_rotary_factors", [0.5, "x"] + [1.0] * (LAYERS - 2)),
    ("partial_rotary_factors", [None] * LAYERS),
    ("partial_rotary_factors", 0.5),
    ("partial_rotary_factors", [True] * LAYERS),
    ("swiglu_limits", ["x"] * LAYERS),
    ("swiglu_limits", 3.0),
    ("swiglu_limits", [True] * LAYERS),
    ("swiglu_limits_shared", [0.4, "x"] + [0.0] * (LAYERS - 2)),
    ("moe_layers_enum", "1,x"),
    ("moe_layers_enum", 5),
    ("moe_layers_enum", [1.5]),
    ("moe_router_scaling_factor", "x"),
    ("moe_router_scaling_factor", 0),
    ("moe_intermediate_size", "x"),
    ("moe_intermediate_size", 2.5),
    ("share_expert_dim", "x"),
    ("share_expert_dim", -3),
    ("moe_num_experts", "x"),
    ("moe_top_k", True),
    ("use_head_wise_attn_gate", "x"),
    ("norm_expert_weight", "x"),
    ("use_moe_router_bias", "x"),
    ("use_qk_norm", 1),
    ("use_rope_layers", "x"),
    ("use_rope_layers", ["x"] * LAYERS),
    ("yarn_only_types", "full_attention"),
    ("yarn_only_types", [5]),
]


@pytest.mark.parametrize("field, value", STEP3P5_TYPE_CASES)
def test_step3p5_fields_of_a_wrong_type_are_refused_by_name(field, value):
    message = refusal({**STEP3P5, field: value})
    assert message.startswith(f"{SOURCE}: ") and f"{field}={value!r}" in message, message


def test_step3p5_attention_other_setting_counts_are_integers():
    other = {**STEP3P5["attention_other_setting"], "num_attention_groups": True}
    message = refusal({**STEP3P5, "attention_other_setting": other})
    assert message.startswith(f"{SOURCE}: ") and "attention_other_setting" in message, message


@pytest.mark.parametrize(
    "field", ["rope_theta", "moe_router_scaling_factor", "moe_intermediate_size", "moe_top_k"]
)
def test_step3p5_a_null_field_means_its_default(field):
    """A null reads as the field's absence, as every typed read of config.json takes it (validation.py
    ConfigFields): rope_theta null met float(None) at build, a bare TypeError."""
    absent = {k: v for k, v in STEP3P5.items() if k != field}
    null = built({**STEP3P5, field: None}).step_config
    assert null == built(absent).step_config
    if (
        field == "rope_theta"
    ):  # vLLM Step3p5Config's default, in the layers and in what a draft copies
        assert {spec.rope_theta for spec in null.layers} == {500000.0}
        assert ModelConfig.from_dict({**STEP3P5, field: None}, SOURCE).rope_theta == 500000.0


def test_step3p5_per_layer_lists_as_written_still_build():
    step = built(STEP3P5).step_config
    assert [spec.rotary_dim for spec in step.layers] == [
        6 if t == "full_attention" else 12 for t in STEP3P5["layer_types"][:LAYERS]
    ]
    assert built({**STEP3P5, "moe_layers_enum": [1, 2, 4]}).step_config == step  # (a list of them)
