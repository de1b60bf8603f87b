"""Batch-invariant mode on the CPU's torch backend: EAGLE3 draft trees verified on a grouped-query attention target
(the zoo's tinypy), a hybrid one (tinyqwen35: gated DeltaNet and gated attention), one with sliding-window layers
(tinygemma) and an MLA + MoE one (tinyds) give plain decoding's tokens and log-probabilities bit for bit, in
float32, greedy and seeded. A tree node attends over its prefix and its ancestors only, gathered
(attention/torch_backend.py ``_each_query_alone``): attended over every earlier node under a mask, its rows
differed from decoding's in the last bits (the masked siblings changed how the CPU kernel blocks its sums)."""

import json
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"
PARAMS = {
    "greedy": SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2),
    # Gumbel-max with noise from (seed, position): a verified node draws what decoding draws there
    "seeded": SamplingParams(temperature=0.8, seed=7, max_tokens=16, ignore_eos=True, logprobs=2),
}


def tokens_and_logprobs(outputs) -> list:
    return [
        (o.token_ids, [{t: lp.logprob for t, lp in pos.items()} for pos in o.logprobs])
        for o in outputs
    ]


@pytest.mark.parametrize("sampling", list(PARAMS))
@pytest.mark.parametrize("target", ["tinypy", "tinyqwen35", "tinygemma", "tinyds"])
def test_eagle3_trees_give_plain_decodings_bits(target, sampling):
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:2]
    kwargs = dict(device="cpu", dtype="float32", batch_invariant=True, max_num_seqs=2)
    plain = tokens_and_logprobs(
        LLM(str(ZOO / target), **kwargs).generate(prompts, PARAMS[sampling])
    )
    spec = SpeculativeConfig(
        "eagle3", str(ZOO / f"{target}-eagle3"), num_steps=4, topk=2, num_draft_tokens=8
    )
    tree = LLM(str(ZOO / target), speculative=spec, **kwargs).generate(prompts, PARAMS[sampling])
    assert tokens_and_logprobs(tree) == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in tree) > 0
