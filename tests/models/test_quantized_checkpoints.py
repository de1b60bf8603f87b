"""Quantized checkpoints in the published layouts (tests/helpers/quantized_checkpoints.py) load with their
weights quantized in memory and compute what the same model computes with the dequantized weights: logits
equal to float32 rounding, greedy tokens equal, and against transformers running the dequantized weights;
speculation over a quantized target is lossless."""

import json

import pytest
import torch
import transformers

from helpers.deepseek_models import paged_logits, save_v3_with_mtp
from helpers.quantized_checkpoints import (
    block_fp8_config,
    int4_config,
    is_projection,
    write_quantized,
)
from outpace import LLM, SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.checkpoint import CheckpointError
from outpace.config import SpeculativeConfig
from outpace.layers.quant.linear import QuantizedLinear
from outpace.models.loader import load_model
from outpace.validation import ConfigError

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 2, 11, 5]]


@pytest.fixture(scope="module")
def deepseek_mtp(tmp_path_factory):
    """A DeepSeek-V3 checkpoint with one MTP layer -> its source directory."""
    return save_v3_with_mtp(tmp_path_factory.mktemp("deepseek"))[2]


def prefill_logits(path, n: int = 30, vocab: int = 13) -> torch.Tensor:
    model = load_model(path, torch.float32)
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        bind_kv_cache(model, BlockPool(8, 16), torch.float32, "cpu")
        return paged_logits(model, ids), model, ids


def quantized_modules(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)]


def matches_its_dequantized_twin(q_dir, ref_dir, vocab: int = 13):
    """The quantized checkpoint against its dequantized twin: prefill logits equal to float32 rounding, greedy
    tokens equal -> the names of the quantized model's quantized modules."""
    logits, model, _ = prefill_logits(q_dir, vocab=vocab)
    ref_logits, _, _ = prefill_logits(ref_dir, vocab=vocab)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    a = LLM(str(q_dir), block_size=4).generate(PROMPTS, GREEDY)
    b = LLM(str(ref_dir), block_size=4).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    return quantized_modules(model)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_deepseek_block_fp8_equals_its_dequantized_weights(deepseek_mtp, tmp_path, scale_dtype):
    q_dir, ref_dir = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16)), scale_dtype
    )
    logits, model, ids = prefill_logits(q_dir)
    ref_logits, _, _ = prefill_logits(ref_dir)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    names = quantized_modules(model)
    # the decoder's and the MTP layer's projections, experts included; the MTP's eh_proj and head, the
    # routers, embeddings and the head stay as stored
    assert any("experts.0.down_proj" in n for n in names) and any(
        n.startswith("mtp_layers") for n in names
    )
    assert not any("eh_proj" in n or "gate." in n + "." and "gate_proj" not in n for n in names)
    assert model.lm_head.weight.dtype == torch.float32
    w = model.get_submodule(names[0]).weight
    assert w.dtype == torch.float8_e4m3fn
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
        expected = hf(ids[None]).logits[0]
    assert ((logits - expected).norm() / expected.norm()).item() < 1e-4


def test_deepseek_int4_experts_equal_their_dequantized_weights(deepseek_mtp, tmp_path):
    """Kimi-K2-Thinking's layout: routed experts INT4, attention, shared experts, dense MLPs and head bf16."""
    ignore = [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
    ]
    q_dir, ref_dir = write_quantized(
        deepseek_mtp, tmp_path, "int4_group", lambda n: ".experts." in n, int4_config(8, ignore)
    )
    names = matches_its_dequantized_twin(q_dir, ref_dir)
    assert all(".experts." in n for n in names) and names


def test_kimi_k25_int4_experts_under_its_multimodal_layout(tmp_path):
    """Kimi-K2.5 / K2.6's layout: the DeepSeek-V3 text model under language_model. with INT4 routed experts, its
    attention, shared experts, dense MLPs and head bf16 by the ignore list, a vision tower beside it."""
    from helpers.deepseek_models import make_hf_deepseek, write_kimi_k25
    from helpers.hf_models import save_hf_model

    src = write_kimi_k25(
        save_hf_model(make_hf_deepseek("v3-yarn"), tmp_path / "v3"), tmp_path / "k25"
    )
    ignore = [
        "language_model.lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
        "re:vision_tower.*",
        "re:mm_projector.*",
    ]
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "int4_group", lambda n: ".experts." in n, int4_config(8, ignore)
    )
    names = matches_its_dequantized_twin(q_dir, ref_dir)
    assert all(".experts." in n for n in names) and names


