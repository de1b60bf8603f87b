"""Mistral Small 4's text model (models/deepseek.py ``Mistral4ForCausalLM``) against transformers'
Mistral4ForCausalLM on random weights (fp32, CPU): DeepSeek-V3's MLA and MoE layers with a softmax router limited
to groups by their two best scores, stacked experts as transformers saves them, YaRN over part of each head and the
query scaled by position past ``original_max_position_embeddings``. Prefill logits in both attention forms, greedy
tokens batched and chunked, lossless speculation, and its config refusals by name."""

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from helpers.config_walk import COMMON_IRRELEVANT, built, walk_fields
from helpers.deepseek_models import MISTRAL4, ROPE, SMALL, make_hf_mistral4, paged_logits
from helpers.hf_models import save_hf_model
from helpers.quantized_checkpoints import per_tensor_fp8_config, write_mistral4_fp8
from helpers.spec_models import make_eagle3_draft
from outpace import LLM, SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.model_config import ModelConfig
from outpace.models.loader import load_model
from outpace.validation import ConfigError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(transformers model, directory of its saved checkpoint)."""
    hf = make_hf_mistral4()
    return hf, save_hf_model(hf, tmp_path_factory.mktemp("mistral4"))


def seeded_ids(num_tokens: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL["vocab_size"], (num_tokens,), generator=generator)


def prefill_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """An outpace model's logits over one paged prefill of ids (a fresh cache)."""
    with torch.no_grad():
        bind_kv_cache(model, BlockPool(8, 16), torch.float32, "cpu")
        return paged_logits(model, ids)


def prefill_error(model, hf, num_tokens: int, seed: int) -> float:
    """The relative error of ``model``'s logits (one paged prefill of seeded random ids) against ``hf``'s."""
    ids = seeded_ids(num_tokens, seed)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    return rel_error(prefill_logits(model, ids), ref)


def twin_error(model, twin, num_tokens: int, seed: int) -> float:
    """The relative error of ``model``'s prefill logits against another outpace model's (its dequantized twin)."""
    ids = seeded_ids(num_tokens, seed)
    return rel_error(prefill_logits(model, ids), prefill_logits(twin, ids))


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_the_checkpoint_stacks_its_experts(checkpoint):
    """transformers writes Mistral 4's routed experts stacked (no conversion mapping for mistral4), as the
    published checkpoint stores them: what this file's other tests load."""
    _, path = checkpoint
    names = load_file(path / "model.safetensors")
    assert names["model.layers.1.mlp.experts.gate_up_proj"].shape == (8, 2 * 24, 48)
    assert names["model.layers.1.mlp.experts.down_proj"].shape == (8, 48, 24)
    assert not any(".experts.0." in n for n in names)


@pytest.mark.parametrize("expand_from", [1, 10**9], ids=["expanded", "absorbed"])
def test_prefill_logits_match_transformers(checkpoint, expand_from):
    hf, path = checkpoint
    model = load_model(path, torch.float32)
    for module in model.modules():
        if hasattr(module, "expand_min_query_len"):
            module.expand_min_query_len = expand_from
    assert prefill_error(model, hf, 45, seed=1) < 1e-4


def test_the_query_scale_matters_here(checkpoint):
    """Without the query scale transformers' own logits move past position 16 (so the tests above check it):
    beta 0 gives the model without it. Before position 16 the two agree to rounding, not bit for bit: the scale
    (1 there) takes transformers another path, whose sums round differently on some CPUs (a 2-core machine: 5e-7
    at positions 14 and 15)."""
    hf, _ = checkpoint
    plain = make_hf_mistral4(rope_parameters={**ROPE, "llama_4_scaling_beta": 0.0})
    ids = seeded_ids(45, seed=1)
    with torch.no_grad():
        scaled, unscaled = hf(ids[None]).logits[0], plain(ids[None]).logits[0]
    assert rel_error(unscaled[:16], scaled[:16]) < 1e-5
    assert rel_error(unscaled[16:], scaled[16:]) > 0.01


