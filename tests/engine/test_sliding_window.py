"""Sliding-window models against transformers (fp32, random weights, CPU): Mistral (every layer
slides), Qwen2 (the layers from max_window_layers on) and Qwen3 (the layers layer_types names), with
windows of 6-8 rows under prompts plus generations of 24 and more. Greedy generation through the
engine equals transformers' greedy generate, with whole and chunked prefill, on both attention
backends; speculative decoding (n-gram chains, a standalone draft, oracle trees) verifies across the
window edge and stays lossless. Logit parity over a long prompt is tests/models/test_parity.py's, which
runs these variants too."""

import pytest
import torch

from helpers.hf_models import make_hf_model, transformers_greedy
from helpers.oracle_proposer import OracleProposer
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.registry import PROPOSERS

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"
# The Triton backend's kernels: interpreted on the CPU, compiled (float32) where there is a GPU.
TRITON = dict(
    attention_backend="triton",
    device="cuda" if torch.cuda.is_available() else "cpu",
    dtype="float32",
)
WINDOWED = ["mistral-window", "qwen2-window", "qwen3-window"]
# Repeats, so that n-gram lookup finds drafts.
PROMPT = [3, 17, 99, 150, 8, 42, 7, 3, 17, 99, 150, 8, 61, 5]


def generate(path, n, **engine):
    out = LLM(str(path), block_size=4, num_kv_blocks=64, **engine).generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    )[0]
    return out.token_ids


@pytest.mark.parametrize("variant", WINDOWED)
def test_the_window_changes_transformers_output(variant, hf_checkpoints):
    """The window matters in these checkpoints: transformers without it (same weights) predicts otherwise."""
    hf, _ = hf_checkpoints(variant)
    no_window = {
        "mistral-window": {"sliding_window": None},
        "qwen2-window": {"use_sliding_window": False},
        "qwen3-window": {"use_sliding_window": False, "layer_types": None},
    }
    full = make_hf_model(variant, **no_window[variant])
    ids = torch.tensor([PROMPT * 3])
    with torch.no_grad():
        windowed, unwindowed = hf(ids).logits, full(ids).logits
    assert ((windowed - unwindowed).norm() / windowed.norm()).item() > 1e-2


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("variant", WINDOWED)
def test_greedy_matches_transformers_torch_backend(variant, chunked, hf_checkpoints):
    hf, path = hf_checkpoints(variant)
    engine = {"max_num_batched_tokens": 5} if chunked else {}
    assert generate(path, 24, attention_backend="torch", **engine) == transformers_greedy(
        hf, PROMPT, 24
    )


@pytest.mark.parametrize("variant", ["mistral-window", "qwen2-window"])
def test_greedy_matches_transformers_triton_backend(variant, hf_checkpoints):
    """The Triton kernels, with chunked prefill: 14 prompt rows in chunks of 6, then decode."""
    hf, path = hf_checkpoints(variant)
    expected = transformers_greedy(hf, PROMPT, 10)
    assert generate(path, 10, max_num_batched_tokens=6, **TRITON) == expected


SPECS = {
    "ngram": lambda path: SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    "draft": lambda path: SpeculativeConfig("draft", str(path), num_steps=3),
    # 7 tree rows: within the 8-row window (the metadata refuses a wider tree mask)
    "tree": lambda path: SpeculativeConfig("oracle", None, num_steps=3, topk=2, num_draft_tokens=7),
}


@pytest.mark.parametrize("method", list(SPECS))
@pytest.mark.parametrize("variant", ["mistral-window", "qwen2-window"])
def test_speculation_across_the_window_is_lossless(variant, method, hf_checkpoints, monkeypatch):
    """Every verify's rows sit past the window (the prompt alone is longer than it), with some chunked
    prefill: greedy output equals transformers', and the drafts were accepted (the verify ran)."""
    hf, path = hf_checkpoints(variant)
    expected = transformers_greedy(hf, PROMPT, 24)
    monkeypatch.setattr(OracleProposer, "references", {tuple(PROMPT): expected})
    monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=10,
        speculative=SPECS[method](path),
    )
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    assert out.token_ids == expected
    assert out.spec_metrics.num_accepted_drafts > 0


@pytest.mark.parametrize("method", ["draft", "tree"])
def test_speculation_triton_backend(method, hf_checkpoints, monkeypatch):
    """Chain and tree verify through the Triton kernels (interpreted on the CPU; compiled, the verify
    captured in CUDA graphs, on a GPU)."""
    hf, path = hf_checkpoints("mistral-window")
    expected = transformers_greedy(hf, PROMPT, 10)
    monkeypatch.setattr(OracleProposer, "references", {tuple(PROMPT): expected})
    monkeypatch.setattr(OracleProposer, "corruption", 0.3)
    llm = LLM(str(path), block_size=4, num_kv_blocks=64, speculative=SPECS[method](path), **TRITON)
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    assert out.token_ids == expected
    assert out.spec_metrics.num_accepted_drafts > 0
