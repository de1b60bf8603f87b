"""RoPE scaling fields of config.json are checked when the config is read, as layers/rotary.py reads them: a bad
value is refused with a ConfigError naming the file and the field, not a TypeError or KeyError from the rotary
tables later; valid configs, as public checkpoints write them, read as before."""

import json
import re

import pytest
import transformers

from outpace.layers.rotary import RotaryEmbedding
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
