"""The FP8 KV cache end to end (EngineConfig.kv_cache_dtype "fp8", CPU, fp32 models): greedy tokens of a
small Llama and a small DeepSeek (MLA) through the Triton kernels (interpreter) equal those of the torch
backend on the same FP8 cache; the match rate against the full-precision cache is printed (a sane floor
only: FP8 rounds every cached value); speculation (a tree drafter that commits KV rows, n-gram) is
lossless against plain decoding on the same FP8 cache; hybrid state stays in the model's dtype; the pool
takes a quarter of the bytes per block (fp32 -> fp8); checkpoint scales load under vLLM's and SGLang's
names and a missing one warns."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.deepseek_models import make_hf_deepseek
from helpers.hf_models import save_hf_model
from helpers.hybrid_models import make_hybrid, save_hybrid
from helpers.oracle_proposer import OracleProposer
from outpace import LLM, SamplingParams
from outpace.attention.kv_quant import FP8_KV_DTYPE
from outpace.cache.kv_cache import kv_cache_bytes
from outpace.cache.kv_scales import load_kv_scales
from outpace.config import EngineConfig, SpeculativeConfig
from outpace.models.loader import load_model
from outpace.registry import PROPOSERS
from outpace.validation import ConfigError

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"
# The Triton backend on the engine's CPU tensors runs in the interpreter, which a GPU machine does not switch on
# (conftest.py): those comparisons are CPU-only (tests/gpu/test_fp8_kv_cache_gpu.py has the device's).
interpreter_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tensors through Triton's interpreter"
)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, vocab, (4 + 7 * i,), generator=g).tolist() for i in range(n)]


def greedy(model_dir, ps, params=GREEDY, scales=False, **kwargs) -> list[list[int]]:
    """The greedy tokens of ``ps``; ``scales``: the target's cache layers get k and v scales other than
    1.0 first, as a checkpoint's would give them."""
    llm = LLM(str(model_dir), block_size=4, num_kv_blocks=64, **kwargs)
    if scales:
        set_scales(llm)
    return [o.token_ids for o in llm.generate(ps, params)]


def set_scales(llm: LLM) -> None:
    for name, buffer in llm.engine.model.model.named_buffers():
        if name.endswith(("k_scale", "v_scale")):
            buffer.fill_(0.25 if name.endswith("k_scale") else 0.5)


def match_rate(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two runs agree, up to each pair's first difference (after it, the
    contexts differ)."""
    agreed = 0
    for x, y in zip(a, b):
        agreed += next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), len(x))
    return agreed / sum(len(x) for x in a)


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    return save_hf_deepseek(tmp_path_factory.mktemp("deepseek_fp8kv"))


def save_hf_deepseek(path):
    return save_hf_model(make_hf_deepseek("v3-yarn"), path)


@interpreter_only
@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_triton_matches_torch_on_fp8_cache(family, llama_dir, deepseek_dir):
    """With unit scales and with others (as a checkpoint's), the Triton kernels' tokens are the torch
    backend's on the FP8 cache."""
    model_dir = llama_dir if family == "llama" else deepseek_dir
    ps, params = prompts(2, 200), GREEDY.replace(max_tokens=8)
    runs = {
        (backend, scales): greedy(
            model_dir, ps, params, scales, kv_cache_dtype="fp8", attention_backend=backend
        )
        for backend in ("torch", "triton")
        for scales in (False, True)
    }
    full = greedy(model_dir, ps, params, attention_backend="torch")
    rate = match_rate(runs["torch", False], full)
    print(f"\n{family}: FP8 cache vs float32 cache, greedy match rate {rate:.3f}")
    assert runs["triton", False] == runs["torch", False]
    assert runs["triton", True] == runs["torch", True]
    assert rate >= 0.3, "an FP8 cache that far from the full-precision one is broken, not rounded"


def test_fp8_cache_is_float8_and_a_quarter_of_fp32(llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="outpace.engine"):
        fp8 = LLM(str(llama_dir), block_size=4, num_kv_blocks=16, kv_cache_dtype="fp8_e4m3").engine
    assert "KV cache dtype: float8_e4m3fn" in caplog.text
    full = LLM(str(llama_dir), block_size=4, num_kv_blocks=16).engine
    assert all(t.dtype == FP8_KV_DTYPE for layer in fp8.runner.kv_caches for t in layer)
    assert kv_cache_bytes(full.pool) == 4 * kv_cache_bytes(fp8.pool)


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig("oracle", None, num_steps=3, topk=2, num_draft_tokens=6),
        SpeculativeConfig("ngram", num_steps=3),
    ],
    ids=["oracle-tree", "ngram"],
)
def test_speculation_lossless_on_fp8_cache(llama_dir, spec, monkeypatch):
    ps = prompts(3, 200)
    ps[1] = ps[1] * 3  # repeats: the n-gram drafter finds matches
    params = GREEDY.replace(max_tokens=16)
    plain = greedy(llama_dir, ps, params, kv_cache_dtype="fp8")
    monkeypatch.setattr(OracleProposer, "references", {tuple(p): o for p, o in zip(ps, plain)})
    monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    llm = LLM(
        str(llama_dir), block_size=4, num_kv_blocks=64, kv_cache_dtype="fp8", speculative=spec
    )
    outs = llm.generate(ps, params)
    assert [o.token_ids for o in outs] == plain
    if spec.method == "oracle":  # its drafts are accepted in part: tree commits moved fp8 rows
        assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0


