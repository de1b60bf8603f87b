"""Qwen3MoeForCausalLM against transformers (fp32, random weights, CPU): mixture layers beside dense ones
(mlp_only_layers, decoder_sparse_step), renormalised and raw top-k weights, a sliding window on every layer;
prefill logits within 1e-4 relative, 32 greedy tokens identical (whole and chunked prefill), speculation
(n-gram, a draft model, an EAGLE3 tree) lossless; every field of transformers' Qwen3MoeConfig implemented, irrelevant or refused by name; Qwen3-VL-MoE's
checkpoint serving its text model."""

import json

import pytest
import torch
import transformers

from helpers.config_walk import COMMON_IRRELEVANT
from helpers.hf_models import (
    checkpoint_cache,
    paged_prefill_error,
    save_hf_model,
    transformers_greedy,
)
from helpers.qwen3_moe_models import (
    BASE,
    VARIANTS,
    VOCAB,
    make_qwen3_moe,
    make_qwen3_vl_moe,
    to_hub_expert_order,
)
from helpers.spec_models import make_eagle3_draft
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.layers.moe import MoE
from outpace.model_config import ModelConfig
from outpace.models.loader import load_model
from outpace.models.qwen3_moe import Qwen3MoeConfig
from outpace.validation import ConfigError

PROMPT = [5, 61, 7, 33, 90, 2, 18, 44, 5, 61, 7, 33, 71, 9]  # 14 tokens, twice the window; repeats


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """variant -> (transformers model, directory of its saved checkpoint)."""
    return checkpoint_cache(tmp_path_factory, make_qwen3_moe)


def generate(path, prompt, n, **engine):
    return LLM(str(path), block_size=4, num_kv_blocks=64, **engine).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    )[0]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant, qwen3_moe):
    """45 tokens in one paged forward over scattered blocks; the mixture on the layers transformers puts it."""
    hf, path = qwen3_moe(variant)
    model = load_model(path, torch.float32)
    expected = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]
    assert [isinstance(layer.mlp, MoE) for layer in model.model.layers] == expected
    rel = paged_prefill_error(hf, path, VOCAB)
    assert rel < 1e-4, f"{variant}: relative error {rel}"


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_transformers(variant, chunked, qwen3_moe):
    hf, path = qwen3_moe(variant)
    engine = {"max_num_batched_tokens": 5} if chunked else {}
    assert generate(path, PROMPT, 32, **engine).token_ids == transformers_greedy(hf, PROMPT, 32)


def speculative_config(method: str, target, tmp_path) -> SpeculativeConfig:
    if method == "ngram":
        return SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
    if method == "draft":  # the target drafting for itself
        return SpeculativeConfig("draft", str(target), num_steps=3)
    draft = make_eagle3_draft(target, tmp_path / "eagle3", aux_ids=[1, 2, 3])
    return SpeculativeConfig("eagle3", str(draft), num_steps=3, topk=2, num_draft_tokens=6)


@pytest.mark.parametrize("method", ["ngram", "draft", "eagle3-tree"])
def test_speculation_is_lossless(method, qwen3_moe, tmp_path):
    """Greedy output with speculation (chunked prefill) equals plain greedy output; an EAGLE3 tree reads the
    stack's captured layer inputs."""
    _, path = qwen3_moe("renormalised")
    expected = generate(path, PROMPT, 24).token_ids
    spec = speculative_config(method, path, tmp_path)
    out = generate(path, PROMPT, 24, max_num_batched_tokens=10, speculative=spec)
    assert out.token_ids == expected
    assert out.spec_metrics.num_draft_tokens > 0


