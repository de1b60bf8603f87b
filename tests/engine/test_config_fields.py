"""Every field of each supported transformers config class is implemented by ModelConfig.from_dict,
irrelevant to inference, or refused at load with a ConfigError naming the field and the value.

The walk takes each class's default config (``to_dict``); a field none of the tables below knows
fails the test, so a transformers upgrade that adds one has to be looked at. "Implemented" is
checked, not trusted: setting the field to another value must change the loaded ModelConfig.
"""

import copy

import pytest
import torch
import transformers
from transformers.activations import ACT2CLS, ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from helpers.config_walk import COMMON_IRRELEVANT
from outpace.layers.activation import ACTIVATIONS
from outpace.model_config import ROPE_TYPES, ModelConfig
from outpace.validation import ConfigError

# The Llama family's classes (models/llama.py); other families walk their own config classes in their
# own tests (tests/models/test_gemma.py).
LLAMA_FAMILY = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Ministral3ForCausalLM",
    "MinistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
CLASSES = {arch: arch.replace("ForCausalLM", "Config") for arch in LLAMA_FAMILY}

# Fields that do not change what inference computes, and why.
IRRELEVANT = COMMON_IRRELEVANT | {
    "pretraining_tp",  # not read by transformers 5's LlamaModel
}

N = 32  # layers of every config walked

# field -> (another value, or a function of the architecture giving one; other changes that let the
# field matter): from_dict must then differ.
IMPLEMENTED = {
    # (Ministral 3's default rope_parameters carry llama_4_scaling_beta, which only the Mistral classes read;
    # MistralConfig's default sliding_window, 4096, which Llama's refuses)
    "architectures": (
        lambda arch: [
            "MistralForCausalLM" if arch != "MistralForCausalLM" else "MinistralForCausalLM"
        ],
        {},
    ),
    "vocab_size": (100, {}),
    "hidden_size": (2048, {}),
    "intermediate_size": (100, {}),
    "num_hidden_layers": (4, {"layer_types": None}),
    "num_attention_heads": (64, {}),
    "num_key_value_heads": (4, {}),
    "head_dim": (64, {}),
    "hidden_act": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (3e-5, {}),
    "tie_word_embeddings": (True, {}),
    "rope_parameters": ({"rope_theta": 5e5, "rope_type": "default"}, {}),
    "eos_token_id": (7, {}),
    "dtype": ("bfloat16", {}),
    "attention_bias": (True, {}),
    "mlp_bias": (True, {}),
    "sliding_window": (
        16,
        {"use_sliding_window": True, "max_window_layers": 0, "layer_types": None},
    ),
    "use_sliding_window": (
        True,
        {"sliding_window": 16, "max_window_layers": 0, "layer_types": None},
    ),
    "max_window_layers": (
        1,
        {"use_sliding_window": True, "sliding_window": 16, "layer_types": None},
    ),
    "layer_types": (
        ["sliding_attention"] + ["full_attention"] * (N - 1),
        {"use_sliding_window": True, "sliding_window": 16},
    ),
}


def default_dict(arch: str) -> dict:
    # (N layers: Ministral 3's default has 34)
    config = getattr(transformers, CLASSES[arch])(num_hidden_layers=N)
    return {**config.to_dict(), "architectures": [arch]}


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_every_field_is_implemented_or_irrelevant(arch):
    base = default_dict(arch)
    assert base["num_hidden_layers"] == N
    unknown = sorted(set(base) - set(IMPLEMENTED) - IRRELEVANT)
    assert not unknown, f"{CLASSES[arch]} fields nobody decided on: {unknown}"
    for name in set(base) & set(IMPLEMENTED):
        value, context = IMPLEMENTED[name]
        value = value(arch) if callable(value) else value
        before = ModelConfig.from_dict({**base, **context})
        after = ModelConfig.from_dict({**base, **context, name: value})
        assert after != before, f"{CLASSES[arch]}.{name}={value!r} changes nothing"
    for name in set(base) & IRRELEVANT:
        changed = {**base, name: "changed" if base[name] is None else not base[name]}
        assert ModelConfig.from_dict(changed) == ModelConfig.from_dict(base), name


def refused(cfg: dict, *names: str) -> str:
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict(cfg)
    message = str(err.value)
    assert all(n in message for n in names), message
    return message


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_unimplemented_values_are_refused_by_name(arch):
    base = default_dict(arch)
    for act in ("prelu", "xielu", "no_such_act"):
        refused({**base, "hidden_act": act}, "hidden_act", repr(act))
    for kind in set(ROPE_INIT_FUNCTIONS) - set(ROPE_TYPES):
        refused(
            {**base, "rope_parameters": {"rope_type": kind, "rope_theta": 1e4, "factor": 2.0}},
            "rope_type",
            repr(kind),
        )
    refused(
        {
            **base,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        },
        "partial_rotary_factor",
        "0.5",
    )
    refused(
        {**base, "quantization_config": {"quant_method": "gptq"}}, "quantization_config", "gptq"
    )
    if "sliding_window" in base:
        refused(
            {
                **base,
                "sliding_window": 0,
                "use_sliding_window": True,
                "max_window_layers": 0,
                "layer_types": None,
            },
            "sliding_window",
            "0",
        )
    if "layer_types" in base:
        refused(
            {**base, "layer_types": ["chunked_attention"] * N}, "layer_types", "chunked_attention"
        )
        # transformers' create_sliding_window_causal_mask needs a window for a sliding layer
        no_window = {**base, "sliding_window": None, "layer_types": ["sliding_attention"] * N}
        refused(no_window, "layer_types", "sliding_attention")


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_supported_rope_types_load(arch):
    kinds = {
        "linear": {"factor": 2.0},
        "llama3": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "default": {},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 64},
    }
    for kind in ROPE_TYPES:
        cfg = ModelConfig.from_dict(
            {
                **default_dict(arch),
                "rope_parameters": {"rope_type": kind, "rope_theta": 1e4, **kinds[kind]},
            }
        )
        assert cfg.rope_theta == 1e4


