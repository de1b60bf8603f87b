"""Batch-invariant mode with tree-shaped drafts on an MLA target (attention/mla_kernels.py's invariant variant
walks each tree node over its logical rows), end to end on the zoo's tinyds."""

import pytest

from outpace import LLM, SamplingParams


def test_batch_invariant_tree_drafts_on_an_mla_target_give_plain_decodings_tokens(monkeypatch):
    """Batch-invariant mode with a tree-shaped draft on an MLA target builds (it was refused while the MLA
    kernels' invariant variant walked a tree's window in place) and, under the Triton backend (the MLA
    kernels in the interpreter on the CPU), gives plain decoding's tokens: the oracle's random trees
    (corrupted, so nodes of several depths and branches are accepted) verified on tinyds against tinyds
    decoding in the mode. (Not its log-probabilities bit for bit: on the CPU tinyds's verify rows differ from
    decoding's in the last bits with a chain draft too, and under the torch backend as well, so outside the
    MLA kernels; tests/kernels/test_mla_kernel.py checks the kernels' tree rows bit for bit.)"""
    from pathlib import Path

    from helpers.oracle_proposer import OracleProposer
    from outpace.config import SpeculativeConfig
    from outpace.registry import PROPOSERS

    pytest.importorskip("triton")
    monkeypatch.setitem(PROPOSERS, "oracle", "helpers.oracle_proposer:OracleProposer")
    tinyds = str(Path(__file__).resolve().parents[2] / "zoo" / "tinyds")
    kwargs = dict(
        device="cpu",
        dtype="float32",
        attention_backend="triton",
        batch_invariant=True,
        block_size=4,
    )
    prompts = [[1, 5, 2, 7, 3, 9, 11], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2]]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    plain = [o.token_ids for o in LLM(tinyds, **kwargs).generate(prompts, params)]
    monkeypatch.setattr(OracleProposer, "references", {tuple(p): t for p, t in zip(prompts, plain)})
    spec = SpeculativeConfig("oracle", "unused", num_steps=3, topk=2, num_draft_tokens=6)
    tree = LLM(tinyds, speculative=spec, **kwargs).generate(prompts, params)
    assert [o.token_ids for o in tree] == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in tree) > 0
