"""Gemma 3 and Gemma 4 text models against transformers (fp32, random weights, CPU).

Odd shapes (head_dim 12, 5 heads over 1 KV head, vocab 211), sliding windows of 7 rows under prompts
of 14-45 tokens with chunked prefill across the window edge, both layer kinds' RoPE settings, logit
softcapping; a Gemma3ForConditionalGeneration checkpoint whose vision tower is skipped; Gemma 4's
dense text model with per-layer embeddings, its k = v global layers with wider heads, KV sharing and
the MoE block; Gemma 4's dense unified model (Gemma4UnifiedForConditionalGeneration) whose vision and audio
embedders are skipped. Prefill logits within 1e-4 relative, 32 greedy tokens identical, speculation
lossless."""

import logging

import pytest
import torch
import transformers

from helpers.config_walk import COMMON_IRRELEVANT
from helpers.gemma_models import (
    GEMMA3_TEXT,
    GEMMA4_MOE_SHARED,
    GEMMA4_TEXT,
    GEMMA4_UNIFIED_TEXT,
    PROMPT,
    VARIANTS,
    WINDOW,
    make_gemma,
)
from helpers.hf_models import checkpoint_cache, paged_prefill_error, transformers_greedy
from outpace import LLM, SamplingParams
from outpace.checkpoint import checkpoint_tensor_names
from outpace.config import SpeculativeConfig
from outpace.model_config import ModelConfig
from outpace.models.loader import load_model
from outpace.registry import PROPOSERS
from outpace.validation import ConfigError

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"

# multimodal variant -> the prefixes of its checkpoint's non-text tensors
NON_TEXT = {
    "gemma3-multimodal": ("vision_tower.", "multi_modal_projector."),
    "gemma4-multimodal": ("model.vision_tower.", "model.embed_vision."),
    "gemma4-unified": ("model.vision_embedder.", "model.embed_vision.", "model.embed_audio."),
}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """variant -> (transformers model, directory of its saved checkpoint)."""
    return checkpoint_cache(tmp_path_factory, make_gemma)


def generate(path, prompt, n, **engine):
    out = LLM(str(path), block_size=4, num_kv_blocks=64, **engine).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    )[0]
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant, gemma):
    """45 tokens (over six windows) in one paged forward over scattered blocks."""
    hf, path = gemma(variant)
    rel = paged_prefill_error(hf, path, 211)
    assert rel < 1e-4, f"{variant}: relative error {rel}"


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_transformers(variant, chunked, gemma):
    """32 greedy tokens; chunked: the 14-token prompt in chunks of 5, across the 7-row window's edge."""
    hf, path = gemma(variant)
    engine = {"max_num_batched_tokens": 5} if chunked else {}
    assert generate(path, PROMPT, 32, **engine).token_ids == transformers_greedy(hf, PROMPT, 32)


@pytest.mark.parametrize("variant", list(NON_TEXT))
def test_multimodal_checkpoint_serves_its_text_model(variant, gemma, caplog):
    """The vision tower (and projector) are in the checkpoint; loading skips them with a logged note."""
    _, path = gemma(variant)
    names = checkpoint_tensor_names(path)
    assert all(any(n.startswith(prefix) for n in names) for prefix in NON_TEXT[variant])
    with caplog.at_level(logging.INFO, logger="outpace.models"):
        model = load_model(path, torch.float32)
    assert all(prefix in caplog.text for prefix in NON_TEXT[variant]) and "skipped" in caplog.text
    assert not any(
        part in n
        for n, _ in model.named_parameters()
        for part in ("vision", "audio", "multi_modal")
    )
    cfg = ModelConfig.from_pretrained(path)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (211, 60, 5)
    assert cfg.layer_windows == (
        WINDOW,
        WINDOW,
        None,
        WINDOW,
        None if "gemma4" in variant else WINDOW,
    )


SPECS = {
    "ngram": lambda path: SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    "draft": lambda path: SpeculativeConfig(
        "draft", str(path), num_steps=3
    ),  # the target drafting for itself
    # the true continuation with 30% of the drafts corrupted: verifies that accept part of a chain
    "oracle": lambda path: SpeculativeConfig("oracle", None, num_steps=3),
}


@pytest.mark.parametrize("method", list(SPECS))
@pytest.mark.parametrize("variant", ["gemma3", "gemma4-moe-kv-shared"])
def test_speculation_is_lossless(variant, method, gemma, monkeypatch):
    """Greedy output with speculation equals plain greedy output, with chunked prefill, every verify
    past the window; drafts were verified, and accepted where the drafter is not a lookup that a
    random model's output may never match (n-gram)."""
    _, path = gemma(variant)
    expected = generate(path, PROMPT, 32).token_ids
    if method == "oracle":
        from helpers.oracle_proposer import OracleProposer

        monkeypatch.setattr(OracleProposer, "references", {tuple(PROMPT): expected})
        monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    out = generate(path, PROMPT, 32, max_num_batched_tokens=10, speculative=SPECS[method](path))
    assert out.token_ids == expected
    assert out.spec_metrics.num_draft_tokens > 0
    if method != "ngram":
        assert out.spec_metrics.num_accepted_drafts > 0


