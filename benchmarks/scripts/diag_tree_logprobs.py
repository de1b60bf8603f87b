"""Issue 42's diagnosis, rerunnable: in batch-invariant mode, how many of an EAGLE3 chain's and tree's
log-probabilities are bitwise plain decoding's (greedy, and seeded at T = 0.8 and 1.0), the worst difference,
and how many outputs are token for token plain decoding's. Before the logical-row walk of the batch-invariant
attention (attention/triton_kernels.py) chains gave 1536 of 1536 and trees 738 of 1536 greedy (H200, bf16).

    python benchmarks/scripts/diag_tree_logprobs.py [--device cuda] [--dtype bfloat16] [--batch 8]
    TRITON_INTERPRET=1 python benchmarks/scripts/diag_tree_logprobs.py --device cpu --dtype float32 \
        --attention-backend triton --prompts 2 --max-tokens 12   # the kernels in the interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.zoo import zoo_dir

SPECS = {
    "eagle3-chain": SpeculativeConfig("eagle3", str(zoo_dir() / "tinypy-eagle3"), num_steps=5),
    "eagle3-tree": SpeculativeConfig(
        "eagle3", str(zoo_dir() / "tinypy-eagle3"), num_steps=5, topk=4, num_draft_tokens=16
    ),
}


def generate(llm: LLM, prompts: list[str], temperature: float, max_tokens: int):
    """Token ids and, per position, {token: logprob} (the sampled token and the top 2)."""
    params = [
        SamplingParams(
            temperature=temperature,
            seed=None if temperature == 0 else 1000 + i,
            max_tokens=max_tokens,
            ignore_eos=True,
            logprobs=2,
        )
        for i in range(len(prompts))
    ]
    outs = llm.generate(prompts, params)
    return [o.token_ids for o in outs], [
        [{t: lp.logprob for t, lp in pos.items()} for pos in o.logprobs] for o in outs
    ]


def compare(spec, plain) -> tuple[int, int, int, float, int]:
    """(prompts with equal tokens, logprob entries bitwise equal, entries compared, worst difference,
    prompts): entries compared where both runs hold the same token at a position."""
    same_tokens = sum(a == b for a, b in zip(spec[0], plain[0]))
    equal = total = 0
    worst = 0.0
    for rows_a, rows_b in zip(spec[1], plain[1]):
        for a, b in zip(rows_a, rows_b):
            for t in set(a) & set(b):
                total += 1
                equal += a[t] == b[t]
                worst = max(worst, abs(a[t] - b[t]))
    return same_tokens, equal, total, worst, len(spec[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=8, help="max_num_seqs")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--attention-backend", default=None, help="the engine's default if not given")
    a = ap.parse_args()
    if (
        os.environ.get("TRITON_INTERPRET") == "1"
    ):  # the interpreter's tl.dot row by row, as in the tests
        sys.path.insert(0, "tests")  # (numpy's BLAS gives a row other bits at other tile rows)
        import conftest  # noqa: F401
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"][: a.prompts]
    engine = dict(device=a.device, dtype=a.dtype, batch_invariant=True, max_num_seqs=a.batch)
    if a.attention_backend:  # e.g. triton on the CPU, in Triton's interpreter (TRITON_INTERPRET=1)
        engine["attention_backend"] = a.attention_backend
    temperatures = (0.0, 0.8, 1.0)
    plain_llm = LLM(str(zoo_dir() / "tinypy"), **engine)
    plain = {t: generate(plain_llm, prompts, t, a.max_tokens) for t in temperatures}
    plain_llm.close()
    for name, spec in SPECS.items():
        llm = LLM(str(zoo_dir() / "tinypy"), speculative=spec, **engine)
        for t in temperatures:
            same, equal, total, worst, n = compare(
                generate(llm, prompts, t, a.max_tokens), plain[t]
            )
            print(
                f"{name:>13} T={t}: tokens equal {same}/{n} prompts, logprobs bitwise equal "
                f"{equal}/{total} (worst difference {worst:.2e})",
                flush=True,
            )
        llm.close()


if __name__ == "__main__":
    main()
