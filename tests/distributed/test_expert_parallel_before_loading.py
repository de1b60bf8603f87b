"""Expert parallelism on a model without routed experts is refused before its weights load (it was refused once
loaded: minutes at real size), decided by the family's own constructor on the meta device
(engine/start_up.py ``builds_routed_experts``), not by a reading of config.json that would have to restate every
family's rule. The decision is checked for every architecture the registry serves, dense and MoE, against the
model that family really builds, including configs whose expert fields say MoE while no layer is one."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from helpers.deepseek_models import MISTRAL4
from helpers.deepseek_models import SMALL as DEEPSEEK_SMALL
from helpers.deepseek_models import VARIANTS as DEEPSEEK_VARIANTS
from helpers.gemma_models import (
    AUDIO4_UNIFIED,
    GEMMA3_TEXT,
    GEMMA4_MOE_SHARED,
    GEMMA4_TEXT,
    GEMMA4_UNIFIED_TEXT,
    VISION,
    VISION4,
    VISION4_UNIFIED,
)
from helpers.hf_models import MINISTRAL3_ROPE, PIXTRAL, QWEN2_MOE, SMALL
from helpers.hybrid_models import HYBRIDS, NEMOTRON_H, QWEN35_MOE_TEXT, QWEN35_TEXT, QWEN35_VISION
from helpers.qwen3_moe_models import BASE as QWEN3_MOE
from helpers.step3p5_checkpoints import CONFIG as STEP3P5
from outpace.config import EngineConfig
from outpace.engine.start_up import builds_routed_experts, check_before_loading
from outpace.layers.moe import RoutedExperts
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model
from outpace.registry import MODELS
from outpace.validation import ConfigError


def written(cls: str, arch: str, **fields) -> dict:
    return {
        **getattr(transformers, cls)(**copy.deepcopy(fields)).to_dict(),
        "architectures": [arch],
    }


def deepseek(variant: str, **fields) -> dict:
    cls, extra = DEEPSEEK_VARIANTS[variant]
    return written(
        cls, cls.replace("Config", "ForCausalLM"), **{**DEEPSEEK_SMALL, **extra, **fields}
    )


def mistral4_text() -> dict:
    from transformers.models.mistral4 import Mistral4Config

    return Mistral4Config(**copy.deepcopy(MISTRAL4)).to_dict()


def kimi_k25(arch: str) -> dict:
    """Kimi-K2.5's layout (tests/helpers/deepseek_models.py ``write_kimi_k25``): a DeepSeek-V3 text_config."""
    text = {**deepseek("v3-yarn"), "model_type": "kimi_k2"}
    vision = {"model_type": "kimi_k25_vision", "hidden_size": 16, "patch_size": 4}
    return {
        "architectures": [arch],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": False,
    }


QWEN_VL_TEXT = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
QWEN_VL_MOE = dict(QWEN_VL_TEXT, head_dim=8, num_experts=4, num_experts_per_tok=2)
# Nemotron-H without a "moe" layer: n_routed_experts still in the file
NEMOTRON_H_DENSE = dict(
    NEMOTRON_H,
    layers_block_type=["linear_attention", "mlp", "full_attention", "mlp", "linear_attention"],
)

