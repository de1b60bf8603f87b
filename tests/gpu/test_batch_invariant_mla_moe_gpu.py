"""Batch-invariant mode on an MLA + MoE target (the zoo's tinyds, DeepSeek-V3's architecture) on the GPU (skipped
without CUDA), bf16: greedy speculation gives plain decoding's tokens and log-probabilities bit for
bit with an n-gram chain (CUDA graphs) and with tree drafts (eager steps), as tests/engine/test_batch_invariant_trees.py checks on the CPU;
here through the GPU's kernels: the mode's MoE kernels, the MLA kernel's invariant variant (trees walked over
each node's logical rows) and the absorbed per-head products in one launch (layers/skinny_gemm.py
``skinny_linear_heads``)."""

from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

TINYDS = str(Path(__file__).resolve().parents[2] / "zoo" / "tinyds")
PROMPTS = [[1, 5, 2, 7, 3, 9, 1, 5, 2, 7, 3, 9, 1, 5, 2], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2]]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
KWARGS = dict(device="cuda", dtype="bfloat16", batch_invariant=True, num_kv_blocks=128)


def tokens_and_logprobs(outputs) -> list[tuple[list[int], list[float]]]:
    return [
        (o.token_ids, [entry[t].logprob for entry, t in zip(o.logprobs, o.token_ids)])
        for o in outputs
    ]


@pytest.mark.gpu
def test_an_ngram_chain_gives_plain_decodings_bits():
    plain = tokens_and_logprobs(LLM(TINYDS, **KWARGS).generate(PROMPTS, PARAMS))
    spec = SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
    chain = LLM(TINYDS, speculative=spec, **KWARGS).generate(PROMPTS, PARAMS)
    assert tokens_and_logprobs(chain) == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in chain) > 0


@pytest.mark.gpu
def test_tree_drafts_give_plain_decodings_bits(monkeypatch):
    """Eager steps: the oracle's trees (tests/helpers/oracle_proposer.py, corrupted by a random draw) are
    drawn where a captured graph cannot draw them."""
    from helpers.oracle_proposer import OracleProposer
    from outpace.registry import PROPOSERS

    monkeypatch.setitem(PROPOSERS, "oracle", "helpers.oracle_proposer:OracleProposer")
    kwargs = dict(KWARGS, cuda_graphs=False)
    plain_outputs = LLM(TINYDS, **kwargs).generate(PROMPTS, PARAMS)
    plain = tokens_and_logprobs(plain_outputs)
    references = {tuple(p): o.token_ids for p, o in zip(PROMPTS, plain_outputs)}
    monkeypatch.setattr(OracleProposer, "references", references)
    spec = SpeculativeConfig("oracle", "unused", num_steps=3, topk=2, num_draft_tokens=6)
    tree = LLM(TINYDS, speculative=spec, **kwargs).generate(PROMPTS, PARAMS)
    assert tokens_and_logprobs(tree) == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in tree) > 0