def test_speculation_over_a_quantized_target_is_lossless(deepseek_mtp, tmp_path):
    """The target's own FP8 MTP layer, and n-gram, against the quantized target alone."""
    q_dir, _ = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    plain = [o.token_ids for o in LLM(str(q_dir), block_size=4).generate(PROMPTS, GREEDY)]
    for spec in (
        SpeculativeConfig("mtp", num_steps=2),
        SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    ):
        outs = LLM(str(q_dir), block_size=4, speculative=spec).generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == plain, spec.method


def test_a_wrong_scale_convention_fails(deepseek_mtp, tmp_path):
    """Dividing by weight_scale_inv instead of multiplying changes the logits: the equality above can fail."""
    q_dir, ref_dir = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(q_dir / "model.safetensors"))
    save_file(
        {k: 1 / v if k.endswith("weight_scale_inv") else v for k, v in tensors.items()},
        str(q_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    assert not torch.allclose(prefill_logits(q_dir)[0], prefill_logits(ref_dir)[0], atol=1e-3)


def _set_quantization(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"].update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "change,named",
    [
        ({"quant_method": "gptq"}, "gptq"),
        ({"fmt": "e5m2"}, "fmt"),
        ({"activation_scheme": "static"}, "activation_scheme"),
        ({"scale_fmt": "e8m0fnu"}, "scale_fmt"),
        ({"weight_block_size": [128]}, "weight_block_size"),
        ({"weight_block_size": [True, 128]}, "weight_block_size"),  # (a bool is an int to Python)
        ({"kernel": "deepgemm"}, "kernel"),
        ({"weight_block_size": None, "scale_fmt": "ue8m0"}, "scale_fmt"),  # (per tensor)
        ({"weight_block_size": None, "activation_scheme": "per-token"}, "activation_scheme"),
    ],
)
def test_unknown_quantization_options_are_refused_by_name(deepseek_mtp, tmp_path, change, named):
    q_dir, _ = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    _set_quantization(q_dir, **change)
    with pytest.raises(ConfigError, match=named) as err:
        load_model(q_dir, torch.float32)
    assert "config.json" in str(err.value)


def test_a_quantized_tensor_without_its_scale_is_refused(deepseek_mtp, tmp_path):
    q_dir, _ = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(q_dir / "model.safetensors"))
    victim = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    del tensors[victim]
    save_file(tensors, str(q_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="model.layers.1.self_attn.o_proj.weight") as err:
        load_model(q_dir, torch.float32)
    assert "model.safetensors" in str(err.value)


def test_a_module_the_ignore_list_keeps_unquantized_is_refused_when_quantized(
    deepseek_mtp, tmp_path
):
    config = block_fp8_config((16, 16), modules_to_not_convert=["model.layers.1.self_attn.o_proj"])
    q_dir, _ = write_quantized(deepseek_mtp, tmp_path, "fp8_block", is_projection, config)
    named = "tensor 'model.layers.1.self_attn.o_proj.weight_scale_inv' quantizes module"
    with pytest.raises(ConfigError, match=f"{named}.*modules_to_not_convert"):
        load_model(q_dir, torch.float32)


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    from helpers.hybrid_models import make_hybrid, save_hybrid

    def write(variant):
        return save_hybrid(make_hybrid(variant), tmp_path_factory.mktemp(variant))

    return write


def hybrid_logits(path, n: int = 20) -> torch.Tensor:
    ids = torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(2)).tolist()
    out = LLM(str(path), block_size=4).generate([ids], GREEDY.replace(logprobs=5))
    return out[0]


def test_qwen3_next_block_fp8_with_bf16_scales(hybrids, tmp_path):
    """Qwen3-Next-FP8's layout: bf16 scales, the linear attention's in_proj_ba (and A_log, conv1d, dt_bias,
    norms, routers) unquantized and listed in modules_to_not_convert."""
    src = hybrids("qwen3_next")
    config = block_fp8_config((16, 16), modules_to_not_convert=["lm_head", "in_proj_ba"])
    q_dir, ref_dir = write_quantized(
        src,
        tmp_path,
        "fp8_block",
        lambda n: is_projection(n) and "in_proj_ba" not in n,
        config,
        torch.bfloat16,
    )
    model = load_model(q_dir, torch.float32)
    names = quantized_modules(model)
    assert any("in_proj_qkvz" in n for n in names) and not any("in_proj_ba" in n for n in names)
    a, b = hybrid_logits(q_dir), hybrid_logits(ref_dir)
    assert a.token_ids == b.token_ids
    ids = torch.tensor([[5, 9, 2, 33, 1, 7]])
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
        expected = hf(ids).logits[0, -1].argmax().item()
    got = LLM(str(q_dir), block_size=4).generate([ids[0].tolist()], GREEDY.replace(max_tokens=1))
    assert got[0].token_ids == [expected]


def test_qwen35_moe_multimodal_block_fp8(hybrids, tmp_path):
    """Qwen3.5-35B-A3B-FP8's layout: the multimodal checkpoint, its text model's projections block FP8 (each
    expert's, the shared expert's, the attention's, gated DeltaNet's in_proj_qkv / in_proj_z / out_proj), the
    vision tower, in_proj_a / in_proj_b, the routers and the head unquantized; greedy tokens equal the
    dequantized twin's."""
    src = hybrids("qwen3_5_moe-multimodal")
    not_converted = ["lm_head", "model.visual", "in_proj_a", "in_proj_b"]
    config = block_fp8_config((16, 16), modules_to_not_convert=not_converted)
    q_dir, ref_dir = write_quantized(
        src,
        tmp_path,
        "fp8_block",
        lambda n: (
            is_projection(n) and "visual" not in n and "in_proj_a" not in n and "in_proj_b" not in n
        ),
        config,
        torch.bfloat16,
    )
    names = quantized_modules(load_model(q_dir, torch.float32))
    assert any(".experts." in n for n in names) and any("shared_expert." in n for n in names)
    assert any("in_proj_qkv" in n for n in names) and not any("in_proj_a" in n for n in names)
    assert hybrid_logits(q_dir).token_ids == hybrid_logits(ref_dir).token_ids


def test_nemotron_h_modelopt_fp8(hybrids, tmp_path):
    """ModelOpt's layout: per-tensor weight_scale and input_scale, hf_quant_config.json, KV scales skipped."""
    from safetensors.torch import load_file, save_file

    from helpers.quantized_checkpoints import modelopt_config

    src = hybrids("nemotron_h")
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "fp8_tensor", is_projection, modelopt_config(["lm_head"])
    )
    tensors = load_file(str(q_dir / "model.safetensors"))
    k_proj = next(n for n in tensors if n.endswith("k_proj.weight"))
    tensors[k_proj.replace(".weight", ".k_scale")] = torch.tensor(
        1.0
    )  # the FP8 KV cache's: skipped
    save_file(tensors, str(q_dir / "model.safetensors"), metadata={"format": "pt"})
    model = load_model(q_dir, torch.float32)
    assert len(quantized_modules(model)) > 5
    assert hybrid_logits(q_dir).token_ids == hybrid_logits(ref_dir).token_ids


