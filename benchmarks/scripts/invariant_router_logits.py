"""The router logits in batch-invariant mode (``router_logits``' per-token sums at every count): for each shape of
routing_timings.py and 1, 2, 8, 32, 65 tokens, the captured call's microseconds in the mode and on the normal
path (the per-token sums up to 16 tokens, the tl.dot path beyond), and whether every token's logits (the splits
summed in order) have in the mode the bits they have among 65 tokens. Prints a table and writes
OUT/invariant_router_logits.json. (gpu_2026-12-03e call 1 ran its first version, which timed the mode's former
tl.dot path at K steps of 64, 128 and 256.)

    PYTHONPATH=. python3 benchmarks/scripts/invariant_router_logits.py OUT [SHAPE ...]"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from routing_timings import CALLS, SHAPES

from outpace.attention.context import forward_settings
from outpace.bench.graph_timing import graph_call_us
from outpace.layers import moe_routing_kernel as kernels

TOKENS = (1, 2, 8, 32, 65)


def logits(partial: torch.Tensor) -> torch.Tensor:
    """[splits, n, row] partial sums -> [n, row], the splits added in order (one fixed order on any n)."""
    total = partial[0].clone()
    for part in partial[1:]:
        total += part
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("shapes", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.shapes:
        hidden, routing, _, gate, gemma = SHAPES[name]
        g = torch.Generator("cuda").manual_seed(0)
        weight = torch.randn(routing.num_experts + gate, hidden, device="cuda", generator=g)
        weight = (weight * hidden**-0.5).to(torch.bfloat16 if gemma else torch.float32)
        x = torch.randn(max(TOKENS), hidden, device="cuda", generator=g).to(torch.bfloat16)
        with forward_settings(True):
            every = logits(kernels.router_logits(x, weight))
        for n in TOKENS:
            row = {"shape": name, "tokens": n}
            row["normal_us"] = graph_call_us(
                lambda n=n: kernels.router_logits(x[:n], weight), CALLS
            )
            with forward_settings(True):
                row["invariant_us"] = graph_call_us(
                    lambda n=n: kernels.router_logits(x[:n], weight), CALLS
                )
                row["bits_kept"] = torch.equal(
                    logits(kernels.router_logits(x[:n], weight)), every[:n]
                )
            rows.append(row)
            print(
                f"{name:16s} {n:3d} tokens  normal {row['normal_us']:6.2f} us  "
                f"invariant {row['invariant_us']:6.2f} us{'' if row['bits_kept'] else ' (bits differ)'}",
                flush=True,
            )
    (args.out / "invariant_router_logits.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
