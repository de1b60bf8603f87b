"""What one MoE layer's routing costs on the GPU, launch by launch: the router matvec (``router_logits``) and
the route kernel (``select_experts``, with the block layout as the decode path asks for it) at the routings
of the seed families' public shapes (layers/moe.py ``Routing``, values from bench/family_shapes.py), 1, 8
and 32 tokens, each timed as 50 calls captured in one CUDA graph; the route kernel also with other warp
counts (``moe_routing_kernel.ROUTE_WARPS`` and ``ONE_TOKEN_ROUTE_WARPS``). Prints microseconds per call and the matvec's GB/s over its
float32 weight; writes OUT/routing_timings.json.
``PYTHONPATH=. python3 benchmarks/scripts/routing_timings.py OUT``"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from outpace.layers import moe_routing_kernel as kernels
from outpace.layers.moe import Routing

CALLS = 50
WARPS = (1, 2, 4, 8)
# name -> (hidden, Routing, shared slots, shared gate), as bench/family_shapes.py's configs route
SHAPES = {
    "deepseek-v2-lite": (2048, Routing(64, 6, "softmax"), 0, False),
    "deepseek-v3": (7168, Routing(256, 8, "sigmoid", 8, 4, "top2_sum", True, True, 2.5), 0, False),
    "qwen3-next-80b": (2048, Routing(512, 10, "softmax", normalize=True), 1, True),
    "step-3.5-flash": (
        4096,
        Routing(288, 8, "sigmoid", correction_bias=True, normalize=True, scaling=3.0),
        1,
        False,
    ),
}


def graph_time(fn) -> float:
    """Microseconds per call of ``fn``, CALLS of them captured in one graph and replayed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * CALLS)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (hidden, routing, shared, gate) in SHAPES.items():
        g = torch.Generator("cuda").manual_seed(0)
        weight = (
            torch.randn(routing.num_experts + gate, hidden, device="cuda", generator=g)
            * hidden**-0.5
        )  # [experts (+ the shared gate), hidden] float32
        bias = torch.randn(routing.num_experts, device="cuda", generator=g) * 0.01
        bias = bias if routing.correction_bias else None
        for n in (1, 8, 32):
            x = torch.randn(n, hidden, device="cuda", generator=g).to(torch.bfloat16)
            partial = kernels.router_logits(x, weight)
            matvec = graph_time(lambda: kernels.router_logits(x, weight))
            row = {"shape": name, "tokens": n, "matvec_us": matvec, "splits": partial.shape[0]}
            row["matvec_gb_per_s"] = weight.numel() * 4 / matvec / 1e3
            for warps in WARPS:
                kernels.ROUTE_WARPS = kernels.ONE_TOKEN_ROUTE_WARPS = warps
                row[f"route_us_{warps}_warps"] = graph_time(
                    lambda: kernels.select_experts(
                        partial, bias, routing, shared, layout=True, shared_gate=gate
                    )
                )
            kernels.ROUTE_WARPS, kernels.ONE_TOKEN_ROUTE_WARPS = 8, 1
            rows.append(row)
            routes = "  ".join(f"{w}w {row[f'route_us_{w}_warps']:6.2f}" for w in WARPS)
            print(
                f"{name:16s} {n:3d} tokens  matvec {matvec:6.2f} us ({row['matvec_gb_per_s']:6.0f} GB/s,"
                f" {row['splits']} splits)  route: {routes}",
                flush=True,
            )
    (out / "routing_timings.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