def test_modelopt_fp8_in_config_json_as_its_export_writes_it(hf_checkpoints, tmp_path):
    """ModelOpt's config.json form (quant_method modelopt, quant_algo FP8, the config_groups that spell it out,
    ignore, kv_cache_scheme): per-tensor weight_scale and input_scale; logits and greedy tokens equal the
    dequantized twin's."""
    from helpers.quantized_checkpoints import modelopt_config_json

    _, src = hf_checkpoints("llama")
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "fp8_tensor", is_projection, modelopt_config_json(["lm_head"])
    )
    assert not (q_dir / "hf_quant_config.json").exists()
    names = matches_its_dequantized_twin(q_dir, ref_dir, vocab=203)
    assert len(names) == 7 * 3  # q, k, v, o, gate, up, down of every layer
    layer = load_model(q_dir, torch.float32).get_submodule(names[0])
    assert layer.format.scheme.producer == "ModelOpt"
    assert layer.stored_weight.dtype == torch.float8_e4m3fn


def test_qwen3_moe_block_fp8_experts_and_attention(tmp_path):
    """Qwen3-30B-A3B-FP8's layout: every projection block FP8 (each expert's and the attention's, bf16 scales),
    the router and the head unquantized; logits and greedy tokens equal the dequantized twin's."""
    from helpers.hf_models import save_hf_model
    from helpers.qwen3_moe_models import make_qwen3_moe

    src = save_hf_model(make_qwen3_moe("renormalised"), tmp_path / "bf16")
    config = block_fp8_config((16, 16), modules_to_not_convert=["lm_head"])
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "fp8_block", is_projection, config, torch.bfloat16
    )
    names = matches_its_dequantized_twin(q_dir, ref_dir, vocab=97)
    assert any(".experts." in n for n in names) and any("self_attn" in n for n in names)
    assert not any(n.endswith("mlp.gate") for n in names)


