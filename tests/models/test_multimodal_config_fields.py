"""Every field of the multimodal checkpoints' configs that outpace serves the text model of (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL dense and MoE, Mistral 3 with a Mistral or a Ministral 3 text model) is implemented, irrelevant to the
text model, or refused by name: the walk covers the top level and the ``text_config`` (tests/helpers/config_walk.py
``built``: the model built on the meta device, described)."""

from __future__ import annotations

import pytest
import transformers

from helpers.config_walk import COMMON_IRRELEVANT, TEXT_MODEL_IMPLEMENTED, walk_fields

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
    "text_config": (lambda base: {**base["text_config"], "hidden_size": 48}, {}),
    "tie_word_embeddings": (lambda base: not base["tie_word_embeddings"], {}),
    "dtype": ("bfloat16", {}),
}
TEXT_IRRELEVANT = COMMON_IRRELEVANT | {"output_router_logits", "router_aux_loss_coef"}
TEXT_IMPLEMENTED = {
    **TEXT_MODEL_IMPLEMENTED,
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
    walk_fields(case, base, TOP_IMPLEMENTED, TOP_IRRELEVANT)
    # where the top level gives these, its value is the one transformers uses (model_config.py _text_model_config)
    overridden = {k for k in TOP_IMPLEMENTED if k != "text_config" and base.get(k) is not None}
    implemented = {k: v for k, v in TEXT_IMPLEMENTED.items() if k not in overridden}

    walk_fields(
        case + " text_config", base["text_config"], implemented, TEXT_IRRELEVANT | overridden,
        change=lambda text, fields: {**base, "text_config": {**text, **fields}},
    )  # fmt: skip
