"""Tiny DeepSeek-V2/V3 and Mistral 4 transformers models (fp32, random weights) for tests: odd shapes (kv_lora_rank
36, vocab 203, v_head_dim != qk_nope_head_dim), YaRN, grouped routing, Mistral 4's query scale by position; a reference of DeepSeek-V3's MTP layer assembled
from transformers' pieces with vLLM deepseek_mtp.py's semantics, and a checkpoint that carries it."""

import json

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

from helpers.hf_models import save_hf_model
from outpace.attention import build_paged_metadata, forward_context

# Odd shapes: kv_lora_rank 36 (not a power of two), vocab 203 (not a multiple of 64), v_head_dim != qk_nope_head_dim.
SMALL = dict(
    vocab_size=203,
    hidden_size=48,
    intermediate_size=80,
    moe_intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=36,
    qk_rope_head_dim=8,
    qk_nope_head_dim=12,
    v_head_dim=10,
    n_routed_experts=8,
    num_experts_per_tok=3,
    max_position_embeddings=256,
    eos_token_id=None,
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "mscale": 0.9,
    "mscale_all_dim": 0.7,
}

VARIANTS = {
    # q_lora_rank, YaRN with both mscales, 4 groups of 2 experts (2 kept), sigmoid scores + correction bias
    "v3-yarn": (
        "DeepseekV3Config",
        dict(
            q_lora_rank=20,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            n_shared_experts=1,
            rope_parameters=YARN,
        ),
    ),
    # no q_lora_rank, the neox rotation, no renormalisation, two dense layers first
    "v3-plain": (
        "DeepseekV3Config",
        dict(
            q_lora_rank=None,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=2,
            norm_topk_prob=False,
            rope_interleave=False,
            routed_scaling_factor=1.0,
            n_shared_experts=2,
        ),
    ),
    # no q_lora_rank, softmax group-limited greedy routing, biases, YaRN
    "v2-group": (
        "DeepseekV2Config",
        dict(
            q_lora_rank=None,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            n_shared_experts=2,
            routed_scaling_factor=1.5,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters=YARN,
        ),
    ),
    # q_lora_rank, plain greedy softmax routing
    "v2-greedy": (
        "DeepseekV2Config",
        dict(q_lora_rank=20, topk_method="greedy", first_k_dense_replace=1, n_shared_experts=1),
    ),
}

# The query scale 1 + beta * ln(1 + floor(p / 16)) grows from position 16 on: a 45-token prefill and 32 decoded
# tokens cross 16, 32 and 48. partial_rotary_factor as Mistral4Config derives it: rope / (nope + rope) = 8 / 20.
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.5,
    "partial_rotary_factor": 0.4,
}
MISTRAL4 = dict(
    SMALL,
    q_lora_rank=20,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    n_shared_experts=1,
    routed_scaling_factor=1.5,
    rope_parameters=ROPE,
)


def make_hf_mistral4(**overrides):
    """transformers' Mistral4ForCausalLM at ``MISTRAL4`` (with ``overrides``), random weights (``randomize``)."""
    from transformers.models.mistral4 import Mistral4Config, Mistral4ForCausalLM

    cfg = Mistral4Config(**{**MISTRAL4, **overrides})
    model = Mistral4ForCausalLM(cfg).to(torch.float32)
    randomize(model)
    return model.eval()