def test_gemma4_assistant_lossless_over_fp8_target_cache(tmp_path):
    """The Gemma 4 assistant reads the target's FP8 rows (dequantized with the target layer's scales) and
    writes them back as the same bytes: the target's tokens stay plain decoding's on the FP8 cache
    (KV-sharing layers and sliding windows included)."""
    from helpers.gemma_sampling import GEMMA4_PROMPT, make_gemma4_assistant, make_tiny_gemma

    target_dir = make_tiny_gemma("gemma4", tmp_path / "target")[1]
    assistant_dir = save_hf_model(make_gemma4_assistant(), tmp_path / "assistant")
    ps = [GEMMA4_PROMPT, GEMMA4_PROMPT[4:11]]
    spec = SpeculativeConfig("gemma4_assistant", str(assistant_dir), num_steps=3)
    runs = []
    for speculative in (SpeculativeConfig(), spec):
        llm = LLM(
            str(target_dir),
            block_size=4,
            num_kv_blocks=64,
            kv_cache_dtype="fp8",
            speculative=speculative,
        )
        set_scales(llm)
        runs.append([o.token_ids for o in llm.generate(ps, GREEDY)])
    assert runs[1] == runs[0]


@interpreter_only
def test_hybrid_state_keeps_model_dtype(tmp_path):
    model_dir = save_hybrid(make_hybrid("qwen3_next"), tmp_path / "qwen3_next")
    ps = prompts(2, 131)
    llm = LLM(str(model_dir), block_size=4, num_kv_blocks=64, kv_cache_dtype="fp8")
    states = llm.engine.runner.states
    assert states.has_state and all(t.dtype != FP8_KV_DTYPE for t in states._states)
    assert all(t.dtype == FP8_KV_DTYPE for layer in llm.engine.runner.kv_caches for t in layer)
    tokens = [o.token_ids for o in llm.generate(ps, GREEDY)]
    assert tokens == greedy(model_dir, ps, kv_cache_dtype="fp8", attention_backend="triton")


def test_unknown_kv_cache_dtype_refused(llama_dir):
    with pytest.raises(ConfigError, match="kv_cache_dtype='fp8_e5m2'"):
        EngineConfig(model=str(llama_dir), kv_cache_dtype="fp8_e5m2")


def test_checkpoint_scales_load_by_their_published_names(llama_dir, deepseek_dir, tmp_path, caplog):
    """ModelOpt's k_proj.k_scale / v_proj.v_scale (layer 0), compressed-tensors' self_attn.k_scale /
    v_scale (layer 1); MLA's kv_a_proj_with_mqa.k_scale; a layer without any warns and keeps 1.0."""
    llama = load_model(llama_dir, torch.float32)
    scales = {
        "model.layers.0.self_attn.k_proj.k_scale": torch.tensor([0.25]),
        "model.layers.0.self_attn.v_proj.v_scale": torch.tensor(0.5),
        "model.layers.1.self_attn.k_scale": torch.tensor(2.0),
        "model.layers.1.self_attn.v_scale": torch.tensor(4.0),
    }
    save_file(scales, str(tmp_path / "model.safetensors"))
    assert load_kv_scales(llama, tmp_path) == 4
    attn = [layer.self_attn.attn for layer in llama.model.layers]
    assert [(float(a.k_scale), float(a.v_scale)) for a in attn] == [(0.25, 0.5), (2.0, 4.0), (1, 1)]

    deepseek = load_model(deepseek_dir, torch.float32)
    save_file(
        {"model.layers.1.self_attn.kv_a_proj_with_mqa.k_scale": torch.tensor(0.125)},
        str(tmp_path / "model.safetensors"),
    )
    with caplog.at_level(logging.WARNING, logger="outpace.cache"):
        assert load_kv_scales(deepseek, tmp_path) == 1
    assert [float(layer.self_attn.k_scale) for layer in deepseek.model.layers] == [1.0, 0.125, 1.0]
    assert "model.layers.0.self_attn.k_scale" in caplog.text and "1.0" in caplog.text


