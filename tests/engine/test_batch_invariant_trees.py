"""Batch-invariant mode on an MLA + MoE target (the zoo's tinyds, DeepSeek-V3's architecture): greedy speculation
gives plain decoding's tokens and log-probabilities bit for bit, with an n-gram chain and with tree drafts (the
Triton backend: the MLA kernel's invariant variant walks each tree node over its logical rows,
attention/mla_kernels.py). On the CPU in float32 (the chain on the torch backend, the trees' kernels in Triton's
interpreter); on a GPU in bf16 too (skipped without CUDA), through the mode's MoE kernels and the absorbed
per-head products in one launch (layers/skinny_gemm.py ``skinny_linear_heads``). Before the router's logits went
through the mode's projection (layers/router.py ``Router.reference``), a verify row's logits differed from
decoding's in the last bits on the CPU."""

import os
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

TINYDS = str(Path(__file__).resolve().parents[2] / "zoo" / "tinyds")
PROMPTS = [[1, 5, 2, 7, 3, 9, 1, 5, 2, 7, 3, 9, 1, 5, 2], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2]]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
SETTINGS = {
    "cpu": dict(device="cpu", dtype="float32", batch_invariant=True, block_size=4),
    "cuda": dict(device="cuda", dtype="bfloat16", batch_invariant=True, num_kv_blocks=128),
}
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
# The tree cases run Triton kernels: on the CPU only in Triton's interpreter (tests/conftest.py turns it on
# where there is no GPU; on a GPU machine CPU tensors cannot reach a compiled kernel)
TRITON_DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off"
        ),
    ),
    pytest.param("cuda", marks=pytest.mark.gpu),
]


def tokens_and_logprobs(outputs) -> list[tuple[list[int], list[float]]]:
    return [
        (o.token_ids, [entry[t].logprob for entry, t in zip(o.logprobs, o.token_ids)])
        for o in outputs
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_an_ngram_chain_gives_plain_decodings_bits(device):
    kwargs = SETTINGS[device]
    plain = tokens_and_logprobs(LLM(TINYDS, **kwargs).generate(PROMPTS, PARAMS))
    spec = SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
    chain = LLM(TINYDS, speculative=spec, **kwargs).generate(PROMPTS, PARAMS)
    assert tokens_and_logprobs(chain) == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in chain) > 0


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_tree_drafts_give_plain_decodings_bits(device, monkeypatch):
    """The oracle's random trees (corrupted, so nodes of several depths and branches are accepted) verified
    under the Triton backend (it was refused while the MLA kernels' invariant variant walked a tree's window
    in place); eager steps, as the oracle draws its trees from a generator a captured graph cannot draw from."""
    from helpers.oracle_proposer import OracleProposer
    from outpace.registry import PROPOSERS

    pytest.importorskip("triton")
    monkeypatch.setitem(PROPOSERS, "oracle", "helpers.oracle_proposer:OracleProposer")
    kwargs = dict(SETTINGS[device], attention_backend="triton", cuda_graphs=False)
    plain_outputs = LLM(TINYDS, **kwargs).generate(PROMPTS, PARAMS)
    plain = tokens_and_logprobs(plain_outputs)
    references = {tuple(p): o.token_ids for p, o in zip(PROMPTS, plain_outputs)}
    monkeypatch.setattr(OracleProposer, "references", references)
    spec = SpeculativeConfig("oracle", None, num_steps=3, topk=2, num_draft_tokens=6)
    tree = LLM(TINYDS, speculative=spec, **kwargs).generate(PROMPTS, PARAMS)
    assert tokens_and_logprobs(tree) == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in tree) > 0