def test_gemma4_unified_int4_every_language_model_projection(tmp_path):
    """google/gemma-4-12B-it-qat-w4a16-ct's layout (compressed-tensors pack-quantized, symmetric groups): every
    Linear of the language model INT4 (q/k/v/o, the MLPs), the head and the vision and audio embedders kept in
    bf16 by the ignore list; multiples of 8 columns (hidden 64, head_dim 16, full layers' 32)."""
    from helpers.gemma_models import (
        AUDIO4_UNIFIED,
        GEMMA4_UNIFIED_TEXT,
        VISION4_UNIFIED,
        random_gemma,
    )

    text = dict(
        GEMMA4_UNIFIED_TEXT,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        head_dim=16,
        global_head_dim=32,
    )
    src = tmp_path / "bf16"
    random_gemma(
        transformers.Gemma4UnifiedConfig(
            text_config=text, vision_config=VISION4_UNIFIED, audio_config=AUDIO4_UNIFIED
        )
    ).save_pretrained(src)
    ignore = ["lm_head", "re:.*embed_vision.*", "re:.*vision_embedder.*", "re:.*embed_audio.*"]
    q_dir, ref_dir = write_quantized(
        src,
        tmp_path,
        "int4_group",
        lambda n: ".language_model." in n and is_projection(n),
        int4_config(16, ignore),
    )
    names = matches_its_dequantized_twin(q_dir, ref_dir, vocab=211)
    assert {n.rpartition(".")[2] for n in names} >= {"o_proj", "down_proj"}, names
    assert sum("self_attn" in n for n in names) >= 2 * text["num_hidden_layers"], names


def test_the_start_up_line_names_the_format_and_bytes(deepseek_mtp, tmp_path):
    from outpace.engine.memory import weights_summary

    q_dir, ref_dir = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    q, ref = load_model(q_dir, torch.float32), load_model(ref_dir, torch.float32)
    line = weights_summary(q, q.config.quantization)
    assert "block FP8 e4m3 (16x16 blocks)" in line and "GiB" in line
    stored = sum(p.numel() * p.element_size() for p in q.parameters())
    assert stored < 0.6 * sum(p.numel() * p.element_size() for p in ref.parameters())


