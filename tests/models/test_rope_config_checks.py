"""RoPE scaling fields of config.json are checked when the config is read, as layers/rotary.py reads them: a bad
value is refused with a ConfigError naming the file and the field, not a TypeError or KeyError from the rotary
tables later; valid configs, as public checkpoints write them, read as before."""

import json
import re

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from outpace.layers.rotary import RotaryEmbedding, _inverse_frequencies, rope_attention_factor
from outpace.model_config import ModelConfig
from outpace.validation import ConfigError

MAX_POSITIONS = 128
LLAMA = {  # a tiny Llama-style config.json (head_dim 8)
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": MAX_POSITIONS,
    "rope_theta": 10000.0,
}
LINEAR = {"rope_type": "linear", "factor": 2.0}
LLAMA3 = {  # Llama-3.1's
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen's
DEEPSEEK_YARN = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}


def read(tmp_path, **changes) -> ModelConfig:
    """ModelConfig.from_pretrained of a directory holding LLAMA with ``changes`` as its config.json."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return ModelConfig.from_pretrained(tmp_path)


def without(params: dict, key: str) -> dict:
    return {k: v for k, v in params.items() if k != key}


# name -> (rope parameters, the field the error names, what it says)
BAD_ROPE = {
    "linear factor a string": ({**LINEAR, "factor": "2"}, "factor", "must be a number, got '2'"),
    "linear without factor": (without(LINEAR, "factor"), "factor", "is missing"),
    "linear factor 0": ({**LINEAR, "factor": 0}, "factor", "must be a number > 0, got 0"),
    "llama3 factor a string": ({**LLAMA3, "factor": "8"}, "factor", "must be a number, got '8'"),
    "llama3 without low_freq_factor": (
        without(LLAMA3, "low_freq_factor"),
        "low_freq_factor",
        "is missing",
    ),
    "llama3 without high_freq_factor": (
        without(LLAMA3, "high_freq_factor"),
        "high_freq_factor",
        "is missing",
    ),
    "llama3 low_freq_factor 0": (
        {**LLAMA3, "low_freq_factor": 0},
        "low_freq_factor",
        "must be a number > 0, got 0",
    ),
    "llama3 original length a string": (
        {**LLAMA3, "original_max_position_embeddings": "8192"},
        "original_max_position_embeddings",
        "must be a number, got '8192'",
    ),
    "yarn without factor": (without(YARN, "factor"), "factor", "is missing"),
    "yarn attention_factor a string": (
        {**YARN, "attention_factor": "x"},
        "attention_factor",
        "must be a number, got 'x'",
    ),
    "yarn beta_fast a string": (
        {**YARN, "beta_fast": "32"},
        "beta_fast",
        "must be a number, got '32'",
    ),
    "yarn beta_slow negative": (
        {**YARN, "beta_slow": -1.0},
        "beta_slow",
        "must be a number >= 0, got -1.0",
    ),
    "yarn mscale a string": ({**YARN, "mscale": "1"}, "mscale", "must be a number, got '1'"),
    "yarn mscale_all_dim true": (
        {**YARN, "mscale_all_dim": True},
        "mscale_all_dim",
        "must be a number, got True",
    ),
    "yarn original length 0": (
        {**YARN, "original_max_position_embeddings": 0},
        "original_max_position_embeddings",
        "must be a number > 0, got 0",
    ),
}


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("case", list(BAD_ROPE))
def test_bad_rope_field_is_refused_naming_file_and_field(case, key, tmp_path):
    params, field, says = BAD_ROPE[case]
    if key == "rope_scaling" and "rope_type" in params:  # the older layout's name for it
        params = {"type": params["rope_type"], **without(params, "rope_type")}
    expected = f"{tmp_path / 'config.json'}: field '{key}.{field}' {says}"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        read(tmp_path, **{key: params})


@pytest.mark.parametrize("key, name", [("rope_parameters", "rope_type"), ("rope_scaling", "type")])
@pytest.mark.parametrize("kind", [["yarn"], {"yarn": 1}])
def test_a_rope_type_not_a_string_is_refused_naming_it(kind, key, name, tmp_path):
    """(A list or an object as the rope type once failed as a bare TypeError: unhashable type.)"""
    expected = f"{tmp_path / 'config.json'}: field '{key}.{name}' must be a string, got {kind!r}"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        read(
            tmp_path,
            **{key: {**YARN, "rope_type": kind} if name == "rope_type" else {"type": kind}},
        )


@pytest.mark.parametrize("head_dim", [31, None])  # given, or hidden_size // num_attention_heads
def test_odd_head_dim_is_refused(head_dim, tmp_path):
    shape = {"head_dim": 31} if head_dim else {"hidden_size": 62, "num_attention_heads": 2}
    expected = f"{tmp_path / 'config.json'}: field 'head_dim' must be even"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        read(tmp_path, **shape, num_key_value_heads=1)


@pytest.mark.parametrize("params", [LINEAR, LLAMA3, YARN, DEEPSEEK_YARN])
@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_valid_rope_parameters_read_as_given(params, key, tmp_path):
    cfg = read(tmp_path, **{key: params})
    assert cfg.rope_scaling == params
    RotaryEmbedding(cfg.head_dim, MAX_POSITIONS, cfg.rope_theta, cfg.rope_scaling)


@pytest.mark.parametrize("params", [LLAMA3, YARN])
def test_original_length_defaults_to_max_positions_as_in_transformers(params, tmp_path):
    """transformers' standardize_rope_params gives llama3 and yarn without original_max_position_embeddings the
    config's max_position_embeddings."""
    params = without(params, "original_max_position_embeddings")
    cfg = read(tmp_path, rope_parameters=params)
    hf = transformers.LlamaConfig(**{**LLAMA, "rope_parameters": dict(params)})
    expected = hf.rope_parameters["original_max_position_embeddings"]
    assert cfg.rope_scaling == {**params, "original_max_position_embeddings": expected}
    assert expected == MAX_POSITIONS
    RotaryEmbedding(cfg.head_dim, MAX_POSITIONS, cfg.rope_theta, cfg.rope_scaling)


