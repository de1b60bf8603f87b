"""Batch-invariant mode on the hybrid targets, on the CPU in float32: a request's token ids and
log-probabilities are bit for bit the same whether it decodes alone or among others, and whether its tokens
are decoded one at a time or verified in MTP's draft chains (issue 43 item 8).

What broke it before (layers/recurrent.py, layers/causal_conv.py, attention/torch_backend.py): the gates'
softplus / sigmoid / exp and the convolution's silu on tensors whose size follows the batch (a CPU kernel's
vector code and its scalar tail round differently), the convolution's einsum, and the CPU attention, whose
products and sums follow the shape of the whole call. Greedy, so every run decodes the same tokens and the
log-probabilities compare the same rows."""

import json
from functools import cache
from pathlib import Path

import pytest

from helpers.hybrid_models import make_hybrid, save_hybrid
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)
# Nemotron-H's Mamba2 mixers, attention and a dense MLP (its MoE router is not in the mode yet)
NEMOTRON_LAYERS = ["linear_attention", "full_attention", "mlp", "linear_attention"]


@cache
def _qwen35_prompts() -> list[str]:
    return json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:3]


def _generate(path: Path, prompts: list, batch: int, spec: SpeculativeConfig) -> tuple[list, list]:
    """Token ids and per-position top-2 log-probabilities of ``prompts``, at most ``batch`` at a time."""
    llm = LLM(
        str(path),
        device="cpu",
        dtype="float32",
        batch_invariant=True,
        max_num_seqs=batch,
        block_size=4,
        num_kv_blocks=64,
        speculative=spec,
    )
    outs = llm.generate(prompts, PARAMS)
    logprobs = [[{t: lp.logprob for t, lp in pos.items()} for pos in o.logprobs] for o in outs]
    return [o.token_ids for o in outs], logprobs


@pytest.fixture(scope="module")
def tinyqwen35_plain_batched():
    return _generate(ZOO / "tinyqwen35", _qwen35_prompts(), 3, SpeculativeConfig())


def test_qwen35_decodes_the_same_bits_alone_and_in_a_batch(tinyqwen35_plain_batched):
    alone = _generate(ZOO / "tinyqwen35", _qwen35_prompts(), 1, SpeculativeConfig())
    assert alone[0] == tinyqwen35_plain_batched[0]
    assert alone[1] == tinyqwen35_plain_batched[1]  # bitwise: the floats compared exactly


def test_qwen35_mtp_gives_plain_decodings_bits(tinyqwen35_plain_batched):
    mtp = _generate(ZOO / "tinyqwen35", _qwen35_prompts(), 3, SpeculativeConfig("mtp", num_steps=2))
    assert mtp[0] == tinyqwen35_plain_batched[0]
    assert mtp[1] == tinyqwen35_plain_batched[1]


def test_nemotron_h_decodes_the_same_bits_alone_and_in_a_batch(tmp_path):
    """A random Nemotron-H of odd widths (6 Mamba heads of 5, 2 groups of state 7: 58 conv channels)."""
    path = save_hybrid(make_hybrid("nemotron_h", layers_block_type=NEMOTRON_LAYERS), tmp_path)
    prompts = [[3, 17, 99, 100, 8, 42, 7], [5, 9], [(i * 7) % 131 for i in range(13)]]
    alone = _generate(path, prompts, 1, SpeculativeConfig())
    batched = _generate(path, prompts, 3, SpeculativeConfig())
    assert alone[0] == batched[0]
    assert alone[1] == batched[1]
