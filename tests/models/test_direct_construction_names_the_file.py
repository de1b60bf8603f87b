"""A family's class constructed directly from a config read from a file (``cls(cfg)``, not through models/loader.py
``build_model``) raises its checks' ConfigError naming that config.json and the field, as build_model does
(models/config_hooks.py ``ConfigHooks.__init_subclass__``): before, these said ``ModelConfig.field=value`` alone.
The classes whose own constructor raises, one whose constructor is a mixin's (Kimi-K2.5: models/multimodal.py
``TextOfMultimodal``), and one whose check runs in a base's (Mixtral: the MoE stack in Llama's)."""

import copy
import json

import pytest
import torch
import transformers

from helpers.deepseek_models import SMALL as DEEPSEEK_SMALL
from helpers.deepseek_models import VARIANTS as DEEPSEEK_VARIANTS
from helpers.gemma_models import GEMMA3_TEXT
from helpers.hf_models import SMALL
from helpers.hybrid_models import HYBRIDS
from helpers.step3p5_checkpoints import CONFIG as STEP3P5
from outpace.model_config import ModelConfig
from outpace.registry import model_class
from outpace.validation import ConfigError


def written(cls: str, arch: str, **fields) -> dict:
    config = getattr(transformers, cls)(**copy.deepcopy(fields)).to_dict()
    return {**config, "architectures": [arch]}


def deepseek_v3() -> dict:
    cls, extra = DEEPSEEK_VARIANTS["v3-yarn"]
    return written(cls, "DeepseekV3ForCausalLM", **{**DEEPSEEK_SMALL, **extra})


def kimi_k25(**text_fields) -> dict:
    text = {**deepseek_v3(), "model_type": "kimi_k2", **text_fields}
    return {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text}


def hybrid(variant: str, arch: str) -> dict:
    cls, fields = HYBRIDS[variant]
    return written(cls, arch, **fields)


# (family, its config.json with a value that parsing accepts and the family's constructor refuses, the field)
CASES = [
    ("deepseek_v3", lambda: {**deepseek_v3(), "scoring_func": "softmax"}, "scoring_func"),
    ("kimi_k25", lambda: kimi_k25(scoring_func="softmax"), "scoring_func"),
    (
        "mixtral",
        lambda: written("MixtralConfig", "MixtralForCausalLM", **SMALL, num_local_experts=0),
        "num_local_experts",
    ),
    (
        "qwen3_next",
        lambda: {**hybrid("qwen3_next", "Qwen3NextForCausalLM"), "attn_output_gate": False},
        "attn_output_gate",
    ),
    (
        "nemotron_h",
        lambda: {
            **hybrid("nemotron_h", "NemotronHForCausalLM"),
            "mamba_ssm_cache_dtype": "float16",
        },
        "mamba_ssm_cache_dtype",
    ),
    (
        "gemma3",
        lambda: written(
            "Gemma3TextConfig", "Gemma3ForCausalLM", **GEMMA3_TEXT, attn_logit_softcapping=50.0
        ),
        "attn_logit_softcapping",
    ),
    ("step3p5", lambda: {**copy.deepcopy(STEP3P5), "sink": True}, "sink"),
]


@pytest.mark.parametrize("family, config, field", CASES, ids=[c[0] for c in CASES])
def test_a_family_constructed_directly_names_the_config_file_and_the_field(
    family, config, field, tmp_path
):
    (tmp_path / "config.json").write_text(json.dumps(config()))
    cfg = ModelConfig.from_pretrained(tmp_path)  # (parsing accepts it: the check is the family's)
    cls = model_class(cfg.architecture)
    with pytest.raises(ConfigError) as err, torch.device("meta"):
        cls(cfg)
    message, path = str(err.value), str(tmp_path / "config.json")
    assert message.startswith(f"{path}: ") and message.count(path) == 1, message
    assert field in message, message


def test_a_config_given_as_a_dict_is_named_by_its_default_name():
    """``ModelConfig.from_dict`` without a source: the file is "config.json", as the parse's errors say."""
    cfg = ModelConfig.from_dict({**deepseek_v3(), "scoring_func": "softmax"})
    with pytest.raises(ConfigError, match=r"^config\.json: .*scoring_func"), torch.device("meta"):
        model_class(cfg.architecture)(cfg)


def test_a_family_built_from_a_good_config_is_the_same():
    """The wrapped constructor builds what it did: the parameters of a DeepSeek-V3 model, by name and shape."""
    cfg = ModelConfig.from_dict(deepseek_v3())
    with torch.device("meta"):
        model = model_class(cfg.architecture)(cfg)
    assert type(model).__init__.__wrapped__.__qualname__ == "DeepseekForCausalLM.__init__"
    assert any(name.endswith("kv_a_proj_with_mqa.weight") for name, _ in model.named_parameters())
