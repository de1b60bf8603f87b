"""Switches that families read with bool() or a truth test are refused by name unless a JSON bool (or null, read
as false): the string "false" was taken as true, 0 as false. Gemma 4's attention_k_eq_v (no v_proj on full
layers), use_double_wide_mlp and enable_moe_block (which met a bare TypeError at build); Nemotron-H's mlp_bias,
use_conv_bias, use_bias and norm_topk_prob."""

import copy

import pytest
import torch
import transformers

from helpers.config_walk import built
from helpers.gemma_models import GEMMA4_TEXT
from helpers.hybrid_models import HYBRIDS
from outpace.model_config import ModelConfig
from outpace.registry import model_class
from outpace.validation import ConfigError

SOURCE = "ckpt/config.json"
GEMMA4_SWITCHES = ("attention_k_eq_v", "use_double_wide_mlp", "enable_moe_block")
NEMOTRON_H_SWITCHES = ("mlp_bias", "use_conv_bias", "use_bias", "norm_topk_prob")


def gemma4(**fields) -> dict:
    written = transformers.Gemma4TextConfig(**copy.deepcopy(GEMMA4_TEXT)).to_dict()
    return {**written, "architectures": ["Gemma4ForCausalLM"], **fields}


def nemotron_h(**fields) -> dict:
    cls, known = HYBRIDS["nemotron_h"]
    written = getattr(transformers, cls)(**copy.deepcopy(known)).to_dict()
    return {**written, "architectures": ["NemotronHForCausalLM"], **fields}


def build(cfg: dict):
    model_cfg = ModelConfig.from_dict(cfg, SOURCE)
    with torch.device("meta"):
        return model_class(model_cfg.architecture)(model_cfg)


def assert_refused(cfg: dict, field: str, value) -> None:
    with pytest.raises(ConfigError) as error:
        build(cfg)
    message = str(error.value)
    assert message.startswith(f"{SOURCE}: field '{field}' must be true or false"), message
    assert repr(value) in message, message


@pytest.mark.parametrize("value", ["false", 0, "yes"])
@pytest.mark.parametrize("field", GEMMA4_SWITCHES)
def test_a_gemma4_switch_not_a_bool_is_refused_by_name(field, value):
    assert_refused(gemma4(**{field: value}), field, value)


@pytest.mark.parametrize("value", ["false", 0, "yes"])
@pytest.mark.parametrize("field", NEMOTRON_H_SWITCHES)
def test_a_nemotron_h_switch_not_a_bool_is_refused_by_name(field, value):
    assert_refused(nemotron_h(**{field: value}), field, value)


def v_projections(cfg: dict) -> int:
    return sum(name.endswith("v_proj.weight") for name, _ in build(cfg).named_parameters())


def test_gemma4_switches_false_and_null_build_as_absent():
    absent = built(gemma4())
    for field in GEMMA4_SWITCHES:
        assert built(gemma4(**{field: False})) == absent, field
        assert built(gemma4(**{field: None})) == absent, field
    full = GEMMA4_TEXT["layer_types"].count("full_attention")
    assert v_projections(gemma4(attention_k_eq_v=True)) == v_projections(gemma4()) - full


@pytest.mark.parametrize("field", NEMOTRON_H_SWITCHES)
def test_nemotron_h_switches_true_false_and_null_build(field):
    """null builds as false (bool(None), as transformers' truth tests read it), as before."""
    assert built(nemotron_h(**{field: None})) == built(nemotron_h(**{field: False}))
    built(nemotron_h(**{field: True}))