def test_a_qwen3_vl_moe_checkpoint_serves_its_text_model(tmp_path):
    """Qwen3-VL-MoE's checkpoint (the text model under model.language_model, each layer's experts stacked, in
    transformers' order or the hub's, a vision tower beside it): its Qwen3-MoE text model, the router
    renormalising, the interleaved rotary sections as plain RoPE for text; a config that does not renormalise
    is refused."""
    hf = make_qwen3_vl_moe(
        moe_intermediate_size=8
    )  # (gate_up [6, 16, 32]: either order tells itself)
    path = save_hf_model(hf, tmp_path / "vl")
    assert paged_prefill_error(hf, path, VOCAB) < 1e-4
    assert generate(path, PROMPT, 16).token_ids == transformers_greedy(hf, PROMPT, 16)
    assert paged_prefill_error(hf, to_hub_expert_order(path), VOCAB) < 1e-4
    cfg = json.loads((path / "config.json").read_text())
    cfg["text_config"] = {**cfg["text_config"], "norm_topk_prob": False}
    with pytest.raises(ConfigError, match="norm_topk_prob"):
        parsed(cfg)


def config_dict(**changes) -> dict:
    return {
        **transformers.Qwen3MoeConfig(**BASE).to_dict(),
        "architectures": ["Qwen3MoeForCausalLM"],
        **changes,
    }


def parsed(cfg: dict):
    model_cfg = ModelConfig.from_dict(cfg)
    return model_cfg, Qwen3MoeConfig.from_model_config(model_cfg)


def test_bad_mixture_fields_are_refused_by_name():
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        parsed(config_dict(num_experts_per_tok=7))
    with pytest.raises(ConfigError, match="decoder_sparse_step"):
        parsed(config_dict(decoder_sparse_step=0))


def test_the_hubs_expert_count_field():
    """Hub configs name the count num_experts; transformers 5 writes num_local_experts: both read alike."""
    written = config_dict()
    hub = {k: v for k, v in written.items() if k != "num_local_experts"} | {"num_experts": 6}
    assert "num_local_experts" in written and parsed(hub) == parsed(written)


# Qwen3MoeConfig's fields that do not change what inference computes, and why.
IRRELEVANT = COMMON_IRRELEVANT | {
    "output_router_logits",  # what a transformers forward returns
    "router_aux_loss_coef",  # a training loss
}
# field -> (another value, other changes that let the field matter): the parse must then differ
IMPLEMENTED = {
    "vocab_size": (100, {}),
    "hidden_size": (64, {}),
    "intermediate_size": (100, {}),
    "num_hidden_layers": (6, {}),
    "num_attention_heads": (8, {}),
    "num_key_value_heads": (8, {}),
    "hidden_act": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (1e-5, {}),
    "tie_word_embeddings": (True, {}),
    "eos_token_id": (7, {}),
    "dtype": ("bfloat16", {}),
    "rope_parameters": ({"rope_type": "default", "rope_theta": 5e5}, {}),
    "attention_bias": (True, {}),
    "use_sliding_window": (True, {"sliding_window": 16}),
    "sliding_window": (16, {"use_sliding_window": True}),
    "decoder_sparse_step": (2, {}),
    "moe_intermediate_size": (32, {}),
    "num_experts_per_tok": (3, {}),
    "num_local_experts": (8, {}),
    "norm_topk_prob": (True, {}),
    "mlp_only_layers": ([0], {}),
}


def test_every_field_is_implemented_irrelevant_or_refused():
    """Walks transformers' default Qwen3MoeConfig: a field none of the tables knows fails (a transformers
    upgrade adding one must be looked at); "implemented" is checked: another value changes the parse."""
    base = {**transformers.Qwen3MoeConfig().to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}
    unknown = sorted(set(base) - set(IMPLEMENTED) - IRRELEVANT - {"architectures"})
    assert not unknown, f"Qwen3MoeConfig fields nobody decided on: {unknown}"
    for name, (value, context) in IMPLEMENTED.items():
        assert name in base, name
        assert parsed({**base, **context}) != parsed({**base, **context, name: value}), (
            f"{name}={value!r} changes nothing"
        )
    for name in set(base) & IRRELEVANT:
        changed = "changed" if base[name] is None else not base[name]
        assert parsed({**base, name: changed}) == parsed(base), name
