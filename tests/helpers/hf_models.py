"""Random-initialised Hugging Face checkpoints for tests (transformers is the reference here only)."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.vision_towers import tiny_qwen_vision

SMALL = dict(
    vocab_size=203,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=512,
)

# Qwen2-MoE's mixture: 4 experts of which 2, beside a shared expert
QWEN2_MOE = dict(
    tie_word_embeddings=False,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
)

PIXTRAL = dict(  # a tiny Pixtral vision tower (Mistral 3's)
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,
    head_dim=8,
)

# Ministral 3's RoPE (transformers Ministral3Config's defaults) with the query scaling's step shortened from
# 16384 positions to 8 and its beta raised from 0.1, so that the tests' positions cross several steps
MINISTRAL3_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1e6,
    "factor": 16.0,
    "original_max_position_embeddings": 8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.5,
}

# architecture -> (transformers config class, extra config)
VARIANTS = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "llama-tied-odd-headdim": (
        "LlamaConfig",
        dict(
            tie_word_embeddings=True,
            head_dim=12,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=16)),
    # Sliding windows far shorter than the tests' prompts plus generations: every layer (Mistral), the
    # layers from max_window_layers on (Qwen2), the layers layer_types names (Qwen3).
    "mistral-window": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=8)),
    "qwen2-window": (
        "Qwen2Config",
        dict(
            tie_word_embeddings=False,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=1,
        ),
    ),
    "qwen3-window": (
        "Qwen3Config",
        dict(
            tie_word_embeddings=False,
            head_dim=16,
            use_sliding_window=True,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ),
    # Qwen2-MoE: a mixture beside a sigmoid-gated shared expert; a dense layer between (mlp_only_layers), raw top-k
    # weights; then mixtures every other layer, renormalised, windows on the odd layers before max_window_layers
    "qwen2-moe": (
        "Qwen2MoeConfig",
        dict(QWEN2_MOE, mlp_only_layers=[1]),
    ),
    "qwen2-moe-window": (
        "Qwen2MoeConfig",
        dict(
            QWEN2_MOE,
            norm_topk_prob=True,
            decoder_sparse_step=2,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=2,
        ),
    ),
    # Other gate activations, and the biases LlamaConfig can add (q/k/v/o, gate/up/down).
    "llama-gelu-biases": (
        "LlamaConfig",
        dict(hidden_act="gelu", attention_bias=True, mlp_bias=True),
    ),
    "llama-gelu-tanh": ("LlamaConfig", dict(hidden_act="gelu_pytorch_tanh")),
    # Qwen3-VL's dense checkpoint: a Qwen3 text model (interleaved rotary sections) beside its vision tower
    "qwen3-vl-multimodal": (
        "Qwen3VLConfig",
        dict(
            text_config=dict(
                head_dim=16,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "mrope_section": [2, 3, 3],
                    "mrope_interleaved": True,
                },
            ),
            vision_config=tiny_qwen_vision(
                48, num_position_embeddings=16, deepstack_visual_indexes=[0]
            ),
            tie_word_embeddings=False,
        ),
    ),
    # Qwen2.5-VL's checkpoint: a Qwen2 text model (its rotary sections named "mrope", as the hub's configs do)
    # beside its vision tower, in the hub's layout (model.*, lm_head, visual.*)
    "qwen2.5-vl-multimodal": (
        "Qwen2_5_VLConfig",
        dict(
            text_config=dict(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
            vision_config=tiny_qwen_vision(48, fullatt_block_indexes=[0], window_size=8),
            tie_word_embeddings=False,
        ),
    ),
    # Mistral-Small-3.x's multimodal checkpoint: a Mistral text model beside a Pixtral tower (its text model)
    "mistral3-multimodal": (
        "Mistral3Config",
        dict(
            text_config=dict(tie_word_embeddings=False, sliding_window=None, model_type="mistral"),
            vision_config=PIXTRAL,
            tie_word_embeddings=False,
        ),
    ),
    # Mixtral: every MLP a mixture of 4 experts of which 2; then a window far shorter than the tests' sequences
    "mixtral": ("MixtralConfig", dict(tie_word_embeddings=False, num_local_experts=4)),
    "mixtral-window": (
        "MixtralConfig",
        dict(tie_word_embeddings=False, num_local_experts=4, sliding_window=8),
    ),
    # Ministral (transformers' ministral): a short window on every other layer
    "ministral-interleaved": (
        "MinistralConfig",
        dict(
            tie_word_embeddings=False,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            head_dim=8,  # (transformers' MinistralAttention needs it given)
        ),
    ),
    "ministral3": (
        "Ministral3Config",
        dict(tie_word_embeddings=False, rope_parameters=MINISTRAL3_ROPE),
    ),
    # the Ministral 3 releases: a Ministral 3 text model beside a Pixtral tower
    "ministral3-multimodal": (
        "Mistral3Config",
        dict(
            text_config=dict(
                tie_word_embeddings=False, model_type="ministral3", rope_parameters=MINISTRAL3_ROPE
            ),
            vision_config=PIXTRAL,
            tie_word_embeddings=False,
        ),
    ),
}


def make_hf_model(variant: str, **overrides):
    import transformers

    cls_name, extra = VARIANTS[variant]
    torch.manual_seed(0)
    if "text_config" in extra:  # a multimodal checkpoint: SMALL is its text model's
        text = {**SMALL, **extra["text_config"], **overrides}
        cfg = getattr(transformers, cls_name)(**{**extra, "text_config": text})
        model = getattr(transformers, cls_name.replace("Config", "ForConditionalGeneration"))(cfg)
    else:
        cfg = getattr(transformers, cls_name)(**{**SMALL, **extra, **overrides})
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # make every weight matter (HF initialises norms to 1, biases to 0)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def save_hf_model(model, path: Path, max_shard_size: str | None = None) -> Path:
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return path


def paged_prefill_error(hf, path: Path, vocab_size: int, num_tokens: int = 45) -> float:
    """The relative error of outpace's logits for the checkpoint at ``path`` against ``hf``'s (the reference),
    over one prefill of ``num_tokens`` seeded random ids below ``vocab_size``, run in fp32 as one paged forward
    over scattered blocks (5, 2, 7 of a pool of 16-row blocks)."""
    from outpace.attention import build_paged_metadata, forward_context
    from outpace.cache.block_pool import BlockPool
    from outpace.cache.kv_cache import bind_kv_cache
    from outpace.models.loader import load_model

    model = load_model(path, torch.float32)
    ids = torch.randint(0, vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")
        with forward_context(build_paged_metadata([[5, 2, 7]], [0], [num_tokens], 16, "cpu")):
            logits = model.compute_logits(model(ids, torch.arange(num_tokens)).hidden_states)
    return ((logits - ref).norm() / ref.norm()).item()


def transformers_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of transformers' ``hf`` after ``prompt`` (no end of sequence), the reference of the
    families' greedy tests."""
    with torch.no_grad():
        return hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()


def checkpoint_cache(tmp_path_factory, make, save=None):
    """A fixture's value: variant -> (transformers model, directory of its saved checkpoint), each variant built
    by ``make(variant)`` and saved by ``save(model, directory)`` (``save_hf_model`` by default) once."""
    save = save or save_hf_model
    cache = {}

    def get(variant: str):
        if variant not in cache:
            model = make(variant)
            cache[variant] = (model, save(model, tmp_path_factory.mktemp(variant)))
        return cache[variant]

    return get