def add_kv_scales(checkpoint, k_name: str, v_name: str) -> int:
    """Layer i's k and v scales, 0.1 (i + 1) and 0.2 (i + 1), written under ``model.layers.{i}.self_attn.`` +
    ``k_name`` / ``v_name`` into the checkpoint's one file -> its layer count."""
    tensors = load_file(str(checkpoint / "model.safetensors"))
    layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    for i in range(layers):
        tensors[f"model.layers.{i}.self_attn.{k_name}"] = torch.tensor(0.1 * (i + 1))
        tensors[f"model.layers.{i}.self_attn.{v_name}"] = torch.tensor(0.2 * (i + 1))
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    return layers


def test_modelopt_checkpoint_scales_reach_the_engine(llama_dir, tmp_path):
    """A ModelOpt FP8 checkpoint (hf_quant_config.json, kv_cache_quant_algo FP8) with per-layer
    k_proj.k_scale / v_proj.v_scale: the engine's FP8 cache takes them; with the cache in the model's
    dtype the same checkpoint loads and the scales are unused."""
    from helpers.quantized_checkpoints import is_projection, modelopt_config, write_quantized

    config = modelopt_config()
    config["quantization"]["kv_cache_quant_algo"] = "FP8"
    checkpoint, _ = write_quantized(llama_dir, tmp_path, "fp8_tensor", is_projection, config)
    layers = add_kv_scales(checkpoint, "k_proj.k_scale", "v_proj.v_scale")
    ps = prompts(2, 200)
    llm = LLM(str(checkpoint), block_size=4, num_kv_blocks=64, kv_cache_dtype="fp8")
    assert float(llm.engine.model.model.layers[0].self_attn.attn.k_scale) != 1.0
    attn = [layer.self_attn.attn for layer in llm.engine.model.model.layers]
    assert [round(float(a.k_scale), 6) for a in attn] == [
        round(0.1 * (i + 1), 6) for i in range(layers)
    ]
    assert [round(float(a.v_scale), 6) for a in attn] == [
        round(0.2 * (i + 1), 6) for i in range(layers)
    ]
    fp8 = [o.token_ids for o in llm.generate(ps, GREEDY)]
    rate = match_rate(fp8, greedy(checkpoint, ps))
    print(
        f"\nModelOpt FP8 Llama with its KV scales: FP8 cache vs float32 cache, match rate {rate:.3f}"
    )
    assert rate >= 0.3


def test_compressed_tensors_fp8_kv_cache_scheme_and_its_scales(llama_dir, tmp_path):
    """llm-compressor's FP8 checkpoint with an FP8 KV-cache scheme (``kv_cache_scheme``: 8-bit float per tensor,
    static) and its self_attn.k_scale / v_scale: the scheme is read (not refused), the engine's FP8 cache takes
    the scales, and a dynamic KV scheme is refused by name."""
    from helpers.quantized_checkpoints import float_quantized_config, is_projection, write_quantized
    from outpace.layers.quant.scheme import parse_quantization_config
    from outpace.validation import ConfigError

    config = float_quantized_config("channel")
    config["kv_cache_scheme"] = {
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False,
        "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
        "observer_kwargs": {},
    }  # fmt: skip
    assert parse_quantization_config(config, "config.json").kv_cache_quant_algo == "FP8"
    checkpoint, _ = write_quantized(llama_dir, tmp_path, "fp8_channel", is_projection, config)
    layers = add_kv_scales(checkpoint, "k_scale", "v_scale")
    llm = LLM(str(checkpoint), block_size=4, num_kv_blocks=64, kv_cache_dtype="fp8")
    attn = [layer.self_attn.attn for layer in llm.engine.model.model.layers]
    assert [round(float(a.k_scale), 6) for a in attn] == [
        round(0.1 * (i + 1), 6) for i in range(layers)
    ]
    assert len(greedy(checkpoint, prompts(1, 200))[0]) > 0  # the model's dtype cache: scales unused
    config["kv_cache_scheme"]["dynamic"] = True
    with pytest.raises(ConfigError, match="kv_cache_scheme.dynamic"):
        parse_quantization_config(config, "config.json")
