"""The adaptive chooser (speculative/adaptive.py) in simulated closed batches of 32 requests, no model: requests
whose first-draft rates differ (drawn around the mean with ``--spreads``, the later depths' rates shared),
``--tokens`` each, at the step costs and rates bench e2e measured for Qwen3.5's EAGLE3 at batch 32
(benchmarks/results/gpu_2026-12-05h call 27: temperature 0.8, and 0 with ``--greedy``). As bench e2e does, a
closed batch of 4 tokens and one of ``--tokens`` warm the chooser up; the third is timed. Prints, per spread,
the mean modelled milliseconds of the timed batch for the chooser and for each fixed draft count, and the
chooser's drafting steps.

2026-12-06, at 1f0f20c, 200 runs: at temperature 0.8 holding throughout takes 514.6 ms; the chooser 514.6 / 522.6
/ 524.8 / 524.5 at spreads 0 / 0.1 / 0.2 / 0.3, drafting in 12.6 / 9.3 / 4.9 / 4.0 of its steps (bench e2e
measured 5 drafting steps and 0.97x plain decoding's closed batch). Held steps leave every request one token
further, all tied, and one drafting step then shortens the batch only if every request accepts its draft: a
drafting step between held ones costs its extra time for nothing. With one rate for all (spread 0) a draft a
step throughout would take 480.4. Greedy, the chooser stays within 1% of the best fixed draft count at spreads 0
and 0.1 (288.0 against 291.0; 315.8 against 320.9). Tried and not taken: the quantile with each request's mean
also uncertain by the spread of the last 64 finished requests' first-draft rates (sample variance less the
binomial noise) in ``_steps_to_finish``'s shared-rate case: 517.6 / 520.3 / 520.6 / 520.6 at temperature 0.8
(at most 0.8% gained, 0.6% lost at spread 0), but greedy 318.9 (+1.0%), 413.5 (+4.4%) and 501.7 (+2.6%) at
spreads 0.1 to 0.3. Nor a larger margin between shapes (``DraftLengthChooser(margin=...)``, 1.03; 150 runs): at 1.06
every batch within 0.7% of 1.03's either way; at 1.10 temperature 0.8's 0.6-0.9% faster where rates differ (0.9%
slower where they do not), greedy ones 1.1-2.5% slower.

A rule simulated here as ``--rule expected-max`` (the integral of 1 - the product of the requests' distribution
functions) shipped later on 2026-12-06 in a fast form (``adaptive.expected_largest``): the batch's steps to its
end are the expected largest of its requests' step counts where their rates are one, not each request's count at
the unluckiest quantile, which counted a request already behind as unlucky once more and held a batch that had
begun to draft. 300 runs each, the same seeds, the quantile rule (b1eede8) -> the shipped one (mean difference
and its standard error): temperature 0.8 at spread 0 514.1 -> **493.4** ms (-20.7 +- 1.2), at 0.1 522.5 -> 521.2
(-1.3 +- 0.7); greedy at 0.1 317.4 -> 318.2 (+0.9 +- 1.8), at 0.3 488.7 -> 483.9 (-4.8 +- 5.5). (The first 100
runs had shown greedy losing 1.3% at spreads 0.1 and 0.3: within their noise.)

Tried and not taken (2026-12-06, acc29aa5, reverted): a closed batch's newcomers (fewer than 4 first drafts tried)
timed by the slowest newcomer that the last 64 finished requests' spread of first-depth rates (beyond binomial
noise) foretells: the batch-wide rate less that spread's deviation times the expected largest of as many normal
draws. n-gram's closed batches at temperature 0.8 began with 5-7 drafting steps on the batch-wide rate until the
requests' own counts showed that they differ (gpu_2026-12-06c call 4). `--before 2 --timed 4 --runs 25`, ms a
closed batch at spreads 0 / 0.1 / 0.2 / 0.3 without -> with it, batch 32: temperature 0.8 493.6 / 520.8 / 525.3 /
523.6 -> 494.8 / 517.3 / 516.3 / 518.3 (plain 514.6), greedy the same but 482.1 -> 484.6 at 0.3, `--ngram --tokens
128` 682.8 / 802.8 / 817.4 / 819.3 -> 680.9 / 811.0 / 811.9 / 811.9 (plain 811.5); but at batch 8 (``BATCH`` 8, the
same costs) temperature 0.8 479.4 / 503.2 / 516.7 / 518.0 -> 481.8 / 506.0 / 516.2 / 516.2, greedy 392.7 -> 397.5 at
0.3, n-gram 666.5 / 750.1 / 791.9 / 803.5 -> 666.5 / 744.5 / 810.2 / 811.9. Where the rule holds a batch plain from
its start no request's own counts accrue, so the batch never learns that its slowest request is faster than the
typical slowest of its size: losses at batch 32 became plain decoding's time, gains of 1-2.4% at batch 8 were lost.

Tried and not taken (2026-12-06): plain steps that observe n-gram's first draft. A host twin of the device matching
(the latest earlier occurrence of the longest suffix, one dictionary of windows a suffix length) gives the draft a
plain step would have verified; the step's token equals it with the probability a verify accepts it, so each plain
step (and each prompt's first token) counted one first draft verified per request, the first depth's counts alone
decaying, and no chain probe followed plain decoding. Simulated at ``NGRAM``'s costs, 128 tokens, after 2 untimed
batches, 40 runs of 2 timed batches, the same seeds; first-draft rate's mean / spread (later depths 0.6, 0.7, 0.7
behind 0.3 and 0.15, 0.8, 0.85, 0.85 behind 0.6), ms a closed batch without / every request observed at each plain
step / 4 requests a plain step in turn: 0.3 / 0: 689.5 / 680.6 / 680.3; 0.3 / 0.1: 801.8 / 786.0 / 801.6; 0.3 / 0.2:
818.3 / 817.8 / 818.2; 0.3 / 0.3: 819.7 / 818.6 / 819.2; 0.15 / 0.2: 813.8 / 813.8 / 814.2; 0.6 / 0.1: 483.7 / 477.2
/ 475.5; 0.6 / 0.2: 659.4 / 636.3 / 640.9; 0.6 / 0.3: 787.1 / 796.0 / 786.7 (plain decoding 811.5). It gained where
drafts pay but left the loss where rates spread widely around a low mean (0.8% over plain decoding at 0.3 / 0.2-0.3,
bench e2e's n-gram at temperature 0.8), and the twin cost the host 2.6 us a request a plain step and about three
dictionary entries a token of history (hybrid targets, never run ahead, wait for a plain step's host work). The
newcomers' rule above on top of it (a batch it held plain now learned in its plain steps): 0.6 / 0.3 796.6 ms.

    PYTHONPATH=. python benchmarks/scripts/closed_batch_spread.py [--greedy | --ngram] [--runs 200] [--tokens 64]
        [--spreads 0 0.1 0.2 0.3] [--before 1] [--timed 1]
"""