def gemma3_dict(**changes) -> dict:
    return {
        **transformers.Gemma3TextConfig(**GEMMA3_TEXT).to_dict(),
        "architectures": ["Gemma3ForCausalLM"],
        **changes,
    }


def refused(cfg: dict, *names: str) -> None:
    from outpace.models.loader import build_model

    with pytest.raises(ConfigError) as err:
        build_model(ModelConfig.from_dict(cfg), torch.float32)
    assert all(n in str(err.value) for n in names), str(err.value)


def test_gemma3_unimplemented_values_are_refused_by_name():
    refused(gemma3_dict(attn_logit_softcapping=50.0), "attn_logit_softcapping", "50.0")
    refused(gemma3_dict(use_bidirectional_attention=True), "use_bidirectional_attention", "True")
    yarn = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}
    refused(
        gemma3_dict(rope_parameters={**GEMMA3_TEXT["rope_parameters"], "full_attention": yarn}),
        "rope_parameters.full_attention.rope_type",
        "'yarn'",
    )
    refused(gemma3_dict(layer_types=["chunked_attention"] * 5), "layer_types", "chunked_attention")


def test_gemma_activation_is_hidden_activation_as_transformers_reads_it():
    """Gemma3TextConfig reads ``hidden_activation`` (default gelu_pytorch_tanh) and ignores ``hidden_act``: a
    config without the first gets transformers' default (it got silu), one whose ``hidden_act`` says otherwise is
    refused by name (it was obeyed: other tokens than transformers', found by fuzzing the loader)."""
    without = {k: v for k, v in gemma3_dict().items() if k != "hidden_activation"}
    assert ModelConfig.from_dict(without).hidden_act == "gelu_pytorch_tanh"
    same = gemma3_dict(hidden_activation="gelu", hidden_act="gelu")
    assert ModelConfig.from_dict(same).hidden_act == "gelu"
    with pytest.raises(ConfigError, match="'hidden_act'.*'silu'"):
        ModelConfig.from_dict(gemma3_dict(hidden_act="silu"))


def test_gemma3_configs_before_transformers_5():
    """Hub configs written before transformers 5: rope_theta, rope_scaling (full layers),
    rope_local_base_freq (sliding layers) and sliding_window_pattern instead of layer_types."""
    from outpace.models.gemma import Gemma3Config

    old = {k: v for k, v in gemma3_dict().items() if k not in ("rope_parameters", "layer_types")}
    cfg = ModelConfig.from_dict(
        {
            **old,
            "rope_theta": 1e5,
            "rope_local_base_freq": 1e4,
            "sliding_window_pattern": 3,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        }
    )
    new = ModelConfig.from_dict(gemma3_dict())
    assert cfg.layer_windows == new.layer_windows == (WINDOW, WINDOW, None, WINDOW, WINDOW)
    assert Gemma3Config.from_model_config(cfg).ropes == Gemma3Config.from_model_config(new).ropes


def gemma4_dict(**changes) -> dict:
    return {
        **transformers.Gemma4TextConfig(**GEMMA4_MOE_SHARED).to_dict(),
        "architectures": ["Gemma4ForCausalLM"],
        **changes,
    }


def test_gemma4_unimplemented_values_are_refused_by_name():
    refused(gemma4_dict(use_bidirectional_attention="all"), "use_bidirectional_attention", "'all'")
    yarn = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}
    refused(
        gemma4_dict(rope_parameters={**GEMMA4_TEXT["rope_parameters"], "full_attention": yarn}),
        "rope_parameters.full_attention.rope_type",
        "'yarn'",
    )
    refused(
        gemma4_dict(per_layer_config={"2": {"head_dim": 16, "intermediate_size": 64}}),
        "per_layer_config.2.intermediate_size",
        "64",
    )
    refused(gemma4_dict(num_kv_shared_layers=4), "num_kv_shared_layers", "4")


def gemma4_unified_dict(**changes) -> dict:
    return {
        **transformers.Gemma4UnifiedTextConfig(**GEMMA4_UNIFIED_TEXT).to_dict(),
        "architectures": ["Gemma4UnifiedForCausalLM"],
        **changes,
    }


def test_gemma4_unified_refuses_what_its_text_model_lacks():
    """transformers' Gemma4UnifiedTextConfig has no per-layer embeddings and no MoE block: a unified config
    that sets either is refused by name, not served as a Gemma 4 that has them."""
    refused(gemma4_unified_dict(hidden_size_per_layer_input=8), "hidden_size_per_layer_input", "8")
    refused(gemma4_unified_dict(**MOE), "enable_moe_block", "True")


@pytest.mark.parametrize(
    ("config", "window"),
    [(gemma4_dict, 512), (gemma4_unified_dict, 1024)],
    ids=["gemma4", "unified"],
)
def test_gemma4_default_sliding_windows(config, window):
    """Without sliding_window, each class's default (Gemma4TextConfig 512, Gemma4UnifiedTextConfig 1024)."""
    cfg = {k: v for k, v in config().items() if k != "sliding_window"}
    assert set(ModelConfig.from_dict(cfg).layer_windows) == {window, None}


