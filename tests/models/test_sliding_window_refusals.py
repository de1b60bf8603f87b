"""A ``sliding_window`` on a family whose attention has none (Llama, DeepSeek V2 / V3 and the families on their code,
Qwen3-Next and Qwen3.5, Nemotron-H) is refused naming the config.json and the field (models/config_hooks.py
``refuse_window``): before, Llama's, DeepSeek's, Qwen3-Next's and Qwen3.5's loaded and ran every layer full, where
vLLM slides every layer by it. A null window, or one switched off by ``use_sliding_window: false`` (SpecForge's EAGLE3
drafts, which are read as Llama's), still loads; the families that implement windows still read them."""

import copy
import json

import pytest
import transformers

from helpers.deepseek_models import MISTRAL4
from helpers.deepseek_models import SMALL as DEEPSEEK_SMALL
from helpers.hf_models import SMALL
from helpers.hybrid_models import HYBRIDS
from helpers.step3p5_checkpoints import CONFIG as STEP3P5
from outpace.model_config import ModelConfig
from outpace.models.drafts.eagle3 import Eagle3Config
from outpace.validation import ConfigError


def written(cls: str, arch: str, **fields) -> dict:
    config = getattr(transformers, cls)(**copy.deepcopy(fields)).to_dict()
    return {**config, "architectures": [arch]}


def deepseek(cls: str, arch: str) -> dict:
    return written(cls, arch, **DEEPSEEK_SMALL)


def kimi_k25() -> dict:
    """Kimi-K2.5's config.json (helpers/deepseek_models.py write_kimi_k25): DeepSeek-V3's as its text_config."""
    text = {**deepseek("DeepseekV3Config", "DeepseekV3ForCausalLM"), "model_type": "kimi_k2"}
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
    }


def hybrid(variant: str, arch: str) -> dict:
    cls, fields = HYBRIDS[variant]
    return written(cls, arch, **fields)


# family -> its config.json, which transformers writes without a window
WINDOWLESS = {
    "llama": lambda: written("LlamaConfig", "LlamaForCausalLM", **SMALL),
    "deepseek_v2": lambda: deepseek("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": lambda: deepseek("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "mistral4": lambda: written("Mistral4Config", "Mistral4ForCausalLM", **MISTRAL4),
    "kimi_k25": kimi_k25,
    "qwen3_next": lambda: hybrid("qwen3_next", "Qwen3NextForCausalLM"),
    "qwen3_5": lambda: hybrid("qwen3_5", "Qwen3_5ForCausalLM"),
    "nemotron_h": lambda: hybrid("nemotron_h", "NemotronHForCausalLM"),
}


def with_fields(config: dict, **fields) -> dict:
    """``config`` with ``fields`` where its text model reads them (a multimodal one's text_config)."""
    if "text_config" in config:
        return {**config, "text_config": {**config["text_config"], **fields}}
    return {**config, **fields}


def loaded(tmp_path, config: dict) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ModelConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", list(WINDOWLESS))
def test_a_window_on_a_family_without_one_is_refused_naming_file_and_field(family, tmp_path):
    config = with_fields(WINDOWLESS[family](), sliding_window=4096)
    with pytest.raises(ConfigError) as err:
        loaded(tmp_path, config)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: "), message
    assert "'sliding_window'" in message and "4096" in message, message
    # use_sliding_window true does not make one either
    with pytest.raises(ConfigError, match="'sliding_window'"):
        loaded(tmp_path, with_fields(config, use_sliding_window=True))


@pytest.mark.parametrize("family", list(WINDOWLESS))
@pytest.mark.parametrize(
    "fields",
    [
        {"sliding_window": None},
        {"sliding_window": 4096, "use_sliding_window": False},
        {"use_sliding_window": True},
    ],
    ids=["null", "switched-off", "no-window"],
)
def test_no_window_loads_full_attention(family, fields, tmp_path):
    base = loaded(tmp_path, WINDOWLESS[family]())
    cfg = loaded(tmp_path, with_fields(WINDOWLESS[family](), **fields))
    assert cfg.layer_windows == () and cfg == base


# sgl-project/SpecForge configs/qwen2.5-7b-eagle3.json and gemma3-1b-eagle3.json: a window switched off
SPECFORGE_EAGLE3 = dict(
    SMALL,
    architectures=["LlamaForCausalLMEagle3"],
    num_hidden_layers=1,
    draft_vocab_size=100,
    use_sliding_window=False,
    max_window_layers=28,
)


@pytest.mark.parametrize("window", [131072, 512, None])
def test_specforge_eagle3_drafts_with_a_switched_off_window_load(window):
    cfg = Eagle3Config.from_dict({**SPECFORGE_EAGLE3, "sliding_window": window}, "d/config.json")
    assert cfg.layer.layer_windows == ()


def test_an_eagle3_draft_that_asks_for_a_window_is_refused():
    draft = {**SPECFORGE_EAGLE3, "sliding_window": 512}
    del draft["use_sliding_window"]
    with pytest.raises(ConfigError, match=r"^d/config\.json: field 'sliding_window'"):
        Eagle3Config.from_dict(draft, "d/config.json")


def test_families_with_windows_read_them():
    """Qwen2's window with use_sliding_window, Mistral's on every layer, Step-3.5's per layer type (its own)."""
    qwen2 = written(
        "Qwen2Config",
        "Qwen2ForCausalLM",
        **SMALL,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
    )
    assert ModelConfig.from_dict(qwen2).layer_windows == (None, 8, 8)
    mistral = written("MistralConfig", "MistralForCausalLM", **SMALL, sliding_window=8)
    assert ModelConfig.from_dict(mistral).layer_windows == (8, 8, 8)
    assert STEP3P5["sliding_window"] is not None
    assert ModelConfig.from_dict(copy.deepcopy(STEP3P5)).layer_windows == ()
