"""The most MTP can speed a mixture up at batch 1 when both plain decoding and verification run at the bandwidth
floor: tau x floor(1 token) / floor(1 + drafts tokens), the draft passes themselves counted as free (so an upper
bound). Each verified token reads its own top_k experts (bench/families.py ``distinct_experts``: independent
uniform routing, as the benchmarks' random weights route), so on a model whose routed experts are most of its
bytes a verify of 1 + d tokens reads nearly (1 + d) times a decode step's experts. Reads a families.json written
by ``python -m outpace.bench.families`` (its ``bytes``: the shape's StepBudget) and the acceptance to assume.

    PYTHONPATH=. python3 benchmarks/scripts/mtp_floor_bound.py FAMILIES_JSON SHAPE TAU:DRAFTS ...

e.g. benchmarks/results/families/quantized_fp8_2026-11-29c/families.json qwen3-next-80b 2.25:2 (the widened zoo
Qwen3.5 MTP's tau at two drafts, gpu_2026-12-02 call 5)."""

from __future__ import annotations

import json
import sys

from outpace.bench.families import CONTEXT, StepBudget, step_bytes


def bound(budget: StepBudget, tau: float, drafts: int) -> tuple[float, float, float]:
    """(plain step bytes, verify bytes of 1 + drafts tokens, tau x their ratio) at batch 1, CONTEXT cached."""
    plain = step_bytes(budget, 1, CONTEXT)
    verify = step_bytes(budget, 1, CONTEXT, tokens=1 + drafts)
    return plain, verify, tau * plain / verify


def main(path: str, shape: str, *acceptances: str) -> None:
    data = json.load(open(path))
    shapes = data.get("shapes", data)
    raw = dict(shapes[shape]["bytes"])
    raw["kv_rows"] = tuple(tuple(r) for r in raw["kv_rows"])
    budget = StepBudget(**raw)
    for item in acceptances:
        tau, drafts = float(item.split(":")[0]), int(item.split(":")[1])
        plain, verify, most = bound(budget, tau, drafts)
        print(
            f"{shape}: plain {plain / 1e9:.3f} GB a step, verify of {1 + drafts} tokens "
            f"{verify / 1e9:.3f} GB ({verify / plain:.2f}x); at tau {tau:.2f} MTP at most {most:.2f}x"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
