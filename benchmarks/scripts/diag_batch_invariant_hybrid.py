"""Whether batch-invariant mode holds on a hybrid target on the CPU: the zoo's tinyqwen35 in float32, greedy, 4
prompts, log-probabilities of the top 2: plain decoding at batch 1 against batch 4, and MTP against plain decoding,
token ids and log-probabilities compared exactly; the first position where the log-probabilities differ.

    PYTHONPATH=. python3 benchmarks/scripts/diag_batch_invariant_hybrid.py

2026-11-30, this container's CPU: tokens equal, log-probabilities not (about 1 ulp; first at prompt 0's position 2
at batch 1 against 4, position 1 for MTP against plain); the first module whose output differs (forward hooks,
batch 1 against 4) is the first gated DeltaNet layer's gated norm.

2026-11-30, after fcf0191: tokens and log-probabilities equal in both comparisons (first difference None). The
sources were the gates' softplus / sigmoid (and exp, silu) on tensors whose size followed the batch (ATen's
vector code and scalar tail round differently), the short convolution's einsum, and, for MTP against plain,
the CPU attention (each query now attends alone); tests/engine/test_batch_invariant_hybrids.py keeps it."""

from __future__ import annotations

import json
from pathlib import Path

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def run(spec: SpeculativeConfig, batch: int) -> tuple[list, list]:
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    llm = LLM(
        str(ZOO / "tinyqwen35"),
        device="cpu",
        dtype="float32",
        batch_invariant=True,
        max_num_seqs=batch,
        speculative=spec,
    )
    outs = llm.generate(prompts, params)
    logprobs = [[{t: lp.logprob for t, lp in pos.items()} for pos in o.logprobs] for o in outs]
    return [o.token_ids for o in outs], logprobs


def first_difference(a: list, b: list) -> tuple[int, int] | None:
    """(prompt, position) of the first log-probabilities that differ."""
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return i, j
    return None


def main() -> None:
    one, four = run(SpeculativeConfig(), 1), run(SpeculativeConfig(), 4)
    mtp = run(SpeculativeConfig("mtp", num_steps=2), 4)
    for name, (a, b) in {"plain b1 vs b4": (one, four), "mtp vs plain b4": (mtp, four)}.items():
        print(
            f"{name:16} tokens equal {a[0] == b[0]}, log-probabilities equal {a[1] == b[1]}, "
            f"first difference (prompt, position) {first_difference(a[1], b[1])}"
        )


if __name__ == "__main__":
    main()