def test_gemma4_configs_without_per_layer_config():
    """Configs written before transformers 5.24 give global_head_dim and num_global_key_value_heads."""
    from outpace.models.gemma4 import Gemma4Config

    old = {k: v for k, v in gemma4_dict().items() if k != "per_layer_config"}
    cfg = ModelConfig.from_dict({**old, "global_head_dim": 16, "num_global_key_value_heads": 5})
    assert Gemma4Config.from_model_config(cfg) == Gemma4Config.from_model_config(
        ModelConfig.from_dict(gemma4_dict())
    )


# Fields of transformers' Gemma3TextConfig / Gemma4TextConfig that do not change what inference computes.
# (Gemma3TextConfig reads sliding_window_pattern; _sliding_window_pattern is written, not read back)
IRRELEVANT = COMMON_IRRELEVANT | {"_sliding_window_pattern"}
MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8}
# field -> (another value; other changes that let the field matter): the parsed configs must then differ.
IMPLEMENTED = {
    "vocab_size": (100, {}),
    "hidden_size": (1024, {}),
    "intermediate_size": (100, {}),
    "num_hidden_layers": (4, {"layer_types": None, "per_layer_config": {}}),
    "num_attention_heads": (16, {}),
    "num_key_value_heads": (2, {}),
    "head_dim": (128, {}),
    "hidden_activation": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (1e-5, {}),
    "tie_word_embeddings": (False, {}),
    "eos_token_id": (7, {}),
    "dtype": ("bfloat16", {}),
    "attention_bias": (True, {}),
    "sliding_window": (16, {}),
    "final_logit_softcapping": (30.0, {}),
    "layer_types": (lambda base: ["full_attention"] + base["layer_types"][1:], {}),
    "rope_parameters": (
        lambda base: {
            **base["rope_parameters"],
            "sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
        },
        {},
    ),
    # Gemma 3
    "query_pre_attn_scalar": (128, {}),
    # Gemma 4
    "attention_k_eq_v": (True, {}),
    "per_layer_config": ({"05": {"head_dim": 128}}, {}),
    "hidden_size_per_layer_input": (0, {}),
    "vocab_size_per_layer_input": (100, {}),
    "num_kv_shared_layers": (6, {}),
    "use_double_wide_mlp": (True, {"num_kv_shared_layers": 6}),
    "enable_moe_block": (True, {k: v for k, v in MOE.items() if k != "enable_moe_block"}),
    "num_experts": (8, MOE),
    "top_k_experts": (3, MOE),
    "moe_intermediate_size": (16, MOE),
}
REFUSED = {
    "attn_logit_softcapping": 50.0,
    "use_bidirectional_attention": "all",
}  # field -> a value refused


def parsed(cfg: dict):
    """config.json -> (ModelConfig, the family's own config), as the model class parses it."""
    from outpace.models.gemma import Gemma3Config
    from outpace.models.gemma4 import Gemma4Config

    model_cfg = ModelConfig.from_dict(cfg)
    family = Gemma3Config if model_cfg.architecture.startswith("Gemma3") else Gemma4Config
    return model_cfg, family.from_model_config(model_cfg)


CONFIG_CLASSES = {
    "Gemma3ForCausalLM": transformers.Gemma3TextConfig,
    "Gemma4ForCausalLM": transformers.Gemma4TextConfig,
    "Gemma4UnifiedForCausalLM": transformers.Gemma4UnifiedTextConfig,
}


@pytest.mark.parametrize("arch", list(CONFIG_CLASSES))
def test_every_field_is_implemented_irrelevant_or_refused(arch):
    """Walks the default text config's fields: a field none of the tables knows fails (a transformers
    upgrade adding one must be looked at); "implemented" is checked: another value changes the parse."""
    cls = CONFIG_CLASSES[arch]
    base = {**cls().to_dict(), "architectures": [arch]}
    unknown = sorted(set(base) - set(IMPLEMENTED) - IRRELEVANT - set(REFUSED) - {"architectures"})
    assert not unknown, f"{cls.__name__} fields nobody decided on: {unknown}"
    for name in set(base) & set(IMPLEMENTED):
        value, context = IMPLEMENTED[name]
        value = value(base) if callable(value) else value
        assert parsed({**base, **context}) != parsed({**base, **context, name: value}), (
            f"{name}={value!r} changes nothing"
        )
    for name in set(base) & IRRELEVANT:
        assert parsed(
            {**base, name: "changed" if base[name] is None else not base[name]}
        ) == parsed(base), name
    for name in set(base) & set(REFUSED):
        with pytest.raises(ConfigError, match=name):
            parsed({**base, name: REFUSED[name]})
    multimodal = arch.replace("ForCausalLM", "ForConditionalGeneration")
    assert parsed({**base, "architectures": [multimodal]}) != parsed(base)