@pytest.mark.parametrize("params", [LLAMA3, YARN])
def test_a_top_level_original_length_overrides_rope_parameters_as_in_transformers(params, tmp_path):
    """A config.json with ``original_max_position_embeddings`` at its top level (Phi-3's layout) beside the one in
    rope_parameters: transformers' standardize_rope_params gives llama3 and yarn the top-level one (before, outpace
    read rope_parameters', and its rotary tables, so its logits, differed from transformers')."""
    top = 64
    cfg = read(tmp_path, rope_parameters=params, original_max_position_embeddings=top)
    hf = transformers.LlamaConfig(
        **{**LLAMA, "rope_parameters": dict(params), "original_max_position_embeddings": top}
    )
    # (what transformers' rotary embedding computes its frequencies from: the config's constructor standardizes
    # before the top-level field is set, the rotary embedding again after)
    expected, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf)
    assert hf.rope_parameters["original_max_position_embeddings"] == top
    assert cfg.rope_scaling == {**params, "original_max_position_embeddings": top}
    ours = _inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    torch.testing.assert_close(ours, expected)


def test_ministral3_query_scaling_takes_the_top_level_original_length_as_transformers_does():
    """Ministral 3's query temperature divides positions by rope_parameters' original_max_position_embeddings as
    transformers' rotary embedding leaves it: a top-level one overrides it there (standardize_rope_params)."""
    from transformers.models.ministral3.modeling_ministral3 import Ministral3RotaryEmbedding

    sizes = {k: v for k, v in LLAMA.items() if k not in ("architectures", "rope_theta")}
    written = {
        **transformers.Ministral3Config(**sizes, head_dim=8).to_dict(),
        "architectures": ["Ministral3ForCausalLM"],
    }
    assert written["rope_parameters"]["original_max_position_embeddings"] == 16384
    hf = transformers.Ministral3Config(**sizes, head_dim=8, original_max_position_embeddings=64)
    Ministral3RotaryEmbedding(hf)  # (what the model's attention then reads)
    assert hf.rope_parameters["original_max_position_embeddings"] == 64
    cfg = ModelConfig.from_dict({**written, "original_max_position_embeddings": 64})
    assert cfg.query_scaling == (hf.rope_parameters["llama_4_scaling_beta"], 64)
    assert cfg.rope_scaling["original_max_position_embeddings"] == 64


