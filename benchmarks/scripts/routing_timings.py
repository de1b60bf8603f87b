"""What one MoE layer's routing costs on the GPU, launch by launch: the router matvec (``router_logits``) and
the route kernel (``select_experts``, with the block layout as the decode path asks for it) at the routings
of the seed families' public shapes (layers/router.py ``Routing``, values from bench/family_shapes.py), at 1, 2,
8, 32, 64, 96 and 128 tokens (decode batches and verify widths: a program per token, the last writing the layout;
past 64 from the token masks' two words) and at 129 (beyond FUSED_LAYOUT_TOKENS: a program per block of tokens,
then ``align``'s launch, timed with it),
each timed as 50 calls captured in one CUDA graph; the matvec also aiming for more programs and with the tl.dot
path in tf32x3 (``MATVEC_VARIANTS``); the route kernel also with other warp counts
(``moe_routing_kernel.token_route_warps`` up to 128 tokens, ``ROUTE_WARPS`` beyond), and without a correction bias
with its top_k by rounds of max and by one partial sort (``sorted_top_k_experts``, the shipped warps; their ids and
weights checked equal). Each captured route is
first checked against the eager call and ``align``'s layout (a wrong ticket or a race shows there). Prints
microseconds per call and the matvec's GB/s over its weight; writes OUT/routing_timings.json.
``PYTHONPATH=. python3 benchmarks/scripts/routing_timings.py OUT [SHAPE ...]`` (by default every shape)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from outpace.bench.graph_timing import graph_call_us
from outpace.layers import moe_routing_kernel as kernels
from outpace.layers.expert_blocks import align
from outpace.layers.router import Routing

CALLS = 50
WARPS = (1, 2, 4, 8)
TOKENS = (1, 2, 8, 32, 64, 96, 128, 129)
# the matvec also with (programs it aims for at every token count, the tl.dot path's precision):
# moe_routing_kernel._LOGIT_PROGRAMS (up to 64 tokens), many_token_logit_programs (past 64) and dot_precision
MATVEC_VARIANTS = ((264, "ieee"), (1056, "ieee"), (264, "tf32x3"), (1056, "tf32x3"))
# name -> (hidden, Routing, shared slots, shared gate, Gemma 4's input norm and expert scale), as
# bench/family_shapes.py's configs route
SHAPES = {
    "deepseek-v2-lite": (2048, Routing(64, 6, "softmax"), 0, False, False),
    "deepseek-v3": (
        7168,
        Routing(256, 8, "sigmoid", 8, 4, "top2_sum", True, True, 2.5),
        0,
        False,
        False,
    ),
    "qwen3-next-80b": (2048, Routing(512, 10, "softmax", normalize=True), 1, True, False),
    "step-3.5-flash": (
        4096,
        Routing(288, 8, "sigmoid", correction_bias=True, normalize=True, scaling=3.0),
        1,
        False,
        False,
    ),
    # models/gemma4.py Gemma4Router: the norm folded in (RouterInputNorm), per_expert_scale on the weights
    "gemma-4-26b-a4b": (2816, Routing(128, 8, "softmax", normalize=True), 0, False, True),
}


def check_captured(route, experts: int, shared: int) -> None:
    """One captured call of ``route`` replayed: the eager call's ids and weights, align's layout."""
    route()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids, layout = route()
    graph.replay()
    eager_weights, eager_ids, _ = route()
    expected = align(ids, experts, shared)
    torch.cuda.synchronize()
    assert torch.equal(ids, eager_ids) and torch.equal(weights, eager_weights)
    assert torch.equal(layout.sorted_pairs, expected.sorted_pairs)
    assert torch.equal(layout.block_expert, expected.block_expert)


def main(out: Path, names: list[str]) -> None:
    unknown = set(names) - set(SHAPES)
    if unknown:
        raise SystemExit(f"unknown shape(s) {sorted(unknown)}: choose from {', '.join(SHAPES)}")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    defaults = kernels.ROUTE_WARPS, kernels.token_route_warps
    for name in names or SHAPES:
        hidden, routing, shared, gate, gemma = SHAPES[name]
        g = torch.Generator("cuda").manual_seed(0)
        weight = (
            torch.randn(routing.num_experts + gate, hidden, device="cuda", generator=g)
            * hidden**-0.5
        )  # [experts (+ the shared gate), hidden] float32
        bias = torch.randn(routing.num_experts, device="cuda", generator=g) * 0.01
        bias = bias if routing.correction_bias else None
        norm = scale = None
        if gemma:  # (bf16 router weight and scales, as the model holds them)
            weight = weight.to(torch.bfloat16)
            column_scale = torch.rand(hidden, device="cuda", generator=g).to(torch.bfloat16) + 0.5
            norm = kernels.RouterInputNorm(column_scale, 1e-6, hidden**-0.5)
            scale = torch.rand(routing.num_experts, device="cuda", generator=g).to(torch.bfloat16)
        column = None if norm is None else norm.column_scale
        for n in TOKENS:
            x = torch.randn(n, hidden, device="cuda", generator=g).to(torch.bfloat16)
            partial = kernels.router_logits(x, weight, column)
            matvec = graph_call_us(lambda: kernels.router_logits(x, weight, column), CALLS)
            row = {"shape": name, "tokens": n, "matvec_us": matvec, "splits": partial.shape[0]}
            row["matvec_gb_per_s"] = weight.numel() * weight.element_size() / matvec / 1e3
            for programs, precision in MATVEC_VARIANTS:  # (their sums over splits checked close)
                shipped = (
                    kernels._LOGIT_PROGRAMS,
                    kernels.many_token_logit_programs,
                    kernels.dot_precision,
                )
                kernels._LOGIT_PROGRAMS = kernels.many_token_logit_programs = programs
                kernels.dot_precision = precision
                other = kernels.router_logits(x, weight, column).sum(0)
                torch.testing.assert_close(other, partial.sum(0), rtol=1e-4, atol=1e-4)
                row[f"matvec_us_{programs}_{precision}"] = graph_call_us(
                    lambda: kernels.router_logits(x, weight, column), CALLS
                )
                (
                    kernels._LOGIT_PROGRAMS,
                    kernels.many_token_logit_programs,
                    kernels.dot_precision,
                ) = shipped

            def route():
                return kernels.select_experts(
                    partial, bias, routing, shared, True, norm, scale, shared_gate=gate
                )

            for warps in WARPS:
                kernels.ROUTE_WARPS = warps
                kernels.token_route_warps = lambda block_e, tokens=1, w=warps: w
                check_captured(route, routing.num_experts, shared)
                row[f"route_us_{warps}_warps"] = graph_call_us(route, CALLS)
            kernels.ROUTE_WARPS, kernels.token_route_warps = defaults
            if (
                bias is None
            ):  # the shipped warps, the top_k by rounds of max and by one sort: the same bits
                shipped = kernels.sorted_top_k_experts
                kernels.sorted_top_k_experts = None
                rounds = route()
                row["route_us_rounds"] = graph_call_us(route, CALLS)
                kernels.sorted_top_k_experts = 1
                check_captured(route, routing.num_experts, shared)
                assert all(torch.equal(a, b) for a, b in zip(route()[:2], rounds[:2]))
                row["route_us_sorted"] = graph_call_us(route, CALLS)
                kernels.sorted_top_k_experts = shipped
            rows.append(row)
            routes = "  ".join(f"{w}w {row[f'route_us_{w}_warps']:6.2f}" for w in WARPS)
            if "route_us_sorted" in row:
                routes += (
                    f"  rounds {row['route_us_rounds']:6.2f}  sorted {row['route_us_sorted']:6.2f}"
                )
            variants = "  ".join(
                f"{p}/{d} {row[f'matvec_us_{p}_{d}']:6.2f}" for p, d in MATVEC_VARIANTS
            )
            print(
                f"{name:16s} {n:3d} tokens  matvec {matvec:6.2f} us ({row['matvec_gb_per_s']:6.0f} GB/s,"
                f" {row['splits']} splits; {variants})  route: {routes}",
                flush=True,
            )
    (out / "routing_timings.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