def randomize(module: nn.Module) -> None:
    """Every weight matters: matrices N(0, 0.1), norms 1 + N(0, 0.1), biases (the router's correction bias
    too) N(0, 0.1); transformers initialises the router and the correction bias to zero."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias") or p.dim() > 1:
                p.copy_(0.1 * torch.randn_like(p))


def make_hf_deepseek(variant: str, **overrides):
    cls_name, extra = VARIANTS[variant]
    cfg = getattr(transformers, cls_name)(**{**SMALL, **extra, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model)
    return model.eval()


def paged_logits(
    model, ids: torch.Tensor, blocks=(5, 2, 7, 0), block_size: int = 16
) -> torch.Tensor:
    """One prefill forward of ``ids`` [n] in the given cache blocks -> [n, vocab] logits."""
    n = ids.shape[0]
    meta = build_paged_metadata([list(blocks)], [0], [n], block_size, "cpu")
    with forward_context(meta):
        return model.compute_logits(model(ids, torch.arange(n)).hidden_states)


class ReferenceMTP(nn.Module):
    """DeepSeek-V3's MTP layer assembled from transformers' DeepSeek-V3 pieces, with vLLM deepseek_mtp.py's
    semantics (DeepSeekMultiTokenPredictorLayer, SharedHead): the block is DeepseekV3DecoderLayer at layer
    index num_hidden_layers."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3DecoderLayer,
            DeepseekV3RMSNorm,
        )

        h, eps = config.hidden_size, config.rms_norm_eps
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.enorm, self.hnorm = DeepseekV3RMSNorm(h, eps), DeepseekV3RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = DeepseekV3DecoderLayer(config, config.num_hidden_layers)
        self.shared_head = nn.Module()
        self.shared_head.norm = DeepseekV3RMSNorm(h, eps)
        self.shared_head.head = nn.Linear(h, config.vocab_size, bias=False)

    def checkpoint(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors as DeepSeek stores them: block parameters beside the MTP ones, experts one by one."""
        out = {}
        for name, t in self.state_dict().items():
            name = name.removeprefix("block.")
            if name.endswith(
                "mlp.experts.gate_up_proj"
            ):  # [experts, 2 * inter, hidden]: gate rows, then up
                for e, weight in enumerate(t):
                    gate, up = weight.chunk(2, dim=0)
                    out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = gate
                    out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = up
            elif name.endswith("mlp.experts.down_proj"):
                for e, down in enumerate(t):
                    out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = down
            else:
                out[prefix + name] = t
        return {k: v.contiguous() for k, v in out.items()}

    def forward(self, hf, ids: torch.Tensor) -> torch.Tensor:
        """ids [L] -> [L - 1, vocab] logits: row t reads token t + 1 and the target's post-norm state at t."""
        n = ids.shape[0] - 1
        positions = torch.arange(n)
        hidden = hf.model(ids[None]).last_hidden_state[
            0, :n
        ]  # post-norm, as vLLM's DeepseekV2Model
        embeds = self.embed_tokens(ids[1:])
        embeds[positions == 0] = 0  # "masking inputs at position 0"
        h = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))[None]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = self.block(
            h,
            attention_mask=causal,
            position_ids=positions[None],
            position_embeddings=hf.model.rotary_emb(h, positions[None]),
        )[0]
        return self.shared_head.head(self.shared_head.norm(out))


SPEC_PROMPTS = [[1, 5, 2, 7, 3], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2], list(range(13)) * 2]


def save_v3_with_mtp(path):
    """A DeepSeek-V3 checkpoint with one MTP layer in DeepSeek's layout in ``path`` (small vocabulary, so random
    drafts are accepted now and then); -> (transformers model, reference MTP layer, directory)."""
    hf = make_hf_deepseek("v3-yarn", vocab_size=13, num_mtp_layers=1)
    path = save_hf_model(hf, path)
    ref = ReferenceMTP(hf.config)
    randomize(ref)
    ref.eval()
    tensors = load_file(path / "model.safetensors")
    save_file(
        {**tensors, **ref.checkpoint(f"model.layers.{SMALL['num_hidden_layers']}.")},
        path / "model.safetensors",
        metadata={"format": "pt"},
    )
    assert json.loads((path / "config.json").read_text())["num_nextn_predict_layers"] == 1
    return hf, ref, path


def write_kimi_k25(text_dir, out):
    """A DeepSeek-V3 checkpoint rewritten as Kimi-K2.5 / K2.6 publish theirs: config.json's
    KimiK25ForConditionalGeneration with the text model's config as text_config (model_type kimi_k2) beside a
    vision_config, the text model's tensors under ``language_model.`` (the source patterns of transformers'
    conversion_mapping for kimi_k25), and a vision tower and projector beside them."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.loads((text_dir / "config.json").read_text())
    text.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {"model_type": "kimi_k25_vision", "hidden_size": 16, "patch_size": 4},
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(config))
    tensors = {
        f"language_model.{n}": t for n, t in load_file(text_dir / "model.safetensors").items()
    }
    tensors["vision_tower.patch_embed.proj.weight"] = torch.randn(16, 3, 4, 4)
    tensors["mm_projector.proj.0.weight"] = torch.randn(16, 64)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out
