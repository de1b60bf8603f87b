"""Speculation speed-ups under ORACLE acceptance: an assumed per-position acceptance (the shaped targets
of the GPU benches have random weights, so nothing they draft is accepted) combined with step costs that
are measured. Rows built from it carry that label."""

from __future__ import annotations

ORACLE_ACCEPTANCE = (0.6, 0.8, 0.9)  # assumed per-position acceptance
ORACLE_LABEL = "ORACLE acceptance (assumed, not measured); step costs measured"


def expected_tokens(acceptance: float, num_drafts: int) -> float:
    """Tokens a step commits when each draft is accepted with probability ``acceptance`` given the ones
    before it: 1 + a + ... + a^k (the bonus token included)."""
    return sum(acceptance**i for i in range(num_drafts + 1))


def best_draft_count(
    costs: dict[int, float], plain_seconds: float, acceptance: float
) -> tuple[int, float]:
    """costs[k]: seconds of a step with k drafts (any set of k) -> (the k with the most tokens per second,
    its speed-up over plain decoding, one token per ``plain_seconds``)."""
    k = max(costs, key=lambda n: expected_tokens(acceptance, n) / costs[n])
    return k, expected_tokens(acceptance, k) / costs[k] * plain_seconds


def oracle_speedups(costs: dict[int, float]) -> list[dict]:
    """costs[k]: seconds of a captured step with k drafts (0: plain) -> per assumed acceptance, the best k
    and its speed-up over plain decoding."""
    rows = []
    for a in ORACLE_ACCEPTANCE:
        k, speedup = best_draft_count(costs, costs[0], a)
        rows.append({"acceptance": a, "num_drafts": k, "speedup": speedup})
    return rows


def oracle_rows(costs: dict[int, float], batch: int) -> list[dict]:
    """``oracle_speedups`` of the steps of ``batch`` rows, each with the tokens/s its k gives (batch x
    expected tokens over its step)."""
    return [
        {
            **r,
            "tokens_per_s": batch
            * expected_tokens(r["acceptance"], r["num_drafts"])
            / costs[r["num_drafts"]],
        }
        for r in oracle_speedups(costs)
    ]


def captured_step_costs(llm, batch: int, context: int) -> dict[int, float]:
    """Seconds of the captured step of ``batch``'s bucket by draft count: adaptive speculation's start-up
    profile (engine ``choosers``) on a GPU; on the CPU, which profiles nothing, measured by running a decode
    step of each draft count at ``context`` (bench/gpu.py ``time_decode``)."""
    from outpace.bench.gpu import time_decode
    from outpace.engine.cuda_graphs import bucket_for
    from outpace.engine.step_key import SamplingMode

    runner, chooser = llm.engine.runner, llm.engine.choosers[SamplingMode.GREEDY]
    bucket = bucket_for(runner.graph_buckets, batch) or batch  # (the CPU has no graph buckets)

    def costs() -> dict[int, float]:
        return {s.num_steps: c for (b, s), c in chooser.costs.items() if b == bucket}

    if len(costs()) < len(runner.shapes):
        time_decode(llm, batch, context, steps=len(runner.shapes) + 1)
    return costs()