def without_rope(config: dict) -> dict:
    """``config`` (a config.json object) with no RoPE field, at its top level or in its text_config; Qwen's rotary
    sections (mrope_section) kept, without a theta."""
    rope = ("rope_parameters", "rope_scaling", "rope_theta")
    out = {k: v for k, v in config.items() if k not in rope}
    if isinstance(config.get("text_config"), dict):
        text = config["text_config"]
        sections = {
            k: v for k, v in (text.get("rope_parameters") or {}).items() if k != "rope_theta"
        }
        out["text_config"] = {k: v for k, v in text.items() if k not in rope}
        if "mrope_section" in sections:
            out["text_config"]["rope_parameters"] = sections
    return out


# architecture -> the transformers config class that reads its config.json (text models: their text_config)
THETA_DEFAULTS = {
    "LlamaForCausalLM": "LlamaConfig",
    "MixtralForCausalLM": "MixtralConfig",
    "Qwen2VLForConditionalGeneration": "Qwen2VLConfig",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2_5_VLConfig",
    "Qwen3VLForConditionalGeneration": "Qwen3VLConfig",
    "Qwen3VLMoeForConditionalGeneration": "Qwen3VLMoeConfig",
}


@pytest.mark.parametrize("arch", list(THETA_DEFAULTS))
def test_a_config_without_rope_theta_gets_its_config_class_default_as_in_transformers(arch):
    """A config.json that gives no rope_theta (nor RoPE parameters): transformers' config class gives it its
    ``default_theta``, 1e6 for Mixtral and Qwen2-VL, 5e5 for Qwen3-VL (before, outpace read 1e4 for every family,
    and its rotary tables, so its logits, differed from transformers')."""
    config_class = getattr(transformers, THETA_DEFAULTS[arch])
    written = without_rope({**config_class().to_dict(), "architectures": [arch]})
    hf = config_class(**{k: v for k, v in written.items() if k != "architectures"})
    expected = hf.get_text_config().rope_parameters["rope_theta"]
    assert ModelConfig.from_dict(written).rope_theta == expected
    if arch != "LlamaForCausalLM":
        assert expected != 10000.0


@pytest.mark.parametrize("multimodal", [False, True])
def test_a_ministral3_config_without_rope_parameters_reads_its_config_class_default(multimodal):
    """Ministral3Config.__post_init__ gives a config.json without rope_parameters a YaRN RoPE of theta 1e6 with the
    query scaling (llama_4_scaling_beta), whatever its top-level rope_theta: read so (before, outpace read the
    default RoPE of the top-level theta, and its logits differed from transformers')."""
    sizes = {k: v for k, v in LLAMA.items() if k not in ("architectures", "rope_theta")}
    text = {**transformers.Ministral3Config(**sizes, head_dim=8).to_dict(), "rope_theta": 5e5}
    text = without_rope(text) | {"rope_theta": 5e5}
    if multimodal:
        written = {
            **transformers.Mistral3Config(text_config=text).to_dict(),
            "architectures": ["Mistral3ForConditionalGeneration"],
        }
        written["text_config"] = text
    else:
        written = {**text, "architectures": ["Ministral3ForCausalLM"]}
    hf = transformers.Ministral3Config(**text).rope_parameters
    assert hf["rope_type"] == "yarn" and hf["rope_theta"] == 1e6
    cfg = ModelConfig.from_dict(written)
    assert cfg.rope_theta == hf["rope_theta"]
    assert cfg.query_scaling == (hf["llama_4_scaling_beta"], hf["original_max_position_embeddings"])
    keys = ("rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
    assert {k: cfg.rope_scaling[k] for k in keys} == {k: hf[k] for k in keys}
    assert rope_attention_factor(cfg.rope_scaling) == rope_attention_factor(hf)
