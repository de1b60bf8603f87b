"""Tiny Gemma 3 and Gemma 4 text configs and random transformers models (fp32) for tests: odd shapes (head_dim
12, 5 heads over 1 KV head, vocab 211), sliding windows of 7 rows, both layer kinds' RoPE settings, logit
softcapping; Gemma 4's per-layer embeddings, wider full-layer heads, KV sharing and the MoE block; Gemma 4's dense
unified model with its vision and audio embedders."""

import torch
import transformers

WINDOW = 7
GEMMA3_TEXT = dict(
    vocab_size=211,
    hidden_size=60,
    intermediate_size=88,
    num_hidden_layers=5,
    num_attention_heads=5,
    num_key_value_heads=1,
    head_dim=12,
    max_position_embeddings=512,
    sliding_window=WINDOW,
    sliding_window_pattern=3,  # layers 0, 1, 3, 4 slide; layer 2 is full
    query_pre_attn_scalar=20,
    final_logit_softcapping=0.5,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
)
VISION = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
)
VISION4 = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    position_embedding_size=64,
)

GEMMA4_TEXT = dict(
    vocab_size=211,
    hidden_size=60,
    intermediate_size=88,
    num_hidden_layers=5,
    num_attention_heads=5,
    num_key_value_heads=1,
    head_dim=12,
    max_position_embeddings=512,
    sliding_window=WINDOW,
    layer_types=[
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ],
    global_head_dim=16,  # full layers' heads are wider, and rotate a quarter of their dimensions
    final_logit_softcapping=0.5,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=211,
    rope_parameters={
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1e5,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
)
# Gemma 4's dense unified text model (gemma-4-12B): no per-layer embeddings (Gemma4UnifiedTextConfig drops the fields)
GEMMA4_UNIFIED_TEXT = {
    k: v
    for k, v in GEMMA4_TEXT.items()
    if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")
}
# its encoder-free vision and audio embedders (transformers Gemma4UnifiedVisionConfig / Gemma4UnifiedAudioConfig)
VISION4_UNIFIED = dict(
    patch_size=4, pooling_kernel_size=2, mm_embed_dim=16, mm_posemb_size=8, output_proj_dims=16
)
AUDIO4_UNIFIED = dict(audio_embed_dim=16)
# k = v on the full layers, with 5 KV heads there; layers 3 and 4 share the KV of layers 1 and 2 (the last
# earlier layer of their type) and have double-wide MLPs; a 4-expert top-2 MoE block beside every MLP.
GEMMA4_MOE_SHARED = dict(
    GEMMA4_TEXT,
    attention_k_eq_v=True,
    num_global_key_value_heads=5,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=24,
)

# variant -> its transformers config
VARIANTS = {
    "gemma3": lambda: transformers.Gemma3TextConfig(**GEMMA3_TEXT),
    "gemma3-multimodal": lambda: transformers.Gemma3Config(
        text_config=GEMMA3_TEXT, vision_config=VISION, mm_tokens_per_image=4
    ),
    "gemma4": lambda: transformers.Gemma4TextConfig(**GEMMA4_TEXT),
    "gemma4-moe-kv-shared": lambda: transformers.Gemma4TextConfig(**GEMMA4_MOE_SHARED),
    "gemma4-multimodal": lambda: transformers.Gemma4Config(
        text_config=GEMMA4_TEXT, vision_config=VISION4, audio_config=None
    ),
    "gemma4-unified": lambda: transformers.Gemma4UnifiedConfig(
        text_config=GEMMA4_UNIFIED_TEXT, vision_config=VISION4_UNIFIED, audio_config=AUDIO4_UNIFIED
    ),
}
PROMPT = [
    3,
    17,
    99,
    150,
    8,
    42,
    7,
    3,
    17,
    99,
    150,
    8,
    61,
    5,
]  # 14 tokens, twice the window; repeats for n-grams


def make_every_weight_matter(model) -> None:
    """Add noise to what transformers initialises to 0 or 1: norms, scalars, scales and biases (parameters and
    the checkpoint's buffers, such as layer_scalar)."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if "norm" in name or "scal" in name or name.endswith("bias"):
                t.add_(torch.randn_like(t) * 0.1)


def random_gemma(config):
    """A transformers Gemma model of ``config``, seeded, every weight mattering, in eval mode."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    make_every_weight_matter(model)
    return model.eval()


def make_gemma(variant: str):
    return random_gemma(VARIANTS[variant]())


# Head counts that split over 2 and 3 ranks (the tensor-parallel tests): 6 heads and every MLP divisible by 2
# and by 3; Gemma 3 keeps one kv head (replicated); Gemma 4 is GEMMA4_MOE_SHARED (k = v full layers, with 6 kv
# heads there, KV-sharing layers, double-wide MLPs, the MoE block and per-layer embeddings).
SPLIT_HEADS = dict(num_attention_heads=6, num_key_value_heads=1, intermediate_size=96)
SPLITTABLE = {
    "gemma3": ("Gemma3TextConfig", dict(GEMMA3_TEXT, **SPLIT_HEADS)),
    "gemma4": (
        "Gemma4TextConfig",
        dict(
            GEMMA4_MOE_SHARED, **SPLIT_HEADS, num_global_key_value_heads=6, moe_intermediate_size=24
        ),
    ),
}


def make_splittable_gemma(variant: str, **extra):
    """A Gemma text model of SPLITTABLE (and ``extra`` config fields)."""
    cls, fields = SPLITTABLE[variant]
    return random_gemma(getattr(transformers, cls)(**{**fields, **extra}))
