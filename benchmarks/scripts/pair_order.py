"""The grouped experts over block-FP8 stacks at one and two tokens (layers/moe_kernels.py), each (token, slot) pair
a program row of its own (PAIRS APART: block FP8's ``pairs_apart_max_tokens`` 4) or the layout's blocks (0), over
gate and up stacks of their own (Step-3.5's) or packed into one (DeepSeek's and Qwen3-Next's stacked modules), each
token's experts as routed or sorted by index (``ORDERS``): what makes pairs apart slower on the Step-3.5 slice
(gpu_2026-12-04c call 2: its one-token gate/up kernel 33.4 us apart against 25.3 in the layout) and faster on the
Qwen3-Next slice (call 4). One GPU; a call's microseconds are the median replay of a CUDA graph of ``CALLS`` calls
over distinct random routings (their experts mostly not in L2), divided by ``CALLS``.

    PYTHONPATH=. python3 benchmarks/scripts/pair_order.py OUT.json"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from outpace.bench.graph_timing import captured_call_us
from outpace.bench.quant_kernels import random_fp8
from outpace.layers import moe_kernels as mk
from outpace.layers.quant.moe_quant_kernels import ExpertScales

CALLS = 8
ORDERS = ("routed",)  # each token's experts as routed; "sorted": by index (call 3: no difference)
# name -> (experts, hidden, inter, top_k): the families' block-FP8 expert stacks (gate, up and down apart)
SHAPES = {
    "step-3.5-flash": (288, 4096, 1280, 8),
    "deepseek-v2-lite": (64, 2048, 1408, 6),
    "qwen3-next-80b": (512, 2048, 512, 10),
}


def stacks(
    experts: int, hidden: int, inter: int, packed: bool
) -> tuple[list[torch.Tensor], ExpertScales]:
    """(gate, up, down) random fp8 stacks and their scales: gate and up stacks of their own (Step-3.5's), or
    ``packed`` halves of one [experts, 2 * inter, hidden] stack (DeepSeek's and Qwen3-Next's stacked modules)."""

    def scale(*shape):
        return torch.rand(*shape, device="cuda") * 1e-3

    nb, hb = -(-inter // 128), -(-hidden // 128)
    down, down_s = random_fp8((experts, hidden, inter)), scale(experts, hb, nb)
    if packed:
        gate_up, gate_up_s = random_fp8((experts, 2 * inter, hidden)), scale(experts, 2 * nb, hb)
        return [gate_up[:, :inter], gate_up[:, inter:], down], ExpertScales(
            "fp8_block", (128, 128), gate_up_s[:, :nb], gate_up_s[:, nb:], down_s
        )
    gate, up = random_fp8((experts, inter, hidden)), random_fp8((experts, inter, hidden))
    return [gate, up, down], ExpertScales(
        "fp8_block", (128, 128), scale(experts, nb, hb), scale(experts, nb, hb), down_s
    )


def shape_rows(name: str, gen: torch.Generator) -> list[dict]:
    experts, hidden, inter, top_k = SHAPES[name]
    rows = []
    for packed, tokens in itertools.product((False, True), (1, 2)):
        (gate, up, down), scales = stacks(experts, hidden, inter, packed)
        routings = [
            torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
            for _ in range(CALLS)
        ]
        weights = torch.rand(tokens, top_k, generator=gen).cuda()
        x = (torch.randn(tokens, hidden, generator=gen) * 0.1).to(torch.bfloat16).cuda()
        for order in ORDERS:
            ids = [(r.sort(dim=1).values if order == "sorted" else r).cuda() for r in routings]
            layouts = [mk.align(i, experts) for i in ids]  # (the routing kernel's, written before)
            for apart in (4, 0):
                mk.pairs_apart_max_tokens = {"fp8_block": apart}

                def calls():
                    for i, layout in zip(ids, layouts):
                        mk.grouped_experts(
                            x, weights, i, gate, up, down, quant=scales, layout=layout
                        )

                us = captured_call_us(calls) / CALLS
                rows.append(
                    dict(shape=name, packed=packed, tokens=tokens, order=order, apart=apart, us=us)
                )
                print(
                    f"{name:>18} packed={packed:d} {tokens} {order:>6} apart={apart} {us:7.1f} us",
                    flush=True,
                )
    return rows


def main(out: str) -> None:
    gen = torch.Generator().manual_seed(0)
    shipped = mk.pairs_apart_max_tokens
    try:
        rows = [row for name in SHAPES for row in shape_rows(name, gen)]
    finally:
        mk.pairs_apart_max_tokens = shipped
    Path(out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