def test_every_activation_matches_transformers_or_is_refused():
    """Walks transformers' ACT2FN: each entry is one of ours (same values) or one ModelConfig refuses."""
    x = torch.linspace(-12, 12, 2001, dtype=torch.float64)
    refused_names = set(ACT2CLS) - set(ACTIVATIONS)
    assert refused_names == {"prelu", "xielu"}  # both carry learned parameters
    assert not set(ACTIVATIONS) - set(ACT2CLS)
    for name, fn in ACTIVATIONS.items():
        torch.testing.assert_close(fn(x), ACT2FN[name](x), rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_layer_windows_follow_transformers(arch):
    """Per-layer windows as transformers' own modules read them, for sliding settings of each class."""
    small = dict(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    settings = {
        "LlamaForCausalLM": [{}],
        "MistralForCausalLM": [{"sliding_window": 8}, {"sliding_window": None}, {}],
        "Qwen2ForCausalLM": [
            {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
            {"use_sliding_window": False, "sliding_window": 8, "max_window_layers": 0},
            {
                "use_sliding_window": True,
                "sliding_window": 5,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
            },
        ],
    }
    settings["Qwen3ForCausalLM"] = settings["Qwen2ForCausalLM"]
    settings["Ministral3ForCausalLM"] = settings["MistralForCausalLM"]
    settings["MinistralForCausalLM"] = [
        {"sliding_window": 8},
        {"sliding_window": None},
        {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"] * 2},
    ]
    for extra in settings[arch]:
        hf_cfg = getattr(transformers, CLASSES[arch])(**small, **extra)
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
        ours = ModelConfig.from_dict({**hf_cfg.to_dict(), "architectures": [arch]})
        for i, layer in enumerate(model.model.layers):
            expected = getattr(
                layer.self_attn, "sliding_window", getattr(hf_cfg, "sliding_window", None)
            )
            assert ours.layer_window(i) == expected, (extra, i)


# A family without partial rotary, its transformers config class, beside what it needs to build
TOP_LEVEL_ROTARY_REFUSED = {
    **{arch: (cls, {}) for arch, cls in CLASSES.items()},
    "MixtralForCausalLM": ("MixtralConfig", {}),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", {}),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", {}),
    "DeepseekV2ForCausalLM": ("DeepseekV2Config", {}),
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", {}),
}


@pytest.mark.parametrize("arch", sorted(TOP_LEVEL_ROTARY_REFUSED))
def test_a_top_level_partial_rotary_factor_is_refused_where_not_implemented(arch):
    """transformers 5 moves a top-level partial_rotary_factor into rope_parameters (convert_rope_params_to_dict):
    one other than 1.0 is refused by name as one inside rope_parameters is, not dropped; 1.0 loads."""
    cls, extra = TOP_LEVEL_ROTARY_REFUSED[arch]
    config_class = getattr(transformers, cls)
    base = {**config_class(num_hidden_layers=4, **extra).to_dict(), "architectures": [arch]}
    # (transformers writes into the rope_parameters it is given)
    moved = config_class.from_dict(copy.deepcopy({**base, "partial_rotary_factor": 0.5}))
    assert moved.rope_parameters["partial_rotary_factor"] == 0.5
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict({**base, "partial_rotary_factor": 0.5}, "ckpt/config.json")
    assert "ckpt/config.json" in str(err.value) and "'partial_rotary_factor'" in str(err.value)
    assert "0.5" in str(err.value)
    assert ModelConfig.from_dict({**base, "partial_rotary_factor": 1.0}) == ModelConfig.from_dict(
        base
    )
    refused({**base, "partial_rotary_factor": "0.5"}, "partial_rotary_factor", "'0.5'")


def test_a_top_level_partial_rotary_factor_loads_where_implemented():
    """Qwen3-Next rotates that part of each head (models/qwen3_next.py); Gemma 3 and 4 configs keep their
    rope_parameters by layer type, which transformers leaves it out of (their models ignore it)."""
    from helpers.gemma_models import GEMMA3_TEXT, GEMMA4_TEXT
    from helpers.hybrid_models import HYBRIDS

    cls, fields = HYBRIDS["qwen3_next"]
    qwen = {
        **getattr(transformers, cls)(**fields).to_dict(),
        "architectures": ["Qwen3NextForCausalLM"],
    }
    qwen.pop("rope_parameters")
    for factor in (0.5, 0.25):
        cfg = ModelConfig.from_dict({**qwen, "partial_rotary_factor": factor})
        assert cfg.raw["partial_rotary_factor"] == factor
    for cls, fields, arch in (
        ("Gemma3TextConfig", GEMMA3_TEXT, "Gemma3ForCausalLM"),
        ("Gemma4TextConfig", GEMMA4_TEXT, "Gemma4ForCausalLM"),
    ):
        base = {**getattr(transformers, cls)(**fields).to_dict(), "architectures": [arch]}
        config_class = getattr(transformers, cls)
        given = config_class.from_dict(copy.deepcopy({**base, "partial_rotary_factor": 0.5}))
        assert given.rope_parameters == config_class.from_dict(copy.deepcopy(base)).rope_parameters
        assert ModelConfig.from_dict({**base, "partial_rotary_factor": 0.5}).architecture == arch
