"""Random-initialised transformers checkpoints of the hybrid targets (Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, their
text models and their multimodal checkpoints, Nemotron-H) for tests: tiny, odd shapes (grouped value heads,
partial RoPE, Mamba groups, MoE)."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.vision_towers import tiny_qwen_vision

COMMON = dict(
    vocab_size=131,
    hidden_size=40,
    intermediate_size=56,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
DELTANET = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    head_dim=12,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
)

QWEN35_TEXT = dict(COMMON, **DELTANET, num_hidden_layers=3, full_attention_interval=2)
QWEN35_MOE_TEXT = dict(
    {k: v for k, v in QWEN35_TEXT.items() if k != "intermediate_size"},  # (no dense MLP)
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=12,
    shared_expert_intermediate_size=20,
)
QWEN35_VISION = tiny_qwen_vision(40, num_position_embeddings=16)

NEMOTRON_H = dict(
    COMMON,
    head_dim=10,
    mamba_num_heads=6,
    mamba_head_dim=5,
    n_groups=2,
    ssm_state_size=7,
    conv_kernel=4,
    chunk_size=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=12,
    moe_shared_expert_intermediate_size=16,
    n_group=2,
    topk_group=1,
    layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
)

# variant -> (transformers config class, config; a multimodal one's with text_config and vision_config)
HYBRIDS = {
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(
            COMMON,
            **DELTANET,
            num_hidden_layers=4,
            layer_types=[
                "linear_attention",
                "full_attention",
                "linear_attention",
                "linear_attention",
            ],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=12,
            shared_expert_intermediate_size=20,
            mlp_only_layers=[2],
        ),
    ),
    "qwen3_5": ("Qwen3_5TextConfig", QWEN35_TEXT),
    # Qwen3.5's mixture (Qwen3.5-35B-A3B's layout): every layer's MLP routed experts beside a gated shared one
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", QWEN35_MOE_TEXT),
    # the hub's Qwen3.5 checkpoints are multimodal: the text model under model.language_model, a vision tower
    "qwen3_5-multimodal": (
        "Qwen3_5Config",
        dict(text_config=QWEN35_TEXT, vision_config=QWEN35_VISION),
    ),
    "qwen3_5_moe-multimodal": (
        "Qwen3_5MoeConfig",
        dict(text_config=QWEN35_MOE_TEXT, vision_config=QWEN35_VISION),
    ),
    "nemotron_h": ("NemotronHConfig", NEMOTRON_H),
    # Nemotron 3's latent MoE: the routed experts in a latent space of 8 (fc1/fc2_latent_proj), the shared
    # expert and the router on the hidden state
    "nemotron_h-latent": ("NemotronHConfig", dict(NEMOTRON_H, moe_latent_size=8)),
}


def make_hybrid(variant: str, weight_scale: float = 4.0, **overrides):
    """A random model; its matrices ``weight_scale`` times transformers' initialisation (std 0.02), so that
    each token's distribution depends strongly on the tokens (the recurrent state) before it."""
    import transformers

    cls_name, extra = HYBRIDS[variant]
    cfg = getattr(transformers, cls_name)(**{**extra, **overrides})
    torch.manual_seed(0)
    if (
        "text_config" in extra
    ):  # (the multimodal class: AutoModelForCausalLM builds the text model alone)
        model = getattr(transformers, cls_name.replace("Config", "ForConditionalGeneration"))(cfg)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # make every weight matter (norms start at 0 or 1, biases at 0)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            elif p.dim() >= 2:
                p.mul_(weight_scale)
    return model.eval()


def save_hybrid(model, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path
