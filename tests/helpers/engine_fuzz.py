"""Drive an engine through a random mix of requests, the way the accounting property tests do: each request
is (prompt, max_tokens, abort after this many engine steps or None, greedy or sampled); all are added, then
the engine steps until every one has finished or been aborted, the test's invariants checked after each step."""

from __future__ import annotations

from typing import Callable

from hypothesis import strategies as st

from outpace import SamplingParams

# (prompt length, max_tokens, abort after this many steps (None: run to the end), greedy or sampled)
request_strategy = st.tuples(
    st.integers(1, 20),
    st.integers(1, 12),
    st.one_of(st.none(), st.integers(0, 10)),
    st.booleans(),
)


def run_with_aborts(
    engine, requests: list[tuple[list[int], int, int | None, bool]], after_step: Callable[[], None]
) -> None:
    """Add ``requests`` (request i sampled at temperature 1 with seed i unless greedy), step the engine until
    none is unfinished, aborting each at its step, and call ``after_step()`` after every step."""
    aborts = {}
    for i, (prompt, max_tokens, abort_after, greedy) in enumerate(requests):
        params = SamplingParams(
            temperature=0 if greedy else 1.0, max_tokens=max_tokens, seed=i, ignore_eos=True
        )
        aborts[engine.add_request(prompt, params)] = abort_after
    step = 0
    while engine.has_unfinished_requests:
        for rid, abort_after in aborts.items():
            if abort_after == step:
                engine.abort_request(rid)
        engine.step()
        step += 1
        after_step()
