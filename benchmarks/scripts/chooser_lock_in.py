"""The adaptive chooser (speculative/adaptive.py) on simulated requests, no model: closed batches of one request
of ``--tokens`` each, one after another (bench e2e's rows at batch 1), each verify accepting draft j with
probability ``a_j`` given draft j - 1 landed, each step costing the widened DeepSeek's step time for its draft
count (bench e2e's chooser at temperature 0.8, benchmarks/results/gpu_2026-12-01j call 4: 2.69 / 3.87 / 4.33 ms
for 0 / 1 / 2 drafts). Prints, per acceptance pair, the modelled tokens/s of the chooser and of each fixed draft
count (the first request of a run is the chooser's warm-up and not counted), and the runs in which the chooser
decoded plainly with more than a quarter of a request's tokens left for at least half of the requests.
``--optimism Z``: the chooser's ``OPTIMISM`` (standard errors above the batch-wide rates) set to Z for the run.

    PYTHONPATH=. python benchmarks/scripts/chooser_lock_in.py [--runs 60] [--requests 8] [--tokens 64] [--optimism Z]
"""

from __future__ import annotations

import argparse
import random

from outpace.speculative import adaptive
from outpace.speculative.adaptive import PROBE_BUDGET, DraftLengthChooser
from outpace.speculative.proposer import DraftShape

COSTS_MS = (2.69, 3.87, 4.33)
ACCEPTANCE = ((0.735, 0.709), (0.7, 0.7), (0.66, 0.5), (0.75, 0.3), (0.5, 0.4), (0.3, 0.3))


def run(rates, seed: int, requests: int, tokens: int, fixed: int | None = None):
    """(modelled tokens/s, requests that decoded plainly with over a quarter of their tokens left) of one run."""
    rng = random.Random(seed)
    chooser = DraftLengthChooser(
        [DraftShape(k) for k in range(len(COSTS_MS))], probe_budget=PROBE_BUDGET
    )
    for k, cost in enumerate(COSTS_MS):
        chooser.record_cost(1, DraftShape(k), cost / 1e3)
    ms = made = 0.0
    stuck = 0
    for r in range(requests + 1):
        rid, left, plain_early = f"r{r}", tokens, False
        while left > 0:
            if fixed is None:
                shape = chooser.choose(1, [rid], [left])
            else:
                shape = DraftShape(min(fixed, left - 1))
            plain_early |= shape.num_steps == 0 and left > tokens // 4
            accepted = 0
            while accepted < shape.num_steps and rng.random() < rates[accepted]:
                accepted += 1
            chooser.observe(shape, [accepted], [rid])
            if r:  # (the first request warms the chooser up)
                ms += COSTS_MS[shape.num_steps]
                made += min(accepted + 1, left)
            left -= accepted + 1
        chooser.forget(rid)
        stuck += r > 0 and plain_early
    return 1e3 * made / ms, stuck


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--optimism", type=float, default=None)
    a = p.parse_args()
    if a.optimism is not None:
        adaptive.OPTIMISM = a.optimism
    print(f"plain decoding {1e3 / COSTS_MS[0]:.1f} tokens/s (modelled)")
    for rates in ACCEPTANCE:
        chosen = [run(rates, s, a.requests, a.tokens) for s in range(a.runs)]
        fixed = {
            k: sum(run(rates, s, a.requests, a.tokens, k)[0] for s in range(a.runs)) / a.runs
            for k in (1, 2)
        }
        locked = sum(stuck >= a.requests // 2 for _, stuck in chosen)
        print(
            f"acceptance {rates}: chooser {sum(t for t, _ in chosen) / a.runs:.1f} tokens/s, fixed 1 draft "
            f"{fixed[1]:.1f}, fixed 2 {fixed[2]:.1f}; runs mostly plain: {locked} of {a.runs}"
        )


if __name__ == "__main__":
    main()
