"""The router logits' two paths (layers/moe_routing_kernel.py ``router_logits``): for each shape of
routing_timings.py and token counts from 1 to 4096, the captured call's microseconds with the per-token sums
(each 16-token block's splits as for one block) and with the ``tl.dot`` path in IEEE float32 and in tf32x3
(``dot_precision``, with its largest difference from the IEEE path), whichever ``per_token_max`` would
choose; the same call in batch-invariant mode; and whether every token's logits (the splits summed in order)
have in the mode the bits they have among all the counts' tokens. Prints a table and writes
OUT/router_logit_paths.json: the count up to which the per-token sums win is ``per_token_max``'s measure.
(gpu_2026-12-03e ran this file's first form, invariant_router_logits.py: the mode against the normal path.)

    cd benchmarks/scripts && PYTHONPATH=../..:. python3 router_logit_paths.py OUT [SHAPE ...]"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from routing_timings import CALLS, SHAPES

from outpace.attention.context import forward_settings
from outpace.bench.graph_timing import graph_call_us
from outpace.layers import moe_routing_kernel as kernels

TOKENS = (1, 2, 8, 16, 17, 32, 64, 65, 128, 256, 1024, 4096)
# column -> (per_token_max that forces the path, the tl.dot path's precision)
PATHS = {"sums_us": (1 << 30, "ieee"), "dot_us": (0, "ieee"), "dot_tf32x3_us": (0, "tf32x3")}


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
    shipped = kernels.per_token_max, kernels.dot_precision
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
            try:
                for column, (limit, precision) in PATHS.items():
                    kernels.per_token_max, kernels.dot_precision = limit, precision
                    row[column] = graph_call_us(
                        lambda n=n: kernels.router_logits(x[:n], weight), CALLS
                    )
                    if column == "dot_tf32x3_us":  # its accuracy against the IEEE dot's
                        kernels.dot_precision = "ieee"
                        ieee = logits(kernels.router_logits(x[:n], weight))
                        kernels.dot_precision = precision
                        tf32x3 = logits(kernels.router_logits(x[:n], weight))
                        row["tf32x3_max_abs_diff"] = (tf32x3 - ieee).abs().max().item()
            finally:
                kernels.per_token_max, kernels.dot_precision = shipped
            with forward_settings(True):
                row["invariant_us"] = graph_call_us(
                    lambda n=n: kernels.router_logits(x[:n], weight), CALLS
                )
                row["bits_kept"] = torch.equal(
                    logits(kernels.router_logits(x[:n], weight)), every[:n]
                )
            rows.append(row)
            print(
                f"{name:16s} {n:4d} tokens  sums {row['sums_us']:8.2f} us  dot {row['dot_us']:8.2f} us  "
                f"tf32x3 {row['dot_tf32x3_us']:8.2f} us (max |diff| {row['tf32x3_max_abs_diff']:.1e})  "
                f"invariant {row['invariant_us']:8.2f} us{'' if row['bits_kept'] else ' (bits differ)'}",
                flush=True,
            )
    (args.out / "router_logit_paths.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
