"""Speculation speed-ups under ORACLE acceptance: an assumed per-position acceptance (the shaped targets
of the GPU benches have random weights, so nothing they draft is accepted) combined with step costs that
are measured. Rows built from it carry that label."""

from __future__ import annotations

ORACLE_ACCEPTANCE = (0.6, 0.8, 0.9)  # assumed per-position acceptance


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
