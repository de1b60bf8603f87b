"""The seed families at their public shapes, as config.json dicts outpace's loader accepts
(``python -m outpace.bench.families``, bench/families.py, measures them), and the Llama-3.1-8B shape to compare
them with.

Each value is the public hub config.json's (the repository id is named beside each shape; the values were
read from stored copies of those configs in public code: model-config tests and parsers of other engines,
transformers' configuration classes and vLLM's Step3p5Config). A model too large for one GPU is a LAYER
SLICE: its first layers with their real per-layer shapes and the real vocabulary and head, fewer layers
(``FamilyShape.full_layers`` says how many the model has), so figures are reported per layer too.

``slice_layers`` cuts a config to its first n layers (every per-layer list and pattern with it); ``shrink``
keeps a config's architecture, fields and layer pattern at tiny sizes (the CPU tests load every shape so).
"""

from __future__ import annotations

from dataclasses import dataclass

# Per-layer entries of the families' configs (cut with the layers by ``slice_layers``).
PER_LAYER_LISTS = (
    "layer_types",
    "partial_rotary_factors",
    "swiglu_limits",
    "swiglu_limits_shared",
)
# How a family names its routed experts and the experts each token chooses.
EXPERT_COUNT_FIELDS = ("n_routed_experts", "num_experts", "moe_num_experts")
TOP_K_FIELDS = ("num_experts_per_tok", "top_k_experts", "moe_top_k")


@dataclass(frozen=True)
class FamilyShape:
    name: str
    source: str  # the public hub repository whose config.json gives the values
    config: dict
    full_layers: int  # the model's decoder layers (config's num_hidden_layers when whole)
    tiny_layers: int  # decoder layers ``shrink`` keeps: one period of the family's layer pattern
    note: str = ""

    @property
    def is_slice(self) -> bool:
        return self.config["num_hidden_layers"] < self.full_layers


def slice_layers(config: dict, layers: int) -> dict:
    """``config`` cut to its first ``layers`` decoder layers: per-layer lists, the Nemotron-H layer pattern
    and Step's MoE layer list cut with them; no MTP layers."""
    cut = {**config, "num_hidden_layers": layers}
    for name in PER_LAYER_LISTS:
        if isinstance(config.get(name), list):
            cut[name] = config[name][:layers]
    if isinstance(config.get("rope_theta"), list):  # Step: one theta per layer
        cut["rope_theta"] = config["rope_theta"][:layers]
    if "hybrid_override_pattern" in config:
        cut["hybrid_override_pattern"] = config["hybrid_override_pattern"][:layers]
    if "moe_layers_enum" in config:
        kept = [i for i in config["moe_layers_enum"].split(",") if int(i) < layers]
        cut["moe_layers_enum"] = ",".join(kept)
    for name in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if name in config:
            cut[name] = 0
    return cut


def with_mtp(config: dict, layers: int = 1) -> dict:
    """``config`` with ``layers`` MTP layers after its decoder layers, as the released checkpoints carry them:
    ``num_nextn_predict_layers`` (DeepSeek-V3's ``model.layers.{num_hidden_layers}``, Step-3.5-Flash's the
    same, Qwen3-Next's ``mtp.layers.0``: vLLM's qwen3_next_mtp reads it, 1 when absent). Step-3.5-Flash's
    per-layer lists run num_hidden_layers + num_nextn_predict_layers long (models/step3p5.py), so each is
    extended by its last layer's entry, and its MTP layers are MoE layers (``moe_layers_enum``), as the
    released ones are; which attention type the released MTP layers have is not checked (random weights:
    the bench times their shape)."""
    out = {**config, "num_nextn_predict_layers": layers}
    if config.get("model_type") != "step3p5":
        return out
    for name in (*PER_LAYER_LISTS, "rope_theta"):
        if isinstance(config.get(name), list):
            out[name] = config[name] + config[name][-1:] * layers
    extra = range(config["num_hidden_layers"], config["num_hidden_layers"] + layers)
    out["moe_layers_enum"] = ",".join([config["moe_layers_enum"], *map(str, extra)])
    return out


def experts_per_token(config: dict) -> tuple[int, int]:
    """(routed experts per MoE layer, experts each token chooses); (0, 0) for a dense model."""
    experts = next((config[f] for f in EXPERT_COUNT_FIELDS if config.get(f)), 0)
    top_k = next((config[f] for f in TOP_K_FIELDS if config.get(f)), 0)
    return (experts, top_k) if experts else (0, 0)