def test_a_dummy_load_builds_quantized_layers_with_random_values(deepseek_mtp, tmp_path):
    """``load_format="dummy"`` on a config with a quantization_config (bench/families.py ``--quantized``):
    the projections quantized (fp8 values and scales random, the head and routers as built), the model's
    parameters at their stored size, and a forward finite."""
    from outpace.bench.families import QUANTIZATION_CONFIGS

    cfg = json.loads((deepseek_mtp / "config.json").read_text())
    cfg["quantization_config"] = {**QUANTIZATION_CONFIGS["fp8"], "weight_block_size": [16, 16]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(tmp_path, torch.float32, load_format="dummy")
    names = quantized_modules(model)
    assert any("experts.0.down_proj" in n for n in names) and any("q_a_proj" in n for n in names)
    assert not any("lm_head" in n for n in names)
    layer = model.get_submodule(names[0])
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight.float().std() > 0.5
    assert torch.all(layer.weight_scale_inv == 0.02)
    stored = sum(p.numel() * p.element_size() for p in model.parameters())
    plain = load_model(deepseek_mtp, torch.float32, load_format="dummy")
    assert stored < 0.6 * sum(p.numel() * p.element_size() for p in plain.parameters())
    out = LLM(str(tmp_path), block_size=4, load_format="dummy").generate(PROMPTS[:1], GREEDY)
    assert len(out[0].token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize(
    "method, config",
    [("fp8_block", block_fp8_config((16, 16))), ("int4_group", int4_config(8, ["lm_head"]))],
)
def test_an_eagle3_draft_over_a_quantized_target_is_lossless(tmp_path, method, config):
    """A float32 EAGLE3 draft (chain and tree) reading a block-FP8 or INT4 Llama target's hidden states: the
    target alone's greedy tokens."""
    from helpers.spec_models import make_eagle3_draft, random_llama

    source = random_llama(tmp_path / "llama", vocab_size=13, seed=3)
    q_dir, _ = write_quantized(source, tmp_path, method, is_projection, config)
    draft = make_eagle3_draft(q_dir, tmp_path / "eagle3", aux_ids=[0, 1, 1], seed=2)
    plain = [o.token_ids for o in LLM(str(q_dir), block_size=4).generate(PROMPTS, GREEDY)]
    assert quantized_modules(load_model(q_dir, torch.float32))
    for spec in (
        SpeculativeConfig("eagle3", str(draft), num_steps=3),
        SpeculativeConfig("eagle3", str(draft), num_steps=3, topk=2, num_draft_tokens=5),
    ):
        outs = LLM(str(q_dir), block_size=4, speculative=spec).generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == plain, spec
        assert sum(o.spec_metrics.num_verifies for o in outs) > 0


def test_a_dummy_load_refusing_a_format_names_the_file_that_set_it(tmp_path):
    """Per-tensor FP8 for Step-3.5's stacked experts, which only block FP8 quantizes: a dummy load's refusal
    names the file the format came from (ModelOpt's hf_quant_config.json here, not config.json)."""
    from helpers.quantized_checkpoints import modelopt_config
    from helpers.step3p5_checkpoints import CONFIG, write_checkpoint

    source, _ = write_checkpoint(tmp_path, CONFIG)
    (source / "hf_quant_config.json").write_text(json.dumps(modelopt_config(["lm_head"])))
    with pytest.raises(
        ConfigError, match=r"hf_quant_config.json: per-tensor FP8 .* stacked experts"
    ):
        load_model(source, torch.float32, load_format="dummy")


def test_step3p5_block_fp8_stacked_experts(tmp_path):
    """Step-3.5-Flash-FP8's layout: the routed experts' stacks ``moe.{gate,up,down}_proj.weight`` fp8 [E, out,
    in] with ``weight_scale_inv`` [E, ceil(out/bn), ceil(in/bk)], the attention, dense and shared-expert
    projections per module; the tokens and logprobs of the dequantized twin, and the stacks stay fp8."""
    from helpers.step3p5_checkpoints import CONFIG, write_checkpoint
    from outpace.layers.quant.experts import QuantizedStackedWeight

    (tmp_path / "source").mkdir()
    source, _ = write_checkpoint(tmp_path / "source", CONFIG)
    q_dir, ref_dir = write_quantized(
        source, tmp_path, "fp8_block", is_projection, block_fp8_config((4, 8))
    )
    model = load_model(q_dir, torch.float32)
    stacks = [m for m in model.modules() if isinstance(m, QuantizedStackedWeight)]
    assert stacks and all(m.weight.dtype == torch.float8_e4m3fn for m in stacks)
    got, expected = hybrid_logits(q_dir), hybrid_logits(ref_dir)
    assert got.token_ids == expected.token_ids
    for a, b in zip(got.logprobs, expected.logprobs):
        assert a.keys() == b.keys()
        torch.testing.assert_close(
            torch.tensor([v.logprob for v in a.values()]),
            torch.tensor([v.logprob for v in b.values()]),
            rtol=1e-4,
            atol=1e-4,
        )


def test_a_quantized_kv_b_proj_is_dequantized_once_at_load(deepseek_mtp, tmp_path, monkeypatch):
    """The absorbed decode reads W_UK and W_UV dequantized after loading (``pack_rows``), not per step."""
    from outpace.layers.mla import MultiHeadLatentAttention

    q_dir, _ = write_quantized(
        deepseek_mtp, tmp_path, "fp8_block", is_projection, block_fp8_config((16, 16))
    )
    model = load_model(q_dir, torch.float32)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadLatentAttention)]
    assert layers and all(isinstance(m.kv_b_proj, QuantizedLinear) for m in layers)
    for layer in layers:
        torch.testing.assert_close(layer.kv_b_dequantized, layer.kv_b_proj.dequantized())
        monkeypatch.setattr(
            layer.kv_b_proj, "dequantized", lambda: pytest.fail("per-step dequantize")
        )
        w_uk, w_uv = layer.up_weights()
        s = layer.shape
        assert w_uk.shape == (s.num_heads, s.qk_nope_head_dim, s.kv_lora_rank)
        assert w_uv.shape == (s.num_heads, s.v_head_dim, s.kv_lora_rank)