PROMPTS = [[3, 17, 99, 150, 8, 42, 7], list(range(100, 119)), [(i * 37) % 203 for i in range(33)]]


def hf_greedy(hf, prompts, tokens: int) -> list[list[int]]:
    with torch.no_grad():
        return [
            hf.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.int64),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            for p in prompts
        ]


def test_greedy_tokens_match_transformers_batched_and_chunked(checkpoint):
    hf, path = checkpoint
    refs = hf_greedy(hf, PROMPTS, 32)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for chunk in (2048, 16):
        outs = LLM(
            str(path), block_size=4, num_kv_blocks=128, max_num_batched_tokens=chunk
        ).generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == refs, f"chunks of {chunk}"


def test_speculation_over_mistral4_is_lossless(checkpoint, tmp_path):
    """n-gram drafts and an EAGLE3 draft's tree verified by the Mistral 4 target: its greedy tokens alone."""
    _, path = checkpoint
    prompts = [[3, 17, 99, 150, 8, 42, 7, 3, 17, 99], [5, 6, 7, 5, 6, 7, 5]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in LLM(str(path), block_size=4).generate(prompts, params)]
    draft = make_eagle3_draft(path, tmp_path / "eagle3")
    for spec in (
        SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
        SpeculativeConfig("eagle3", str(draft), num_steps=3, topk=2, num_draft_tokens=6),
    ):
        outs = LLM(str(path), block_size=4, speculative=spec).generate(prompts, params)
        assert [o.token_ids for o in outs] == plain, spec.method


def config(checkpoint, **changes) -> dict:
    _, path = checkpoint
    return {**json.loads((path / "config.json").read_text()), **changes}