from __future__ import annotations

import argparse
import random
import statistics

from outpace.speculative.adaptive import PROBE_BUDGET, DraftLengthChooser
from outpace.speculative.proposer import DraftShape

# ms a step at batch 32 for 0 .. 4 drafts, and the chooser's rates a_1 .. a_4 after the row
SAMPLED = ((8.04, 10.57, 12.56, 13.95, 15.75), (0.56, 0.43, 0.72, 0.85))
GREEDY = ((7.85, 9.84, 11.88, 11.98, 14.25), (0.83, 0.87, 0.92, 0.89))
# ``--ngram``: bench e2e's n-gram on the widened Llama at temperature 0.8, batch 32 (gpu_2026-12-06c call 4: about
# 6.34-6.44 ms a plain step, 6.71 / 7.01 / 7.23 with 1-3 drafts; the fourth's cost and every rate are guesses)
NGRAM = ((6.34, 6.70, 7.00, 7.23, 7.6), (0.3, 0.6, 0.7, 0.7))
BATCH = 32


def closed_batch(chooser, rng, rates, tokens: int, costs, fixed: int | None) -> tuple[float, int]:
    """(modelled ms, drafting steps) of one closed batch of requests at ``rates`` (one row each)."""
    ids = [f"{rng.random()}" for _ in rates]
    left = dict(zip(ids, [tokens] * len(ids)))
    of = dict(zip(ids, rates))
    ms, drafting = 0.0, 0
    while left:
        live = list(left)
        shape = (
            chooser.choose(BATCH, live, [left[r] for r in live])
            if fixed is None
            else DraftShape(fixed)
        )
        ms += costs[shape.num_steps]
        drafting += shape.num_steps > 0
        accepted = []
        for r in live:
            a = 0
            while a < shape.num_steps and rng.random() < of[r][a]:
                a += 1
            accepted.append(a)
            left[r] -= a + 1
        chooser.observe(shape, accepted, live)
        for r in live:
            if left[r] <= 0:
                del left[r]
                chooser.forget(r)
    return ms, drafting


def run(
    seed: int,
    spread: float,
    tokens: int,
    costs,
    mean_rates,
    fixed: int | None,
    before: int = 1,
    timed: int = 1,
) -> list[tuple[float, int]]:
    """(modelled ms, drafting steps) of each of ``timed`` closed batches of ``tokens``, after bench e2e's warm-up (a
    closed batch of 4 tokens) and ``before`` untimed batches of ``tokens``, one chooser throughout."""
    rng = random.Random(seed)
    chooser = DraftLengthChooser(
        [DraftShape(k) for k in range(len(costs))], probe_budget=PROBE_BUDGET
    )
    for k, cost in enumerate(costs):
        chooser.record_cost(BATCH, DraftShape(k), cost / 1e3)

    def rates():
        first = [min(0.95, max(0.05, rng.gauss(mean_rates[0], spread))) for _ in range(BATCH)]
        return [(a,) + mean_rates[1:] for a in first]

    closed_batch(chooser, rng, rates(), 4, costs, fixed)  # bench e2e's warm-up
    for _ in range(before):
        closed_batch(chooser, rng, rates(), tokens, costs, fixed)
    return [closed_batch(chooser, rng, rates(), tokens, costs, fixed) for _ in range(timed)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--ngram", action="store_true", help="n-gram's costs and rates (NGRAM)")
    p.add_argument("--before", type=int, default=1, help="untimed closed batches after the warm-up")
    p.add_argument("--timed", type=int, default=1, help="timed closed batches after those")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--spreads", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    a = p.parse_args()
    costs, mean_rates = NGRAM if a.ngram else GREEDY if a.greedy else SAMPLED
    policies = [None] + list(range(len(costs)))
    print(
        f"{'spread':>6} "
        + " ".join(f"{'chooser' if k is None else f'{k} drafts':>9}" for k in policies)
        + "  drafting steps"
    )
    for spread in a.spreads:
        cells, drafting = [], 0.0
        for fixed in policies:
            batches = [
                b
                for s in range(a.runs)
                for b in run(s, spread, a.tokens, costs, mean_rates, fixed, a.before, a.timed)
            ]
            cells.append(statistics.mean(ms for ms, _ in batches))
            if fixed is None:
                drafting = statistics.mean(d for _, d in batches)
        print(f"{spread:>6} " + " ".join(f"{c:>9.1f}" for c in cells) + f"  {drafting:.1f}")


if __name__ == "__main__":
    main()
