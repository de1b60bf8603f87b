"""Tiny Step-3.5-Flash checkpoints for tests, written under the public Step-3.5 tensor names (transformers has no
Step3p5 class): a config.json with every field the real one carries, at odd sizes, and random tensors."""

import json

import torch
from safetensors.torch import save_file

N, MTP = 4, 3  # decoder layers, MTP layers (model.layers.4-6)
TYPES = [
    "full_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
    "sliding_attention",
    "full_attention",
    "sliding_attention",
]
FULL = [t == "full_attention" for t in TYPES]
# Every field of a Step-3.5-Flash config.json (the fields vLLM's Step3p5Config takes, and the ones its
# config.json carries beside them, as Megatron-Bridge's HF_STEP3P5_TOY_CONFIG mirrors it), at odd sizes:
# vocabulary 61, head_dim 12 (6 rotated on full layers), 4 heads on full layers and 6 on sliding ones,
# 7 experts, a shared expert wider than the routed ones, an MTP layer that is MoE.
CONFIG = {
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "auto_map": {
        "AutoConfig": "configuration_step3p5.Step3p5Config",
        "AutoModelForCausalLM": "modeling_step3p5.Step3p5ForCausalLM",
    },
    "hidden_size": 40,
    "intermediate_size": 56,
    "num_hidden_layers": N,
    "num_attention_heads": 4,
    "num_attention_groups": 2,
    "head_dim": 12,
    "vocab_size": 61,
    "max_seq_len": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "layer_types": TYPES,
    "sliding_window": 5,
    "attention_other_setting": {
        "attention_type": "sliding_attention",
        "num_attention_heads": 6,
        "num_attention_groups": 2,
        "head_dim": 12,
    },
    "rope_theta": [5e4 if f else 1e3 for f in FULL],
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 2.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn_only_types": ["full_attention"],
    "partial_rotary_factors": [0.5 if f else 1.0 for f in FULL],
    "use_rope_layers": [],
    "use_moe": True,
    "moe_num_experts": 7,
    "moe_top_k": 3,
    "moe_intermediate_size": 20,
    "share_expert_dim": 28,
    "moe_layer_offset": 0,
    "moe_every_n_layer": 1,
    "moe_layers_enum": "1,2,4",
    "moe_dynamic_exp_p": 1.0,
    "moe_router_activation": "sigmoid",
    "moe_router_scaling_factor": 3.0,
    "use_moe_router_bias": True,
    "need_fp32_gate": True,
    "norm_expert_weight": True,
    "use_qk_norm": True,
    "use_head_wise_attn_gate": True,
    "att_impl_type": "GQA",
    "zero_centered": True,
    "sink": False,
    "swiglu_limits": [0.0, 0.3, 0.0, 0.0, 0.3, 0.0, 0.0],
    "swiglu_limits_shared": [0.4, 0.0, 0.3, 0.0, 0.0, 0.4, 0.0],
    "num_nextn_predict_layers": MTP,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": [1, 2],
    "torch_dtype": "float32",
}


def layer_shape(cfg: dict, i: int) -> tuple[int, int]:
    other = cfg["attention_other_setting"]
    sliding = cfg["layer_types"][i] == "sliding_attention"
    return (
        (other["num_attention_heads"], other["num_attention_groups"])
        if sliding
        else (cfg["num_attention_heads"], cfg["num_attention_groups"])
    )


def moe_layers(cfg: dict) -> set[int]:
    return {int(i) for i in cfg["moe_layers_enum"].split(",")}


def checkpoint(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under Step-3.5-Flash's checkpoint names (vLLM step3p5.py / step3p5_mtp.py load_weights,
    SGLang step3p5.py): dense ``mlp.*``; MoE ``moe.gate.weight``, ``moe.router_bias``, the experts stacked as
    ``moe.{gate,up,down}_proj.weight`` [experts, out, in], ``share_expert.*``; MTP layers' ``enorm``, ``hnorm``,
    ``eh_proj``, ``transformer.shared_head.{norm,output}``. Norm weights sit around 0 (zero-centred)."""
    g = torch.Generator().manual_seed(seed)
    h, d, v, e = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"], cfg["moe_num_experts"]

    def w(*shape):
        return 0.1 * torch.randn(*shape, generator=g)

    t = {"model.embed_tokens.weight": w(v, h), "lm_head.weight": w(v, h), "model.norm.weight": w(h)}
    for i in range(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]):
        p, (heads, kv) = f"model.layers.{i}.", layer_shape(cfg, i)
        t.update(
            {
                p + "input_layernorm.weight": w(h),
                p + "post_attention_layernorm.weight": w(h),
                p + "self_attn.q_proj.weight": w(heads * d, h),
                p + "self_attn.k_proj.weight": w(kv * d, h),
                p + "self_attn.v_proj.weight": w(kv * d, h),
                p + "self_attn.o_proj.weight": w(h, heads * d),
                p + "self_attn.g_proj.weight": w(heads, h),
                p + "self_attn.q_norm.weight": w(d),
                p + "self_attn.k_norm.weight": w(d),
            }
        )
        if i in moe_layers(cfg):
            inter, share = cfg["moe_intermediate_size"], cfg["share_expert_dim"]
            t.update(
                {
                    p + "moe.gate.weight": w(e, h),
                    p + "moe.router_bias": w(e),
                    p + "moe.gate_proj.weight": w(e, inter, h),
                    p + "moe.up_proj.weight": w(e, inter, h),
                    p + "moe.down_proj.weight": w(e, h, inter),
                    p + "share_expert.gate_proj.weight": w(share, h),
                    p + "share_expert.up_proj.weight": w(share, h),
                    p + "share_expert.down_proj.weight": w(h, share),
                }
            )
        else:
            inter = cfg["intermediate_size"]
            t.update(
                {
                    p + "mlp.gate_proj.weight": w(inter, h),
                    p + "mlp.up_proj.weight": w(inter, h),
                    p + "mlp.down_proj.weight": w(h, inter),
                }
            )
        if i >= cfg["num_hidden_layers"]:
            t.update(
                {
                    p + "enorm.weight": w(h),
                    p + "hnorm.weight": w(h),
                    p + "eh_proj.weight": w(h, 2 * h),
                    p + "transformer.shared_head.norm.weight": w(h),
                    p + "transformer.shared_head.output.weight": w(v, h),
                }
            )
    return t


def write_checkpoint(path, cfg: dict, seed: int = 0):
    tensors = checkpoint(cfg, seed)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg))
    return path, tensors