@pytest.mark.parametrize(
    "change,field",
    [
        ({"rope_parameters": {**ROPE, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
        ({"n_group": 3}, "n_group"),
        ({"topk_group": 5}, "topk_group"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_bad_fields_are_refused_by_name(checkpoint, change, field):
    from outpace.models.deepseek import DeepseekConfig

    with pytest.raises(ConfigError, match=field):
        DeepseekConfig.from_model_config(ModelConfig.from_dict(config(checkpoint, **change)))


def test_a_config_without_rope_parameters_takes_mistral4s_defaults(checkpoint):
    """Mistral4Config fills in YaRN (factor 128 over 8192 positions) and the query scale (beta 0.1 over 8192)
    where config.json gives no rope_parameters: the same here."""
    cfg = config(checkpoint)
    del cfg["rope_parameters"]
    ours = ModelConfig.from_dict(cfg)
    theirs = transformers.models.mistral4.Mistral4Config(
        **{k: v for k, v in cfg.items() if k != "architectures"}
    ).rope_parameters
    assert ours.rope_theta == theirs["rope_theta"]
    assert ours.rope_scaling["factor"] == theirs["factor"]
    assert ours.rope_scaling["original_max_position_embeddings"] == 8192
    assert ours.query_scaling == (theirs["llama_4_scaling_beta"], 8192)


def test_the_published_multimodal_layout_serves_its_mistral4_text_model(checkpoint, tmp_path):
    """Mistral Small 4 ships as a Mistral3ForConditionalGeneration whose text_config is mistral4: saved by
    transformers with the same text weights (under ``language_model.``, beside a Pixtral tower and projector),
    it serves the Mistral 4 text model: the same prefill logits as transformers' text model."""
    hf, _ = checkpoint
    vision = dict(
        model_type="pixtral",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=8,
        image_size=32,
        patch_size=8,
    )
    cfg = transformers.Mistral3Config(
        text_config=hf.config.to_dict(), vision_config=vision, tie_word_embeddings=False
    )
    multimodal = transformers.Mistral3ForConditionalGeneration(cfg).eval()
    multimodal.model.language_model.load_state_dict(hf.model.state_dict())
    multimodal.lm_head.load_state_dict(hf.lm_head.state_dict())
    path = save_hf_model(multimodal, tmp_path / "mistral3")
    assert json.loads((path / "config.json").read_text())["text_config"]["model_type"] == "mistral4"
    model = load_model(path, torch.float32)
    assert model.deepseek_config.version == 4
    assert prefill_error(model, hf, 40, seed=2) < 1e-4


# Every field of transformers' Mistral4Config: implemented (another value changes the model built), irrelevant, or
# refused by name (above). The walk's base drops partial_rotary_factor, which Mistral4Config derives from the head
# dimensions (each dimension's change would otherwise be refused as a mismatch, as above).
IRRELEVANT = (
    COMMON_IRRELEVANT
    | {
        "pretraining_tp",
        "output_router_logits",  # the router logits' return (training's auxiliary loss)
        "head_dim",
        "qk_head_dim",  # derived: Mistral4Config.__post_init__ sets them from qk_nope_head_dim + qk_rope_head_dim
    }
)
IMPLEMENTED = {
    "vocab_size": (100, {}),
    "hidden_size": (64, {}),
    "intermediate_size": (96, {}),
    "moe_intermediate_size": (32, {}),
    "num_hidden_layers": (4, {}),
    "n_shared_experts": (2, {}),
    "n_routed_experts": (16, {}),
    "routed_scaling_factor": (2.0, {}),
    "kv_lora_rank": (40, {}),
    "q_lora_rank": (None, {}),
    "qk_rope_head_dim": (12, {}),
    "qk_nope_head_dim": (16, {}),
    "v_head_dim": (16, {}),
    "n_group": (2, {}),
    "topk_group": (3, {}),
    "num_experts_per_tok": (2, {}),
    "first_k_dense_replace": (2, {}),
    "norm_topk_prob": (False, {}),
    "hidden_act": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (1e-5, {}),
    "eos_token_id": (7, {}),
    "tie_word_embeddings": (True, {}),
    "rope_parameters": (lambda cfg: {**cfg["rope_parameters"], "llama_4_scaling_beta": 0.2}, {}),
    "rope_interleave": (False, {}),
    "attention_bias": (True, {}),
    "dtype": ("bfloat16", {}),
}


def walk_base() -> dict:
    from transformers.models.mistral4 import Mistral4Config

    cfg = Mistral4Config(**MISTRAL4).to_dict()
    cfg["rope_parameters"] = {
        k: v for k, v in cfg["rope_parameters"].items() if k != "partial_rotary_factor"
    }
    return {**cfg, "architectures": ["Mistral4ForCausalLM"]}


def test_every_field_is_implemented_irrelevant_or_refused():
    base = walk_base()
    heads = {k: base.pop(k) for k in ("num_attention_heads", "num_key_value_heads")}
    walk_fields(
        "Mistral4Config", base, IMPLEMENTED, IRRELEVANT, lambda cfg, f: {**heads, **cfg, **f}
    )
    # MLA's heads: one count (num_key_value_heads, which transformers repeats, must equal it)
    assert built({**base, **heads}) != built(
        {**base, "num_attention_heads": 8, "num_key_value_heads": 8}
    )
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        built({**base, **heads, "num_key_value_heads": 2})
    # DeepSeek's fields that Mistral4Config lacks, which its modules never read: no other model either
    for field, value in (("moe_layer_freq", 2), ("scoring_func", "sigmoid"), ("mlp_bias", True)):
        assert built({**base, **heads, field: value}) == built({**base, **heads}), field


@pytest.mark.parametrize(
    "block,scales,error",
    [
        (True, True, r"gate_up_proj_scale_inv.* in block FP8 .*only per-tensor FP8"),
        (False, False, r"experts\.(gate_up|down)_proj.* is stored in torch\.float8"),
    ],
    ids=["block-fp8-stacks", "stacks-without-scales"],
)
def test_fused_fp8_stacks_outpace_does_not_read_are_refused_by_name(
    checkpoint, tmp_path, block, scales, error
):
    """Fused FP8 expert stacks in block FP8, or without their scales, are not read: loading names the tensor
    and its file (rather than reading float8 values as bf16)."""
    import shutil

    from outpace.checkpoint import CheckpointError

    _, path = checkpoint
    quantized = tmp_path / "fp8"
    shutil.copytree(path, quantized)
    tensors = load_file(path / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        tensors[name] = tensors[name].to(torch.float8_e4m3fn)
        if scales:
            tensors[name + "_scale_inv"] = torch.ones(tensors[name].shape[0], 1, 1)
    save_file(tensors, quantized / "model.safetensors", metadata={"format": "pt"})
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    fp8 = {**fp8, "weight_block_size": [128, 128]} if block else per_tensor_fp8_config("dynamic")
    (quantized / "config.json").write_text(json.dumps(config(checkpoint, quantization_config=fp8)))
    with pytest.raises(CheckpointError, match=error):
        load_model(quantized, torch.float32)


@pytest.fixture(scope="module")
def fp8_checkpoint(checkpoint, tmp_path_factory):
    return write_mistral4_fp8(checkpoint[1], tmp_path_factory.mktemp("mistral4-fp8"))


def test_the_fp8_release_layout_equals_its_dequantized_twin(fp8_checkpoint):
    """Per-tensor FP8 projections and fused FP8 expert stacks, held quantized (the stacks float8, their scales
    one an expert): the dequantized twin's prefill logits and greedy tokens."""
    quantized, reference = fp8_checkpoint
    model = load_model(quantized, torch.float32)
    experts = model.model.layers[1].mlp.experts
    assert experts.gate_up_proj.dtype == torch.float8_e4m3fn
    assert experts.gate_up_proj_scale_inv.shape == (8, 1, 1)
    assert twin_error(model, load_model(reference, torch.float32), 40, seed=3) < 1e-5
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = [
        [o.token_ids for o in LLM(str(d), block_size=4).generate(PROMPTS, params)]
        for d in (quantized, reference)
    ]
    assert outs[0] == outs[1]


def as_multimodal(text_dir: Path, out: Path) -> Path:
    """A Mistral 4 checkpoint rewritten as Mistral Small 4 ships: config.json's Mistral3ForConditionalGeneration
    with the text config as its text_config (model_type mistral4) and the quantization_config at the top, the
    text tensors under ``language_model.`` beside a Pixtral tower (one of its tensors float8) and projector."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.loads((text_dir / "config.json").read_text())
    quantization = text.pop("quantization_config", None)
    config = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "text_config": {**text, "model_type": "mistral4"},
        "vision_config": {"model_type": "pixtral", "hidden_size": 16},
        "quantization_config": quantization,
    }
    (out / "config.json").write_text(json.dumps(config))
    tensors = {
        f"language_model.{n}": t for n, t in load_file(text_dir / "model.safetensors").items()
    }
    tensors["vision_tower.patch_conv.weight"] = torch.randn(16, 3, 4, 4).to(torch.float8_e4m3fn)
    tensors["multi_modal_projector.linear_1.weight"] = torch.randn(16, 16)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_the_fp8_multimodal_release_layout_serves_its_text_model(fp8_checkpoint, tmp_path):
    """The FP8 layout inside the published multimodal one (its float8 tower skipped): the dequantized twin's
    logits."""
    quantized, reference = fp8_checkpoint
    model = load_model(as_multimodal(quantized, tmp_path / "mm"), torch.float32)
    assert model.model.layers[1].mlp.experts.gate_up_proj.dtype == torch.float8_e4m3fn
    assert twin_error(model, load_model(reference, torch.float32), 30, seed=4) < 1e-5
