"""Batch-invariant mode on the GPU (skipped without CUDA), bf16, CUDA graphs, the Triton backend: EAGLE3
chains and trees give plain decoding's output, token for token and log-probability for log-probability,
greedy and seeded (Gumbel-max, noise from (seed, position)) at T = 0.8 and 1.0, at batch 1 and 8; and plain
decoding itself gives the same bits at batch 1 and 8 (issue 42: trees were 83% / 71% equal seeded)."""

import json
from functools import cache
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SPECS = {
    "plain": SpeculativeConfig(),
    "eagle3-chain": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5),
    "eagle3-tree": SpeculativeConfig(
        "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5, topk=4, num_draft_tokens=16
    ),
}
TEMPERATURES = (0.0, 0.8, 1.0)
BATCHES = (1, 8)


@cache
def engine(method: str, batch: int) -> LLM:
    return LLM(
        str(ZOO / "tinypy"),
        speculative=SPECS[method],
        device="cuda",
        dtype="bfloat16",
        batch_invariant=True,
        max_num_seqs=batch,
        num_kv_blocks=256,  # the six engines share the GPU
    )


@cache
def run(method: str, batch: int, temperature: float) -> tuple[list, list]:
    """Token ids and per-position log-probabilities (the sampled token's and the top 2) of 8 prompts."""
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:8]
    params = [
        SamplingParams(
            temperature=temperature,
            seed=None if temperature == 0 else 1000 + i,
            max_tokens=48,
            ignore_eos=True,
            logprobs=2,
        )
        for i in range(len(prompts))
    ]
    outs = engine(method, batch).generate(prompts, params)
    logprobs = [
        [{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in o.logprobs] for o in outs
    ]
    return [o.token_ids for o in outs], logprobs


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("method", ["eagle3-chain", "eagle3-tree"])
def test_speculation_gives_plain_decodings_bits(method, batch, temperature):
    tokens, logprobs = run(method, batch, temperature)
    plain_tokens, plain_logprobs = run("plain", batch, temperature)
    assert tokens == plain_tokens
    assert logprobs == plain_logprobs  # bitwise: the floats compared exactly


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_plain_decoding_is_the_same_at_batch_1_and_8(temperature):
    assert run("plain", 1, temperature) == run("plain", 8, temperature)
