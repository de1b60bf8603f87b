"""The grouped-expert kernels (layers/grouped_experts.py over layers/moe_kernels.py) over blocks of a few tokens, at the MoE
families' expert shapes, for a set of gate/up and down tiles (``few_token_gate_up`` / ``few_token_down``:
BLOCK_N, BLOCK_K, warps, stages): each kernel's candidates with the other kernel at its default. Each time is
one call's share of a CUDA graph of 4 calls on 4 distinct layers' expert stacks (random ids, distinct experts a
token, the block layout written before capture), so the bytes come from memory; the floor is the distinct
experts' bytes over 4.8 TB/s. Every tile's output is checked against the default tiles' first.

    PYTHONPATH=. python3 benchmarks/scripts/moe_tiles.py [OUT.json]"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

from outpace.layers import moe_kernels as mk
from outpace.layers.expert_blocks import align
from outpace.layers.grouped_experts import grouped_experts

LAYERS = 4
BANDWIDTH = 4.8e12  # the H200's HBM3e, bytes/s
# name: (experts, top_k, shared experts, hidden, intermediate, activation), as bench/family_shapes.py's configs
SHAPES = {
    "deepseek-v2-lite": (64, 6, 2, 2048, 1408, "silu"),
    "gemma-4-26b-a4b": (128, 8, 0, 2816, 704, "gelu_tanh"),
    "qwen3-next-80b": (512, 10, 1, 2048, 512, "silu"),
}
GATE_UP = [
    mk.few_token_gate_up,
    (32, 256, 4, 3),
    (32, 256, 8, 4),
    (64, 128, 4, 4),
    (64, 128, 8, 4),
    (16, 256, 4, 4),
    (32, 128, 4, 6),
    (16, 512, 4, 3),
]
DOWN = [
    mk.few_token_down,
    (64, 256, 8, 3),
    (32, 256, 4, 4),
    (128, 128, 8, 3),
    (64, 128, 4, 6),
    (32, 512, 4, 3),
    (128, 64, 4, 4),
]


def stacks(experts: int, shared: int, hidden: int, inter: int, device) -> dict:
    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

    layer = {"gate": rand(experts, inter, hidden), "up": rand(experts, inter, hidden)}
    layer["down"] = rand(experts, hidden, inter)
    if shared:
        layer["shared"] = (
            rand(shared, inter, hidden),
            rand(shared, inter, hidden),
            rand(shared, hidden, inter),
        )
    return layer


def main(out: str | None = None) -> None:
    device = torch.device("cuda")
    shipped = mk.few_token_gate_up, mk.few_token_down
    rows = []
    for name, (experts, top_k, shared, hidden, inter, act) in SHAPES.items():
        layers = [stacks(experts, shared, hidden, inter, device) for _ in range(LAYERS)]
        for tokens in (1, 8):
            gen = torch.Generator(device="cpu").manual_seed(tokens)
            ids = [
                torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
                .to(device)
                .int()
                for _ in range(LAYERS)
            ]
            weights = torch.rand(tokens, top_k + shared, device=device)
            x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
            layouts = [align(i, experts, shared) for i in ids]
            distinct = sum(len(set(i.flatten().tolist())) + shared for i in ids) / LAYERS
            floor_us = distinct * 3 * inter * hidden * 2 / BANDWIDTH * 1e6

            def call(i: int) -> torch.Tensor:
                w = layers[i]
                return grouped_experts(
                    x, weights, ids[i], w["gate"], w["up"], w["down"], activation=act,
                    shared=w.get("shared"), layout=layouts[i],
                )  # fmt: skip

            reference = call(0).float()
            times = {}
            for kernel, candidates in (("gate_up", GATE_UP), ("down", DOWN)):
                for tiles in candidates:
                    mk.few_token_gate_up, mk.few_token_down = shipped
                    if kernel == "gate_up":
                        mk.few_token_gate_up = tiles
                    else:
                        mk.few_token_down = tiles
                    key = f"{kernel} {tiles}"
                    try:
                        err = ((call(0).float() - reference).norm() / reference.norm()).item()
                        if not err < 1e-2:
                            print(f"  {name} {tokens} {key}: wrong (error {err:.3g})", flush=True)
                            continue
                        call(1)
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            for i in range(LAYERS):
                                call(i)
                        times[key] = do_bench(graph.replay, return_mode="median") * 1e3 / LAYERS
                    except Exception as e:  # noqa: BLE001 (a tile beyond the shared memory)
                        print(f"  {name} {tokens} {key}: {type(e).__name__}", flush=True)
            mk.few_token_gate_up, mk.few_token_down = shipped
            default = times[f"gate_up {shipped[0]}"]
            for kernel in ("gate_up", "down"):
                mine = {k: t for k, t in times.items() if k.startswith(kernel)}
                best = min(mine, key=mine.get)
                print(
                    f"{name:>18} tokens {tokens} floor {floor_us:5.1f} us | default {default:6.1f} us | "
                    f"best {best} {mine[best]:6.1f} us",
                    flush=True,
                )
            rows.append({"shape": name, "tokens": tokens, "floor_us": floor_us, "us": times})
    if out:
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
