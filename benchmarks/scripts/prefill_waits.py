"""How often a prefill step waits on the GPU, per drafter (a GPU is needed): torch's sync debug mode warns at each
wait (a blocking copy either way, ``.tolist()``, ``.item()``), counted over ``PrefillStep.run`` for one closed batch
of the zoo's tinypy prompts after a warm-up. The step's one necessary wait reads the sampled tokens; any other one
holds the host's later work (sampling's tensors, the request state, the drafter's absorb) until the forward has run,
so that work is not hidden behind it (outpace/host_copies.py). The Python line of each wait is listed.

    PYTHONPATH=. python benchmarks/scripts/prefill_waits.py [--methods plain ngram eagle3 mtp dflash draft] [--batch 4]
"""

from __future__ import annotations

import argparse
import collections
import json
import warnings
from pathlib import Path

import torch

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SPECS = {
    "plain": SpeculativeConfig(),
    "ngram": SpeculativeConfig("ngram", num_steps=4),
    "eagle3": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5),
    "mtp": SpeculativeConfig("mtp", num_steps=3),
    "dflash": SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7),
    "draft": SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=5),
}


def prefill_waits(method: str, batch: int) -> tuple[list[int], collections.Counter]:
    """(waits of each prefill step of one closed batch, the outpace lines that waited and how often)."""
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:batch]
    params = [
        SamplingParams(temperature=0.8, max_tokens=8, seed=i, ignore_eos=True) for i in range(batch)
    ]
    llm = LLM(
        str(ZOO / "tinypy"),
        device="cuda",
        dtype="float32",
        max_num_seqs=batch,
        speculative=SPECS[method],
    )
    llm.generate(prompts, params)  # compiled and warmed
    prefill, counts, where = llm.engine.runner.prefill_step, [], collections.Counter()
    run = prefill.run

    def watched(scheduled):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return run(scheduled)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                waits = [w for w in caught if "synchroniz" in str(w.message)]
                counts.append(len(waits))
                where.update(f"{w.filename}:{w.lineno}" for w in waits)

    prefill.run = watched
    llm.generate(prompts, params)
    return counts, where


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(SPECS), choices=list(SPECS))
    p.add_argument("--batch", type=int, default=4)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prefill_waits.py counts waits on a GPU: no CUDA device here")
    for method in a.methods:
        counts, where = prefill_waits(method, a.batch)
        print(f"{method:<7} waits a prefill step: {counts}")
        for line, n in where.most_common():
            print(f"    {n} x {line}")


if __name__ == "__main__":
    main()
