"""Tiny Qwen3-MoE configs and random transformers models (fp32) for tests: mixture layers beside dense ones
(mlp_only_layers, decoder_sparse_step), renormalised and raw top-k weights, attention biases, a sliding window
on every layer."""

from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from helpers.vision_towers import tiny_qwen_vision

VOCAB = 97
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    moe_intermediate_size=16,
    num_experts=6,
    num_experts_per_tok=2,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4},
)
# fields beside BASE for a model of whole 128 x 128 blocks (the published block-FP8 checkpoints' and the GPU's fp8
# kernels' block): two 128-wide q heads and one k/v head, q/k/v of 512 rows
BLOCK_128 = dict(
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
)
# variant -> config fields beside BASE
VARIANTS = {
    # layer 1 dense (mlp_only_layers), the others mixtures; top-k weights renormalised
    "renormalised": dict(norm_topk_prob=True, mlp_only_layers=[1]),
    # mixtures on layers 1 and 3 (decoder_sparse_step 2), raw softmax weights, attention biases, a window of 7
    "sparse-step-window": dict(
        norm_topk_prob=False,
        decoder_sparse_step=2,
        attention_bias=True,
        use_sliding_window=True,
        sliding_window=7,
    ),
}


def make_qwen3_moe(variant: str, **overrides):
    """A transformers Qwen3MoeForCausalLM of ``variant`` (and ``overrides`` of its fields), seeded, with weights
    large enough that routing and the norms matter."""
    cfg = transformers.Qwen3MoeConfig(**{**BASE, **VARIANTS[variant], **overrides})
    return randomized(transformers.Qwen3MoeForCausalLM(cfg))


def make_qwen3_vl_moe(**overrides):
    """A transformers Qwen3VLMoeForConditionalGeneration (Qwen3-VL-30B-A3B's class): the renormalised variant's
    text model (its router always renormalises; interleaved rotary sections) beside a vision tower."""
    text = {**BASE, **VARIANTS["renormalised"], **overrides}
    del text["norm_topk_prob"]
    text["rope_parameters"] = {
        **BASE["rope_parameters"],
        "mrope_section": [1, 1, 2],
        "mrope_interleaved": True,
    }
    vision = tiny_qwen_vision(
        text["hidden_size"], num_position_embeddings=16, deepstack_visual_indexes=[0]
    )
    cfg = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision)
    return randomized(transformers.Qwen3VLMoeForConditionalGeneration(cfg))


def randomized(model):
    """``model`` (seeded), its norms and biases perturbed and its matrices drawn wide enough that routing and
    the norms matter."""
    torch.manual_seed(0)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.2)
    return model


def to_hub_expert_order(path: Path) -> Path:
    """A saved Qwen3-VL-MoE checkpoint rewritten in the hub's order: each expert stack's last two dims swapped
    (transformers' conversion_mapping for qwen3_vl_moe transposes them back when it loads one)."""
    tensors = load_file(path / "model.safetensors")
    for name in [n for n in tensors if ".mlp.experts." in n]:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path
