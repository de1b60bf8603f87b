"""Name -> class registries with lazy imports (models, proposers), instead of if/elif factories."""

from __future__ import annotations

import importlib
from typing import Any

MODELS = {
    "LlamaForCausalLM": "outpace.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "outpace.models.mistral:MistralForCausalLM",
    "Ministral3ForCausalLM": "outpace.models.mistral:MistralForCausalLM",  # + query scaling by position
    "MinistralForCausalLM": "outpace.models.mistral:MinistralForCausalLM",  # windows by layer_types
    "Mistral3ForConditionalGeneration": "outpace.models.mistral:Mistral3TextForCausalLM",  # its text model
    "MixtralForCausalLM": "outpace.models.mixtral:MixtralForCausalLM",  # Mistral's layers, sparse MoE MLPs
    # multi-head latent attention, mixture of experts
    "DeepseekV2ForCausalLM": "outpace.models.deepseek:DeepseekForCausalLM",
    "DeepseekV3ForCausalLM": "outpace.models.deepseek:DeepseekForCausalLM",
    # Mistral Small 4's text model: DeepSeek-V3's layers, a softmax router, the query scaled by position
    "Mistral4ForCausalLM": "outpace.models.deepseek:Mistral4ForCausalLM",
    # ... and Mistral Small 4's published checkpoint: a Mistral3ForConditionalGeneration over it (TEXT_MODEL_VARIANTS)
    "Mistral3ForConditionalGeneration/mistral4": "outpace.models.deepseek:Mistral4TextForCausalLM",
    # Kimi-K2.5 / K2.6 (multimodal): their DeepSeek-V3 text model
    "KimiK25ForConditionalGeneration": "outpace.models.deepseek:KimiK25ForCausalLM",
    "Kimi_K25ForConditionalGeneration": "outpace.models.deepseek:KimiK25ForCausalLM",
    "Qwen2ForCausalLM": "outpace.models.qwen2:Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM": "outpace.models.qwen2_moe:Qwen2MoeForCausalLM",  # a gated shared expert
    # Qwen2-VL's and Qwen2.5-VL's checkpoints: their text models
    "Qwen2VLForConditionalGeneration": "outpace.models.qwen2:Qwen2VLTextForCausalLM",
    "Qwen2_5_VLForConditionalGeneration": "outpace.models.qwen2:Qwen2VLTextForCausalLM",
    "Qwen3ForCausalLM": "outpace.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "outpace.models.qwen3_moe:Qwen3MoeForCausalLM",  # sparse MoE MLPs
    # Qwen3-VL's checkpoints: their text models
    "Qwen3VLForConditionalGeneration": "outpace.models.qwen3:Qwen3VLTextForCausalLM",
    "Qwen3VLMoeForConditionalGeneration": "outpace.models.qwen3_moe:Qwen3VLMoeTextForCausalLM",
    # sliding and full attention layers, per-head gates, MoE, chained MTP layers
    "Step3p5ForCausalLM": "outpace.models.step3p5:Step3p5ForCausalLM",
    "Gemma3ForCausalLM": "outpace.models.gemma:Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration": "outpace.models.gemma:Gemma3ForCausalLM",  # its text model
    "Gemma4ForCausalLM": "outpace.models.gemma4:Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration": "outpace.models.gemma4:Gemma4TextForCausalLM",  # its text model
    # Gemma 4's dense "unified" models (gemma-4-12B): no per-layer embeddings, no MoE block
    "Gemma4UnifiedForCausalLM": "outpace.models.gemma4:Gemma4UnifiedForCausalLM",
    "Gemma4UnifiedForConditionalGeneration": "outpace.models.gemma4:Gemma4UnifiedTextForCausalLM",
    # hybrids: gated DeltaNet / Mamba2 layers with a recurrent state per request
    "Qwen3NextForCausalLM": "outpace.models.qwen3_next:Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM": "outpace.models.qwen3_next:Qwen3NextForCausalLM",
    "Qwen3_5MoeForCausalLM": "outpace.models.qwen3_next:Qwen3NextForCausalLM",  # Qwen3.5's mixtures
    # the hub's Qwen3.5 checkpoints (multimodal): their text models
    "Qwen3_5ForConditionalGeneration": "outpace.models.qwen3_next:Qwen35TextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "outpace.models.qwen3_next:Qwen35TextForCausalLM",
    "NemotronHForCausalLM": "outpace.models.nemotron_h:NemotronHForCausalLM",
}


# A multimodal architecture whose text model follows its text_config's model_type: (architecture, model_type) -> the
# name MODELS knows that pairing by (model_config.py ``_architecture``); any other pairing keeps the architecture's.
TEXT_MODEL_VARIANTS = {
    ("Mistral3ForConditionalGeneration", "mistral4"): "Mistral3ForConditionalGeneration/mistral4",
}


def resolve(table: dict[str, str], name: str, kind: str) -> Any:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}: must be one of {', '.join(sorted(table))}")
    module, attr = table[name].split(":")
    return getattr(importlib.import_module(module), attr)


def model_class(architecture: str) -> type:
    return resolve(MODELS, architecture, "architecture")


PROPOSERS = {
    "eagle3": "outpace.speculative.drafters.eagle3:Eagle3Proposer",
    "mtp": "outpace.speculative.drafters.mtp:MTPProposer",
    "dflash": "outpace.speculative.drafters.dflash:DFlashProposer",
    "ngram": "outpace.speculative.drafters.ngram:NgramProposer",
    "draft": "outpace.speculative.drafters.draft_model:DraftModelProposer",
    "gemma4_assistant": "outpace.speculative.drafters.gemma4_assistant:Gemma4AssistantProposer",
}


def proposer_class(method: str) -> type:
    return resolve(PROPOSERS, method, "speculative method")