@pytest.mark.parametrize("mtp", ["fp8", "excluded"])
def test_nemotron_h_modelopt_fp8_with_its_mtp_stack(mtp, tmp_path):
    """Nemotron 3 Super's FP8 layout (ModelOpt) with its MTP stack: the stack's projections stored FP8 like the
    decoder's, eh_proj included (vLLM nemotron_h_mtp.py builds eh_proj with the checkpoint's quant_config), or
    kept high precision by an ``exclude_modules`` wildcard on ``mtp.*``. The MTP over the quantized target is
    lossless, and drafts what the dequantized twin's MTP drafts (its acceptance is the twin's, draft for
    draft)."""
    from helpers.hybrid_drafting import MTP_LAYERS, PROMPTS, save_with_mtp
    from helpers.quantized_checkpoints import modelopt_config

    _, src = save_with_mtp("nemotron_h", tmp_path / "bf16", MTP_LAYERS["nemotron_h"])
    in_mtp = lambda n: n.startswith("mtp.")  # noqa: E731
    quantize = (
        (lambda n: is_projection(n) or in_mtp(n) and n.endswith("eh_proj.weight"))
        if mtp == "fp8"
        else (lambda n: is_projection(n) and not in_mtp(n))
    )
    exclude = ["lm_head"] + (["mtp.*"] if mtp == "excluded" else [])
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "fp8_tensor", quantize, modelopt_config(exclude)
    )
    names = quantized_modules(load_model(q_dir, torch.float32))
    in_stack = [n for n in names if n.startswith("mtp")]
    if mtp == "fp8":
        assert any("eh_proj" in n for n in in_stack) and any("experts" in n for n in in_stack)
    else:
        assert not in_stack and names
    params = GREEDY.replace(max_tokens=20)
    spec = SpeculativeConfig("mtp", num_steps=2)
    plain = [o.token_ids for o in LLM(str(q_dir), block_size=4).generate(PROMPTS, params)]
    runs = {
        d: LLM(str(d), block_size=4, speculative=spec).generate(PROMPTS, params)
        for d in (q_dir, ref_dir)
    }
    assert [o.token_ids for o in runs[q_dir]] == plain
    accepted = {d: [o.spec_metrics.num_accepted_drafts for o in outs] for d, outs in runs.items()}
    assert accepted[q_dir] == accepted[ref_dir] and sum(accepted[q_dir]) > 0


