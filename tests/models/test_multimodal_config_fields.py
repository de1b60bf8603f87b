"""Every field of the multimodal checkpoints' configs that outpace serves the text model of (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL dense and MoE, Mistral 3 with a Mistral or a Ministral 3 text model) is implemented, irrelevant to the
text model, or refused by name: the walk covers the top level and the ``text_config`` (tests/helpers/config_walk.py
``built``: the model built on the meta device, described)."""

from __future__ import annotations

import pytest
import transformers

from helpers.config_walk import COMMON_IRRELEVANT, built

TEXT_SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
MOE_SIZES = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
# architecture -> (config class, its text model's sizes and model_type where the class has a choice)
CONFIGS = {
    "Qwen2VLForConditionalGeneration": (transformers.Qwen2VLConfig, TEXT_SIZES),
    "Qwen2_5_VLForConditionalGeneration": (transformers.Qwen2_5_VLConfig, TEXT_SIZES),
    "Qwen3VLForConditionalGeneration": (transformers.Qwen3VLConfig, dict(TEXT_SIZES, head_dim=8)),
    "Qwen3VLMoeForConditionalGeneration": (
        transformers.Qwen3VLMoeConfig,
        dict(TEXT_SIZES, head_dim=8, **MOE_SIZES),
    ),
    "Mistral3ForConditionalGeneration": (transformers.Mistral3Config, TEXT_SIZES),
    "Mistral3ForConditionalGeneration/ministral3": (
        transformers.Mistral3Config,
        dict(TEXT_SIZES, model_type="ministral3"),
    ),
}


def base_config(case: str) -> dict:
    cls, text = CONFIGS[case]
    return {**cls(text_config=text).to_dict(), "architectures": [case.split("/")[0]]}


# the top level's fields that are the vision tower's, the projector's or the prompt's (image and video tokens)
TOP_IRRELEVANT = COMMON_IRRELEVANT | {
    "vision_config",
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "projector_hidden_act",
    "multimodal_projector_bias",
    "spatial_merge_size",
    "vision_feature_layer",
}
TOP_IMPLEMENTED = {
    "text_config": lambda base: {**base["text_config"], "hidden_size": 48},
    "tie_word_embeddings": lambda base: not base["tie_word_embeddings"],
    "dtype": lambda base: "bfloat16",
}
TEXT_IRRELEVANT = COMMON_IRRELEVANT | {"output_router_logits", "router_aux_loss_coef"}
# text field -> (another value, or a function of the text config giving one; other text changes that let it matter)
TEXT_IMPLEMENTED = {
    "vocab_size": (100, {}),
    "hidden_size": (48, {}),
    "intermediate_size": (96, {}),
    "num_hidden_layers": (6, {"layer_types": None}),
    "num_attention_heads": (8, {}),
    "num_key_value_heads": (4, {}),
    "head_dim": (16, {}),
    "hidden_act": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (3e-5, {}),
    "tie_word_embeddings": (lambda text: not text["tie_word_embeddings"], {}),
    "rope_parameters": (lambda text: {**text["rope_parameters"], "rope_theta": 5e4}, {}),
    "eos_token_id": (7, {}),
    "dtype": ("bfloat16", {}),
    "attention_bias": (True, {}),
    "sliding_window": (
        8,
        {"use_sliding_window": True, "max_window_layers": 0, "layer_types": None},
    ),
    "use_sliding_window": (
        True,
        {"sliding_window": 8, "max_window_layers": 0, "layer_types": None},
    ),
    "max_window_layers": (
        1,
        {"use_sliding_window": True, "sliding_window": 8, "layer_types": None},
    ),
    "layer_types": (
        lambda text: ["sliding_attention"] + ["full_attention"] * (text["num_hidden_layers"] - 1),
        {"use_sliding_window": True, "sliding_window": 8},
    ),
    "num_experts": (8, {}),
    "num_local_experts": (
        8,
        {},
    ),  # (transformers 5 writes the expert count so; the hub's configs num_experts)
    "num_experts_per_tok": (3, {}),
    "moe_intermediate_size": (24, {}),
    "decoder_sparse_step": (2, {}),
    "mlp_only_layers": ([1], {}),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_every_field_is_implemented_irrelevant_or_refused(case):
    base = base_config(case)
    unknown = sorted(set(base) - set(TOP_IMPLEMENTED) - TOP_IRRELEVANT - {"architectures"})
    assert not unknown, f"{case} top-level fields nobody decided on: {unknown}"
    for name in sorted(set(base) & set(TOP_IMPLEMENTED)):
        changed = {**base, name: TOP_IMPLEMENTED[name](base)}
        assert built(changed) != built(base), f"{case}: {name} changes nothing"
    for name in sorted(set(base) & TOP_IRRELEVANT - {"vision_config"}):
        changed = {**base, name: "changed" if base[name] is None else not base[name]}
        assert built(changed) == built(base), f"{case}: {name}"
    text = base["text_config"]
    unknown = sorted(set(text) - set(TEXT_IMPLEMENTED) - TEXT_IRRELEVANT - {"architectures"})
    assert not unknown, f"{case} text_config fields nobody decided on: {unknown}"
    # where the top level gives these, its value is the one transformers uses (model_config.py _text_model_config)
    overridden = {k for k in TOP_IMPLEMENTED if k != "text_config" and base.get(k) is not None}
    for name in sorted(set(text) & set(TEXT_IMPLEMENTED) - overridden):
        value, context = TEXT_IMPLEMENTED[name]
        value = value(text) if callable(value) else value
        before = {**base, "text_config": {**text, **context}}
        after = {**base, "text_config": {**text, **context, name: value}}
        assert built(after) != built(before), (
            f"{case}: text_config.{name}={value!r} changes nothing"
        )
    for name in sorted(set(text) & (TEXT_IRRELEVANT | overridden)):
        changed = "changed" if text[name] is None or isinstance(text[name], str) else not text[name]
        after = {**base, "text_config": {**text, name: changed}}
        assert built(after) == built(base), f"{case}: text_config.{name}"