# case -> (config.json, whether the family builds routed experts for it)
CASES = {
    "llama": (lambda: written("LlamaConfig", "LlamaForCausalLM", **SMALL), False),
    "mistral": (
        lambda: written("MistralConfig", "MistralForCausalLM", **SMALL, sliding_window=None),
        False,
    ),
    "ministral3": (
        lambda: written(
            "Ministral3Config", "Ministral3ForCausalLM", **SMALL, rope_parameters=MINISTRAL3_ROPE
        ),
        False,
    ),
    "ministral": (
        lambda: written(
            "MinistralConfig",
            "MinistralForCausalLM",
            **SMALL,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            head_dim=8,
        ),
        False,
    ),
    "mistral3-multimodal": (
        lambda: written(
            "Mistral3Config",
            "Mistral3ForConditionalGeneration",
            text_config=dict(SMALL, sliding_window=None, model_type="mistral"),
            vision_config=PIXTRAL,
        ),
        False,
    ),
    "mistral3-multimodal-mistral4": (
        lambda: written(
            "Mistral3Config",
            "Mistral3ForConditionalGeneration",
            text_config=mistral4_text(),
            vision_config=dict(PIXTRAL, model_type="pixtral"),
        ),
        True,
    ),
    "mixtral": (
        lambda: written("MixtralConfig", "MixtralForCausalLM", **SMALL, num_local_experts=4),
        True,
    ),
    "deepseek-v2": (lambda: deepseek("v2-greedy"), True),
    "deepseek-v3": (lambda: deepseek("v3-yarn"), True),
    # experts declared, every layer before first_k_dense_replace: dense
    "deepseek-v3-all-dense-layers": (
        lambda: deepseek("v3-plain", first_k_dense_replace=DEEPSEEK_SMALL["num_hidden_layers"]),
        False,
    ),
    "mistral4": (lambda: {**mistral4_text(), "architectures": ["Mistral4ForCausalLM"]}, True),
    "kimi-k25": (lambda: kimi_k25("KimiK25ForConditionalGeneration"), True),
    "kimi-k25-underscored": (lambda: kimi_k25("Kimi_K25ForConditionalGeneration"), True),
    "qwen2": (lambda: written("Qwen2Config", "Qwen2ForCausalLM", **SMALL), False),
    "qwen2-moe": (
        lambda: written(
            "Qwen2MoeConfig", "Qwen2MoeForCausalLM", **SMALL, **QWEN2_MOE, mlp_only_layers=[1]
        ),
        True,
    ),
    # experts declared, every layer in mlp_only_layers: dense
    "qwen2-moe-all-mlp-only": (
        lambda: written(
            "Qwen2MoeConfig", "Qwen2MoeForCausalLM", **SMALL, **QWEN2_MOE, mlp_only_layers=[0, 1, 2]
        ),
        False,
    ),
    "qwen2-vl": (
        lambda: written(
            "Qwen2VLConfig", "Qwen2VLForConditionalGeneration", text_config=QWEN_VL_TEXT
        ),
        False,
    ),
    "qwen2.5-vl": (
        lambda: written(
            "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", text_config=QWEN_VL_TEXT
        ),
        False,
    ),
    "qwen3": (lambda: written("Qwen3Config", "Qwen3ForCausalLM", **SMALL, head_dim=16), False),
    "qwen3-moe": (lambda: written("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **QWEN3_MOE), True),
    "qwen3-vl": (
        lambda: written(
            "Qwen3VLConfig",
            "Qwen3VLForConditionalGeneration",
            text_config=dict(QWEN_VL_TEXT, head_dim=8),
        ),
        False,
    ),
    "qwen3-vl-moe": (
        lambda: written(
            "Qwen3VLMoeConfig",
            "Qwen3VLMoeForConditionalGeneration",
            text_config=dict(QWEN_VL_MOE, moe_intermediate_size=16),
        ),
        True,
    ),
    "step3p5": (lambda: copy.deepcopy(STEP3P5), True),
    # experts declared, no layer in moe_layers_enum: dense
    "step3p5-no-moe-layers": (lambda: {**copy.deepcopy(STEP3P5), "moe_layers_enum": ""}, False),
    "gemma3": (lambda: written("Gemma3TextConfig", "Gemma3ForCausalLM", **GEMMA3_TEXT), False),
    "gemma3-multimodal": (
        lambda: written(
            "Gemma3Config",
            "Gemma3ForConditionalGeneration",
            text_config=GEMMA3_TEXT,
            vision_config=VISION,
            mm_tokens_per_image=4,
        ),
        False,
    ),
    "gemma4": (lambda: written("Gemma4TextConfig", "Gemma4ForCausalLM", **GEMMA4_TEXT), False),
    "gemma4-moe": (
        lambda: written("Gemma4TextConfig", "Gemma4ForCausalLM", **GEMMA4_MOE_SHARED),
        True,
    ),
    # experts declared, enable_moe_block off: dense
    "gemma4-moe-block-off": (
        lambda: written(
            "Gemma4TextConfig",
            "Gemma4ForCausalLM",
            **{**GEMMA4_MOE_SHARED, "enable_moe_block": False},
        ),
        False,
    ),
    "gemma4-multimodal": (
        lambda: written(
            "Gemma4Config",
            "Gemma4ForConditionalGeneration",
            text_config=GEMMA4_TEXT,
            vision_config=VISION4,
            audio_config=None,
        ),
        False,
    ),
    "gemma4-unified": (
        lambda: written(
            "Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM", **GEMMA4_UNIFIED_TEXT
        ),
        False,
    ),
    "gemma4-unified-multimodal": (
        lambda: written(
            "Gemma4UnifiedConfig",
            "Gemma4UnifiedForConditionalGeneration",
            text_config=GEMMA4_UNIFIED_TEXT,
            vision_config=VISION4_UNIFIED,
            audio_config=AUDIO4_UNIFIED,
        ),
        False,
    ),
    "qwen3-next": (
        lambda: written(
            HYBRIDS["qwen3_next"][0], "Qwen3NextForCausalLM", **HYBRIDS["qwen3_next"][1]
        ),
        True,
    ),
    "qwen3.5": (lambda: written("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", **QWEN35_TEXT), False),
    "qwen3.5-moe": (
        lambda: written("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", **QWEN35_MOE_TEXT),
        True,
    ),
    "qwen3.5-multimodal": (
        lambda: written(
            "Qwen3_5Config",
            "Qwen3_5ForConditionalGeneration",
            text_config=QWEN35_TEXT,
            vision_config=QWEN35_VISION,
        ),
        False,
    ),
    "qwen3.5-moe-multimodal": (
        lambda: written(
            "Qwen3_5MoeConfig",
            "Qwen3_5MoeForConditionalGeneration",
            text_config=QWEN35_MOE_TEXT,
            vision_config=QWEN35_VISION,
        ),
        True,
    ),
    "nemotron-h": (lambda: written("NemotronHConfig", "NemotronHForCausalLM", **NEMOTRON_H), True),
    "nemotron-h-no-moe-layers": (
        lambda: written("NemotronHConfig", "NemotronHForCausalLM", **NEMOTRON_H_DENSE),
        False,
    ),
}


def model_config(case: str) -> ModelConfig:
    return ModelConfig.from_dict(CASES[case][0](), f"{case}/config.json")


def test_every_registered_architecture_has_a_case():
    served = {model_config(case).architecture for case in CASES}
    assert served == set(MODELS), set(MODELS) - served


@pytest.mark.parametrize("case", list(CASES))
def test_the_check_before_loading_agrees_with_the_model_built(case):
    """The meta-device decision, the model the family builds on the CPU and what the case states agree."""
    cfg = model_config(case)
    model = build_model(cfg, torch.float32, "cpu")
    built = any(isinstance(m, RoutedExperts) for m in model.modules())
    assert builds_routed_experts(cfg) == built == CASES[case][1]


def test_a_dense_model_is_refused_expert_parallelism_before_its_weights_load(monkeypatch):
    """``check_before_loading`` (before the tokenizer and the target load) refuses it by name."""
    monkeypatch.setattr(
        "outpace.engine.start_up.load_model", lambda *a, **k: pytest.fail("weights loaded")
    )
    config = EngineConfig(model="zoo/tinypy", device="cpu", expert_parallel_size=2)
    with pytest.raises(
        ConfigError,
        match=r"EngineConfig.expert_parallel_size=2 is invalid: the model in zoo/tinypy has no "
        r"routed experts",
    ):
        check_before_loading(config, ModelConfig.from_pretrained("zoo/tinypy"))


def test_a_moe_model_passes_the_check_before_loading():
    config = EngineConfig(model="zoo/tinyds", device="cpu", expert_parallel_size=2)
    check_before_loading(config, ModelConfig.from_pretrained("zoo/tinyds"))