@pytest.mark.parametrize(
    "names", [("weight_scale_inv", "activation_scale"), ("weight_scale", "input_scale")]
)
def test_per_tensor_fp8_as_mistral_and_autofp8_publish_it(names, tmp_path):
    """``quant_method: fp8`` without blocks, one scale a weight that multiplies it: Mistral's FP8 releases
    (Ministral 3, a multimodal checkpoint with a static activation scheme, its tower and head unconverted),
    read under transformers' FP8Linear names, and AutoFP8's under vLLM's names. Logits and greedy tokens equal
    the dequantized twin's; the weights stay fp8 in memory; speculation over it is lossless."""
    from helpers.hf_models import make_hf_model, save_hf_model
    from helpers.quantized_checkpoints import per_tensor_fp8_config

    src = save_hf_model(make_hf_model("ministral3-multimodal"), tmp_path / "bf16")
    not_converted = ["lm_head", "vision_tower", "multi_modal_projector"]
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "fp8_tensor", lambda n: is_projection(n) and "language_model" in n,
        per_tensor_fp8_config("static", not_converted), tensor_names=names,
    )  # fmt: skip
    names_loaded = matches_its_dequantized_twin(q_dir, ref_dir, vocab=203)
    assert len(names_loaded) == 7 * 3  # q, k, v, o, gate, up, down of every layer
    model = load_model(q_dir, torch.float32)
    layer = model.get_submodule(names_loaded[0])
    assert layer.stored_weight.dtype == torch.float8_e4m3fn
    assert getattr(layer, names[1]).item() == pytest.approx(0.02)  # the activation scale, loaded
    plain = [o.token_ids for o in LLM(str(q_dir), block_size=4).generate(PROMPTS, GREEDY)]
    spec = SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
    outs = LLM(str(q_dir), block_size=4, speculative=spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain


# compressed-tensors' float strategies -> write_quantized's layout
FLOAT_LAYOUTS = {"tensor": "fp8_tensor", "channel": "fp8_channel", "block": "fp8_block"}


@pytest.mark.parametrize("strategy", list(FLOAT_LAYOUTS))
def test_compressed_tensors_fp8_as_llm_compressor_writes_it(strategy, hf_checkpoints, tmp_path):
    """llm-compressor's FP8 checkpoints (compressed-tensors ``float-quantized``: RedHatAI's ``-FP8-dynamic`` per
    channel, its FP8 per tensor and in blocks): ``weight_scale`` (bf16 here) beside every projection, activations
    dynamic per token, lm_head ignored. Logits and greedy tokens equal the dequantized twin's."""
    from helpers.quantized_checkpoints import float_quantized_config

    _, src = hf_checkpoints("llama")
    config = float_quantized_config(strategy, (16, 16) if strategy == "block" else None)
    q_dir, ref_dir = write_quantized(
        src, tmp_path, FLOAT_LAYOUTS[strategy], is_projection, config, torch.bfloat16,
        tensor_names=("weight_scale", "input_scale"),
    )  # fmt: skip
    names = matches_its_dequantized_twin(q_dir, ref_dir, vocab=203)
    assert len(names) == 7 * 3  # q, k, v, o, gate, up, down of every layer
    layer = load_model(q_dir, torch.float32).get_submodule(names[0])
    assert layer.format.scheme.method == FLOAT_LAYOUTS[strategy]
    assert layer.stored_weight.dtype == torch.float8_e4m3fn


def test_compressed_tensors_fp8_block_with_grouped_activations(hf_checkpoints, tmp_path):
    """llm-compressor's FP8_BLOCK scheme as it writes it: block weights, input activations dynamic in groups
    (``strategy: group``, one group a block's columns). Logits and greedy tokens equal the dequantized twin's."""
    from helpers.quantized_checkpoints import float_quantized_config

    _, src = hf_checkpoints("llama")
    config = float_quantized_config("block", (16, 16))
    config["config_groups"]["group_0"]["input_activations"].update(strategy="group", group_size=16)
    q_dir, ref_dir = write_quantized(
        src, tmp_path, "fp8_block", is_projection, config, torch.bfloat16,
        tensor_names=("weight_scale", "input_scale"),
    )  # fmt: skip
    names = matches_its_dequantized_twin(q_dir, ref_dir, vocab=203)
    assert len(names) == 7 * 3  # q, k, v, o, gate, up, down of every layer
    assert load_model(q_dir, torch.float32).get_submodule(names[0]).format.scheme.block == (16, 16)


def test_per_channel_fp8_experts_as_redhat_publishes_qwen3_moe(tmp_path):
    """Qwen3-30B-A3B-FP8-dynamic's layout: every projection, each expert's too, FP8 per output channel, the router
    and head unquantized; logits and greedy tokens equal the dequantized twin's."""
    from helpers.hf_models import save_hf_model
    from helpers.quantized_checkpoints import float_quantized_config
    from helpers.qwen3_moe_models import make_qwen3_moe

    src = save_hf_model(make_qwen3_moe("renormalised"), tmp_path / "bf16")
    config = float_quantized_config("channel", ignore=["lm_head", "re:.*mlp.gate$"])
    q_dir, ref_dir = write_quantized(src, tmp_path, "fp8_channel", is_projection, config)
    names = matches_its_dequantized_twin(q_dir, ref_dir, vocab=97)
    assert any(".experts." in n for n in names) and any("self_attn" in n for n in names)
    # the GPU's grouped kernels take them (as blocks of one row); block FP8 of 16-column blocks they do not, which
    # a captured engine refuses by name
    from outpace.engine.start_up import refuse_experts_off_the_kernels
    from outpace.layers.moe import experts_off_the_kernels

    assert experts_off_the_kernels(load_model(q_dir, torch.float32)) == []
    block = block_fp8_config((16, 16), modules_to_not_convert=["lm_head"])
    q_dir, _ = write_quantized(src, tmp_path / "block", "fp8_block", is_projection, block)
    model = load_model(q_dir, torch.float32)
    off = experts_off_the_kernels(model)
    assert len(off) > 1 and all(n.endswith(".mlp.experts") for n in off)
    with pytest.raises(
        ConfigError, match=rf"{off[0]} \(and {len(off) - 1} more\).*--enforce-eager"
    ):
        refuse_experts_off_the_kernels(model)


@pytest.mark.parametrize(
    "change,named",
    [
        (dict(strategy="group", group_size=16), "strategy"),
        (dict(num_bits=4), "num_bits"),
        (dict(type="int"), "type"),
        (dict(actorder="group"), "actorder"),
    ],
)
def test_unknown_float_quantized_options_are_refused_by_name(change, named):
    from helpers.quantized_checkpoints import float_quantized_config
    from outpace.layers.quant.scheme import parse_quantization_config

    config = float_quantized_config("channel")
    config["config_groups"]["group_0"]["weights"].update(change)
    with pytest.raises(ConfigError, match=named):
        parse_quantization_config(config, "config.json")
    config = float_quantized_config("channel")
    config["config_groups"]["group_0"]["input_activations"]["strategy"] = "group"
    with pytest.raises(ConfigError, match="input_activations.strategy"):
        parse_quantization_config(config, "config.json")


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5", "nemotron_h"])
def test_per_channel_fp8_hybrids_as_llm_compressor_writes_them(variant, hybrids, tmp_path):
    """The hybrids in compressed-tensors' per-channel FP8 (RedHatAI's Qwen3-Next-80B-A3B-FP8-dynamic layout): every
    projection, the linear-attention and Mamba in/out projections and the experts included, FP8 a row; routers,
    gates, convolutions, norms and the head as stored. Greedy tokens equal the dequantized twin's."""
    from helpers.quantized_checkpoints import float_quantized_config

    config = float_quantized_config("channel", ignore=["lm_head", "re:.*mlp.gate$"])
    q_dir, ref_dir = write_quantized(
        hybrids(variant), tmp_path, "fp8_channel", is_projection, config
    )
    names = quantized_modules(load_model(q_dir, torch.float32))
    assert any("in_proj" in n for n in names)
    a, b = hybrid_logits(q_dir), hybrid_logits(ref_dir)
    assert a.token_ids == b.token_ids
