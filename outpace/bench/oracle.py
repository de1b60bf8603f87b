"""Speculation speed-ups from step costs that are measured and an acceptance that is not measured with them:
an assumed per-position acceptance (ORACLE: the shaped targets of the GPU benches have random weights, so
nothing they draft is accepted), or per-depth rates measured elsewhere (``rows_at_rates``: the widened zoo's
drafter, bench e2e). Rows built from either carry a label that says which."""

from __future__ import annotations

from collections.abc import Sequence

ORACLE_ACCEPTANCE = (0.6, 0.8, 0.9)  # assumed per-position acceptance
ORACLE_LABEL = "ORACLE acceptance (assumed, not measured); step costs measured"


def expected_tokens(acceptance: float | Sequence[float], num_drafts: int) -> float:
    """Tokens a step commits with ``num_drafts`` drafts, the bonus token included: 1 + a_1 + a_1 a_2 + ... +
    a_1 ... a_k, a_j the chance that draft j is accepted given the ones before it (``acceptance``: one
    per-position rate, or the rates by depth, at least ``num_drafts`` of them)."""
    rates = [acceptance] * num_drafts if isinstance(acceptance, (int, float)) else acceptance
    if len(rates) < num_drafts:
        raise ValueError(f"{len(rates)} acceptance rates for {num_drafts} drafts")
    tokens, reach = 1.0, 1.0
    for a in rates[:num_drafts]:
        reach *= a
        tokens += reach
    return tokens


def best_draft_count(
    costs: dict[int, float], plain_seconds: float, acceptance: float | Sequence[float]
) -> tuple[int, float]:
    """costs[k]: seconds of a step with k drafts (any set of k) -> (the k with the most tokens per second,
    its speed-up over plain decoding, one token per ``plain_seconds``). With rates by depth only the draft
    counts they cover are weighed."""
    depth = None if isinstance(acceptance, (int, float)) else len(acceptance)
    counts = [n for n in costs if depth is None or n <= depth]
    k = max(counts, key=lambda n: expected_tokens(acceptance, n) / costs[n])
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


def rows_at_rates(costs: dict[int, float], batch: int, rates: Sequence[float]) -> dict:
    """costs[k]: seconds of a captured step of ``batch`` rows with k drafts (0: plain); ``rates``: acceptance
    by depth measured elsewhere -> the best k within those depths, its speed-up over plain decoding and the
    tokens/s it gives."""
    k, speedup = best_draft_count(costs, costs[0], rates)
    return {
        "rates": list(rates),
        "num_drafts": k,
        "speedup": speedup,
        "tokens_per_s": batch * expected_tokens(rates, k) / costs[k],
    }


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
