"""The router logits in batch-invariant mode (always ``router_logits``' tl.dot path) at other K steps
(``moe_routing_kernel._DOT_BLOCK_K``): for each shape of routing_timings.py, each step and 1, 2, 8, 32, 65 tokens,
the captured call's microseconds, and whether every token's logits (the splits summed in order) have the bits
they have among 65 tokens; the normal path's time beside (the few-token path up to 16 tokens). Prints a table and
writes OUT/invariant_router_logits.json.

    PYTHONPATH=. python3 benchmarks/scripts/invariant_router_logits.py OUT [SHAPE ...] [--steps 64 128 256]"""

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
    parser.add_argument("--steps", type=int, nargs="+", default=[64, 128, 256])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shipped, rows = kernels._DOT_BLOCK_K, []
    for name in args.shapes:
        hidden, routing, _, gate, gemma = SHAPES[name]
        g = torch.Generator("cuda").manual_seed(0)
        weight = torch.randn(routing.num_experts + gate, hidden, device="cuda", generator=g)
        weight = (weight * hidden**-0.5).to(torch.bfloat16 if gemma else torch.float32)
        x = torch.randn(max(TOKENS), hidden, device="cuda", generator=g).to(torch.bfloat16)
        for n in TOKENS:
            row = {"shape": name, "tokens": n}
            row["normal_us"] = graph_call_us(
                lambda n=n: kernels.router_logits(x[:n], weight), CALLS
            )
            for step in args.steps:
                kernels._DOT_BLOCK_K = step
                with forward_settings(True):
                    every = logits(kernels.router_logits(x, weight))
                    rows_n = logits(kernels.router_logits(x[:n], weight))
                    row[f"invariant_us_{step}"] = graph_call_us(
                        lambda n=n: kernels.router_logits(x[:n], weight), CALLS
                    )
                row[f"bits_kept_{step}"] = torch.equal(rows_n, every[:n])
            kernels._DOT_BLOCK_K = shipped
            rows.append(row)
            steps = "  ".join(
                f"K {s}: {row[f'invariant_us_{s}']:6.2f} us{'' if row[f'bits_kept_{s}'] else ' (bits differ)'}"
                for s in args.steps
            )
            print(
                f"{name:16s} {n:3d} tokens  normal {row['normal_us']:6.2f} us  invariant {steps}",
                flush=True,
            )
    (args.out / "invariant_router_logits.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