# Tiny values of the size fields (those a config has are replaced; the others stay absent).
TINY = dict(
    vocab_size=151,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    share_expert_dim=48,
    moe_shared_expert_intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_attention_groups=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    mamba_num_heads=8,
    mamba_head_dim=16,
    n_groups=2,
    ssm_state_size=16,
    sliding_window=8,
    query_pre_attn_scalar=16,
    max_position_embeddings=4096,
    vocab_size_per_layer_input=151,
)
TINY_EXPERTS, TINY_TOP_K = 16, 4


def shrink(config: dict, layers: int) -> dict:
    """``config`` at tiny sizes (``TINY``), its first ``layers`` layers, at most 16 experts of which 4 per
    token: the same architecture and fields, small enough for the CPU."""
    tiny = slice_layers(config, layers)
    tiny.update({k: v for k, v in TINY.items() if k in config})
    if config.get("num_key_value_heads") == config.get("num_attention_heads"):  # MLA, plain MHA
        tiny["num_key_value_heads"] = TINY["num_attention_heads"]
    if config.get("q_lora_rank"):
        tiny["q_lora_rank"] = 48
    for name in EXPERT_COUNT_FIELDS:
        if config.get(name):
            tiny[name] = min(config[name], TINY_EXPERTS)
    for name in TOP_K_FIELDS:
        if config.get(name):
            tiny[name] = min(config[name], TINY_TOP_K)
    if "first_k_dense_replace" in config:
        tiny["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers - 1)
    if isinstance(config.get("attention_other_setting"), dict):  # Step's sliding layers' heads
        tiny["attention_other_setting"] = {
            **config["attention_other_setting"],
            "num_attention_heads": 6,
            "num_attention_groups": 2,
            "head_dim": TINY["head_dim"],
        }
    if (
        isinstance(config.get("rope_scaling"), dict)
        and "original_max_position_embeddings" in (config["rope_scaling"])
    ):
        tiny["rope_scaling"] = {**config["rope_scaling"], "original_max_position_embeddings": 64}
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "partial_rotary_factor" in rope and "qk_rope_head_dim" in tiny:
        # Mistral 4's: MLA's share of rotated dimensions, derived from the (tiny) head dimensions
        share = tiny["qk_rope_head_dim"] / (tiny["qk_rope_head_dim"] + tiny["qk_nope_head_dim"])
        tiny["rope_parameters"] = {**rope, "partial_rotary_factor": share}
    return tiny


# ---- the shapes ------------------------------------------------------------------------------------------
# huggingface.co/deepseek-ai/DeepSeek-V3 config.json (transformers' DeepseekV3Config defaults are the same
# values): MLA with 128 heads, 256 routed experts of which 8 per token in 8 groups of which 4, sigmoid scores
# with a correction bias (noaux_tc), 1 shared expert, 3 dense layers then 58 MoE layers, one MTP layer.
DEEPSEEK_V3 = dict(
    architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3",
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,
    n_shared_experts=1,
    n_routed_experts=256,
    routed_scaling_factor=2.5,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    v_head_dim=128,
    qk_nope_head_dim=128,
    topk_method="noaux_tc",
    n_group=8,
    topk_group=4,
    num_experts_per_tok=8,
    moe_layer_freq=1,
    first_k_dense_replace=3,
    norm_topk_prob=True,
    scoring_func="sigmoid",
    hidden_act="silu",
    max_position_embeddings=163840,
    rms_norm_eps=1e-6,
    rope_theta=10000,
    rope_scaling={
        "type": "yarn",
        "factor": 40,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    attention_bias=False,
    tie_word_embeddings=False,
    num_nextn_predict_layers=1,
    torch_dtype="bfloat16",
    bos_token_id=0,
    eos_token_id=1,
)
# huggingface.co/moonshotai/Kimi-K2-Instruct config.json: the DeepSeek-V3 architecture with 64 heads, 384
# routed experts of which 8, no expert groups (n_group 1), one dense layer, vocabulary 163840.
KIMI_K2 = {
    **DEEPSEEK_V3,
    "model_type": "kimi_k2",
    "vocab_size": 163840,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "routed_scaling_factor": 2.827,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 131072,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "num_nextn_predict_layers": 0,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}
# huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json (transformers' Qwen3NextConfig defaults): 48
# layers, every 4th gated full attention and the others gated DeltaNet, every layer a MoE of 512 experts of
# which 10 plus a gated shared expert.
QWEN3_NEXT_80B = dict(
    architectures=["Qwen3NextForCausalLM"],
    model_type="qwen3_next",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=5120,
    num_hidden_layers=48,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    hidden_act="silu",
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    rope_theta=10000000,
    partial_rotary_factor=0.25,
    attention_bias=False,
    tie_word_embeddings=False,
    full_attention_interval=4,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_experts=512,
    num_experts_per_tok=10,
    norm_topk_prob=True,
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151645,
)
# huggingface.co/nvidia/Nemotron-H-8B-Base-8K config.json: 52 layers, 24 Mamba2 (M), 4 attention (*) and
# 24 squared-ReLU MLP (-) layers.
NEMOTRON_H_8B = dict(
    architectures=["NemotronHForCausalLM"],
    model_type="nemotron_h",
    vocab_size=131072,
    hidden_size=4096,
    intermediate_size=21504,
    num_hidden_layers=52,
    hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    attention_bias=False,
    mlp_bias=False,
    mlp_hidden_act="relu2",
    mamba_num_heads=128,
    mamba_head_dim=64,
    mamba_hidden_act="silu",
    mamba_proj_bias=False,
    n_groups=8,
    ssm_state_size=128,
    conv_kernel=4,
    expand=2,
    chunk_size=128,
    use_conv_bias=True,
    use_bias=False,
    layer_norm_epsilon=1e-5,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    residual_in_fp32=False,
    torch_dtype="bfloat16",
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# huggingface.co/google/gemma-3-12b-it config.json, its text_config (Gemma3TextConfig) as a text model: 48
# layers, 5 sliding-window (1024) layers to 1 global one, the head tied to the embedding.
GEMMA3_12B = dict(
    architectures=["Gemma3ForCausalLM"],
    model_type="gemma3_text",
    vocab_size=262208,
    hidden_size=3840,
    intermediate_size=15360,
    num_hidden_layers=48,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=256,
    sliding_window=1024,
    sliding_window_pattern=6,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)],
    rope_theta=1000000,
    rope_local_base_freq=10000,
    rope_scaling={"factor": 8.0, "rope_type": "linear"},
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    attention_bias=False,
    attn_logit_softcapping=None,
    final_logit_softcapping=None,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
    bos_token_id=2,
    eos_token_id=[1, 106],
)
# huggingface.co/google/gemma-4-26B-A4B config.json, its text_config (Gemma4TextConfig) as a text model: 30
# layers, 5 sliding (1024) to 1 full, full layers with 512-wide heads, 2 kv heads and k = v; every layer a
# dense GELU MLP plus a MoE of 128 experts of which 8; final logits soft-capped at 30.
GEMMA4_26B_A4B = dict(
    architectures=["Gemma4ForCausalLM"],
    model_type="gemma4_text",
    vocab_size=262144,
    hidden_size=2816,
    intermediate_size=2112,
    num_hidden_layers=30,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=2,
    attention_k_eq_v=True,
    hidden_activation="gelu_pytorch_tanh",
    sliding_window=1024,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(30)],
    rope_parameters={
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    attention_bias=False,
    final_logit_softcapping=30.0,
    enable_moe_block=True,
    num_experts=128,
    top_k_experts=8,
    moe_intermediate_size=704,
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=262144,
    num_kv_shared_layers=0,
    use_double_wide_mlp=False,
    use_bidirectional_attention="vision",
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
STEP3P5_LAYERS, STEP3P5_SLICE_LAYERS = 45, 8
# huggingface.co/stepfun-ai/Step-3.5-Flash config.json (vLLM's Step3p5Config defaults and public copies of
# the config): 45 layers, full attention (64 heads, 8 kv groups, half the head rotated, theta 5e6) on every
# 4th layer from layer 0 and sliding attention (window 512, 96 heads, 8 groups, theta 1e4) between, per-head
# attention gates, 3 dense layers then MoE layers 3..44 of 288 experts of which 8 (sigmoid with a router
# bias) plus a shared expert; 3 MTP layers (left out here: ``with_mtp`` adds them). The per-layer lists run
# num_hidden_layers long. The SwiGLU clamps are 0 (none) on every layer: the released config's values for
# its last layers are not known here. The one trace found in stored public text is a third-party summary of
# StepFun's training code (SteptronOss ``Step3p5FlashMoEConfig``: routed-expert clamps {43: 7.0, 44: 7.0},
# shared {44: 16.0}), not the released config.json, and the stored copy of that training config
# (stepfun-ai/SteptronOss playground/pretrain/step3p5/step3p5_flash.py) sets none; random weights measure the
# cost, which a clamp barely changes.
STEP3P5_FLASH = dict(
    architectures=["Step3p5ForCausalLM"],
    model_type="step3p5",
    vocab_size=128896,
    hidden_size=4096,
    intermediate_size=11264,
    num_hidden_layers=STEP3P5_LAYERS,
    num_attention_heads=64,
    num_attention_groups=8,
    head_dim=128,
    max_seq_len=262144,
    max_position_embeddings=262144,
    rms_norm_eps=1e-5,
    layer_types=[
        "full_attention" if i % 4 == 0 else "sliding_attention" for i in range(STEP3P5_LAYERS)
    ],
    sliding_window=512,
    attention_other_setting={
        "attention_type": "sliding_attention",
        "num_attention_heads": 96,
        "num_attention_groups": 8,
        "head_dim": 128,
    },
    rope_theta=[5e6 if i % 4 == 0 else 1e4 for i in range(STEP3P5_LAYERS)],
    rope_scaling={
        "rope_type": "llama3",
        "factor": 2.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 32.0,
        "original_max_position_embeddings": 131072,
    },
    yarn_only_types=["full_attention"],
    partial_rotary_factors=[0.5 if i % 4 == 0 else 1.0 for i in range(STEP3P5_LAYERS)],
    use_rope_layers=[],
    moe_num_experts=288,
    moe_top_k=8,
    moe_intermediate_size=1280,
    share_expert_dim=1280,
    moe_layers_enum=",".join(str(i) for i in range(3, STEP3P5_LAYERS)),
    moe_router_activation="sigmoid",
    moe_router_scaling_factor=3.0,
    use_moe_router_bias=True,
    need_fp32_gate=True,
    norm_expert_weight=True,
    use_qk_norm=True,
    use_head_wise_attn_gate=True,
    att_impl_type="GQA",
    zero_centered=True,
    sink=False,
    swiglu_limits=[0.0] * STEP3P5_LAYERS,
    swiglu_limits_shared=[0.0] * STEP3P5_LAYERS,
    num_nextn_predict_layers=0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
    bos_token_id=0,
    eos_token_id=[1, 2, 128007],
)


# The first 8 layers of it: 3 dense + 5 MoE layers (2 full, 6 sliding attention).
STEP3P5_FLASH_SLICE = slice_layers(STEP3P5_FLASH, STEP3P5_SLICE_LAYERS)


# huggingface.co/Qwen/Qwen3-30B-A3B config.json (public copies of it, e.g. MoE profiling configs derived from it;
# vLLM's and SGLang's qwen3_moe tests): 48 layers of GQA (32 heads over 4, head_dim 128) with a mixture of 128
# experts of which 8 (renormalised), no shared expert, on every layer. 61 GB in bf16: the whole model.
QWEN3_30B_A3B = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    attention_bias=False,
    use_sliding_window=False,
    tie_word_embeddings=False,
    decoder_sparse_step=1,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    mlp_only_layers=[],
    torch_dtype="bfloat16",
)


def qwen35_moe() -> dict:
    """transformers' Qwen3_5MoeTextConfig defaults (its docstring: "the Qwen3.5-35B-A3B style configuration"):
    40 layers of gated DeltaNet and gated attention 3:1, each with a mixture of 256 experts of which 8 plus a
    gated shared expert; vocabulary 248320; 70 GB in bf16, the whole model; without its MTP layer (plain
    decoding reads none)."""
    from transformers import Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(max_position_embeddings=8192).to_dict()
    cfg.update(architectures=["Qwen3_5MoeForCausalLM"], mtp_num_hidden_layers=0)
    return {
        k: v for k, v in cfg.items() if k not in ("id2label", "label2id", "transformers_version")
    }


def mistral_small_4() -> dict:
    """transformers' Mistral4Config defaults (its docstring names mistralai/Mistral-Small-4-119B-2603; 119B
    parameters: 36 layers of MLA and a mixture of 128 experts of which 4 plus a shared one, vocabulary 131072),
    with the rope_parameters its __post_init__ fills in (YaRN, factor 128 over 8192 positions, the query scale by
    position), at an 8192-position context; 238 GB in bf16."""
    from transformers.models.mistral4 import Mistral4Config

    cfg = Mistral4Config(max_position_embeddings=8192).to_dict()
    cfg.update(architectures=["Mistral4ForCausalLM"])
    return {
        k: v for k, v in cfg.items() if k not in ("id2label", "label2id", "transformers_version")
    }


def qwen35() -> dict:
    """The Qwen3.5 shape bench/hybrid_shape.py measures (transformers' Qwen3_5TextConfig defaults, the
    config class of Qwen/Qwen3.5-27B's family: hidden 4096, 32 layers of gated DeltaNet and gated attention
    3:1, vocabulary 248320), without its MTP layer (plain decoding reads none)."""
    from outpace.bench.hybrid_shape import qwen35_config

    return {**qwen35_config(), "mtp_num_hidden_layers": 0}


def family_shapes() -> dict[str, FamilyShape]:
    """Every shape by name (slices: how many layers they keep, in the config)."""
    from outpace.bench.deepseek_shape import V2_LITE
    from outpace.bench.gpu import LLAMA_8B

    return {
        s.name: s
        for s in (
            FamilyShape("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", V2_LITE, 27, 2),
            FamilyShape(
                "deepseek-v3-slice",
                "deepseek-ai/DeepSeek-V3",
                {**slice_layers(DEEPSEEK_V3, 4), "first_k_dense_replace": 1},
                61,
                2,
                "1 dense + 3 MoE layers (the model: 3 dense + 58 MoE and one MTP layer)",
            ),
            FamilyShape(
                "kimi-k2-slice",
                "moonshotai/Kimi-K2-Instruct",
                slice_layers(KIMI_K2, 3),
                61,
                2,
                "1 dense + 2 MoE layers (the model: 1 dense + 60 MoE)",
            ),
            FamilyShape(
                "qwen3-next-80b-slice",
                "Qwen/Qwen3-Next-80B-A3B-Instruct",
                slice_layers(QWEN3_NEXT_80B, 8),
                48,
                4,
                "2 x (3 DeltaNet + 1 gated attention) layers, each with its MoE",
            ),
            FamilyShape(
                "qwen3-next-80b",
                "Qwen/Qwen3-Next-80B-A3B-Instruct",
                QWEN3_NEXT_80B,
                48,
                4,
                "the whole model, 48 layers: quantized only (160 GB in bf16, 80 GB in FP8)",
            ),
            FamilyShape(
                "qwen3.5",
                "transformers Qwen3_5TextConfig defaults (Qwen/Qwen3.5-27B's config class)",
                qwen35(),
                32,
                4,
            ),
            FamilyShape(
                "qwen3.5-35b-a3b",
                "transformers Qwen3_5MoeTextConfig defaults (Qwen/Qwen3.5-35B-A3B's config class)",
                qwen35_moe(),
                40,
                4,
            ),
            FamilyShape("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", QWEN3_30B_A3B, 48, 2),
            FamilyShape("nemotron-h-8b", "nvidia/Nemotron-H-8B-Base-8K", NEMOTRON_H_8B, 52, 8),
            FamilyShape("gemma-3-12b", "google/gemma-3-12b-it", GEMMA3_12B, 48, 6),
            FamilyShape("gemma-4-26b-a4b", "google/gemma-4-26B-A4B", GEMMA4_26B_A4B, 30, 6),
            FamilyShape(
                "mistral-small-4-slice",
                "transformers Mistral4Config defaults (mistralai/Mistral-Small-4-119B-2603's config class)",
                slice_layers(mistral_small_4(), 8),
                36,
                2,
                "8 MoE layers (the model: 36, every one MoE)",
            ),
            FamilyShape(
                "step-3.5-flash-slice",
                "stepfun-ai/Step-3.5-Flash",
                STEP3P5_FLASH_SLICE,
                45,
                4,
                "3 dense + 5 MoE layers (2 full, 6 sliding attention); the model: 3 dense + 42 MoE",
            ),
            FamilyShape(
                "llama-3.1-8b",
                "meta-llama/Llama-3.1-8B",
                LLAMA_8B,
                32,
                2,
                "the dense comparison (bench gpu's 8B shape); last, so a time-limited run takes the families first",
            ),
        )
    }
