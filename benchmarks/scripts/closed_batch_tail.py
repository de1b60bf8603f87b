"""Where a drafter's closed batch spends host time the GPU waits on: from ``closed_batch_rounds.py --steps``'s log,
per row, the wall time of its steps beyond the GPU time the chooser believed for their shape (``StepLog``'s
fourth field), in the body (every request still decoding, steps run ahead) and in the tail (from the step before
the first request leaves). Plain decoding's rows have no chooser and are skipped.

In the tail, requests end on different steps. A request that ends waits, in ``ModelRunner.release``, for the step
run ahead for it, and the batch's next step is launched only after that. So each tail step's wall time holds the
next step's GPU time, and the host's own time is no longer hidden.

    PYTHONPATH=. python benchmarks/scripts/closed_batch_tail.py STEPS.json [STEPS.json ...]
"""

from __future__ import annotations

import argparse
import json


def tail_split(steps: list) -> dict:
    """{body_steps, body_over_ms, tail_steps, tail_wall_ms, tail_over_ms, total_ms} of one row's steps
    ([wall ms, decoding rows, shape, believed ms, kind]; the first step is the prompts' prefill)."""
    full = max(step[1] for step in steps)
    first_drop = next((i for i, step in enumerate(steps) if i > 1 and step[1] < full), len(steps))
    body = [step for step in steps[2 : first_drop - 1] if step[3] is not None]
    tail = steps[first_drop - 1 :]
    return {
        "body_steps": len(body),
        "body_over_ms": sum(step[0] - step[3] for step in body),
        "tail_steps": len(tail),
        "tail_wall_ms": sum(step[0] for step in tail),
        "tail_over_ms": sum(step[0] - (step[3] or 0.0) for step in tail),
        "total_ms": sum(step[0] for step in steps),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("steps", nargs="+", help="closed_batch_rounds.py --steps files")
    a = p.parse_args()
    print(
        f"{'file':<32} {'method':<12} {'batch':>5} {'temp':>4}  body: steps, ms over  tail: steps, ms over"
    )
    for path in a.steps:
        for row in json.loads(open(path).read()):
            if row["method"] == "none":
                continue
            s = tail_split(row["steps"])
            share = s["tail_over_ms"] / s["total_ms"]
            print(
                f"{path[-32:]:<32} {row['method']:<12} {row['batch']:>5} {row['temperature']:>4}  "
                f"{s['body_steps']:>5} {s['body_over_ms']:>7.1f}      {s['tail_steps']:>5} "
                f"{s['tail_over_ms']:>7.1f} ({share:.1%} of {s['total_ms']:.1f} ms)"
            )


if __name__ == "__main__":
    main()
