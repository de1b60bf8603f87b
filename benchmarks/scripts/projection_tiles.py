"""The fused few-row projections (layers/fused_projection.py ``_launch``: the plain and the SwiGLU epilogues) at the
families' decode shapes, over a set of tiles chosen to vary the weight bytes a program keeps in flight
(stages x outputs a sub-tile x BK x 2 bytes): BK up to 1024, 2 to 8 stages, 4 or 8 warps, and programs of half
the default outputs (two an SM). Each time is one call's share of a CUDA graph of 8 calls on 8 distinct weights
(more bytes than L2 holds), launched with programmatic dependent launch as in a decode step: the cost a call adds
to a step. Every tile's output is checked against torch's product first. Batch 1 sweeps every tile; batch 8 runs
the default and batch 1's best three.

    PYTHONPATH=. python3 benchmarks/scripts/projection_tiles.py [OUT.json] [SHAPE ...]

(SHAPE: a key of ``SHAPES``; all of them by default.)"""

from __future__ import annotations

import json
import sys

import torch
import triton
from triton.testing import do_bench

from outpace.layers import fused_projection as fp
from outpace.layers.fused_rows_kernel import PLAIN, SWIGLU
from outpace.layers.sm_count import num_sms

CALLS = 8
# name: (epilogue, outputs, K); a SwiGLU's outputs are its intermediate size (weights of 2 x that many rows)
SHAPES = {
    "qwen3-next out_proj": (PLAIN.value, 2048, 4096),
    "qwen3-next in_proj_qkvz": (PLAIN.value, 12288, 2048),
    "deepseek-v2-lite o_proj": (PLAIN.value, 2048, 2048),
    "deepseek-v2-lite dense down": (PLAIN.value, 2048, 10944),
    "gemma-4 q_proj": (PLAIN.value, 4096, 2816),
    "gemma-4 o_proj": (PLAIN.value, 2816, 4096),
    "llama-8b o_proj": (PLAIN.value, 4096, 4096),
    "llama-8b down_proj": (PLAIN.value, 4096, 14336),
    "llama-8b gate_up": (SWIGLU.value, 14336, 4096),
    "gemma-4 dense gate_up": (SWIGLU.value, 2112, 2816),
    "qwen3.5 gate_up": (SWIGLU.value, 17408, 5120),
    # the raw q/k/v products of Gemma 4's two-kernel q/k/v path: sliding layers, full (k = v) layers
    "gemma-4 sliding qkv": (PLAIN.value, 8192, 2816),
    "gemma-4 full qk": (PLAIN.value, 9216, 2816),
    # the widened zoo Qwen3.5's MTP layers: fc over [embedding | hidden] (bench e2e --family qwen35)
    "qwen3.5-zoo mtp fc": (PLAIN.value, 4096, 8192),
}
# (outputs a program: None the default, "half" half of it; BK; warps; stages; outputs a sub-tile at most)
TILES = [None] + [
    (None, 256, 4, 8, None),
    (None, 512, 4, 3, None),
    (None, 512, 4, 4, None),
    (None, 512, 4, 5, None),
    (None, 512, 8, 4, None),
    (None, 1024, 4, 2, None),
    (None, 1024, 4, 3, None),
    (None, 1024, 8, 3, None),
    (None, 512, 4, 4, 64),
    (None, 512, 4, 3, 64),
    ("half", 256, 4, 6, None),
    ("half", 512, 4, 4, None),
    ("half", 1024, 4, 3, None),
    # Qwen3-Next's in_proj_qkvz, 94 outputs a program: as two sub-tiles of 47 in 64-wide tiles, or one 128-wide
    # sub-tile in shorter K steps over more stages, or more warps (gpu_2026-12-01h call 5)
    (None, 256, 4, 4, 64),
    (None, 256, 4, 6, 64),
    (None, 128, 4, 6, None),
    (None, 128, 8, 6, None),
    (None, 256, 8, 3, None),
    ("half", 256, 4, 4, None),
]


def resolve(tiles, epilogue: int, n_out: int, device: torch.device):
    """``tiles`` as ``_launch`` takes it: "half" made the default outputs a program over two."""
    if tiles is None or tiles[0] != "half":
        return tiles
    outs = max(triton.cdiv(n_out, 2 * num_sms(device)), 8)
    return (outs,) + tiles[1:]


def launch(x, w, out, epilogue: int, n_out: int, tiles) -> None:
    half = n_out if epilogue == SWIGLU.value else 1
    fp._launch(x, w, out, n_out, epilogue, half=half, pdl=True, tiles=tiles)


def reference(x: torch.Tensor, w: torch.Tensor, epilogue: int, n_out: int) -> torch.Tensor:
    y = x.float() @ w.float().T
    if epilogue == SWIGLU.value:
        return torch.nn.functional.silu(y[:, :n_out]) * y[:, n_out:]
    return y


def call_us(x, weights, epilogue: int, n_out: int, tiles) -> float:
    """One call's share of a graph of len(weights) calls (us)."""
    outs = [torch.empty(x.shape[0], n_out, dtype=x.dtype, device=x.device) for _ in weights]

    def calls():
        for w, o in zip(weights, outs):
            launch(x, w, o, epilogue, n_out, tiles)

    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return do_bench(graph.replay, return_mode="median") * 1e3 / len(weights)


def measure(x, weights, epilogue: int, n_out: int, tiles) -> float | None:
    """us a call, None where the tile does not compile (shared memory) or computes wrongly."""
    ref = reference(x, weights[0], epilogue, n_out)
    try:
        out = torch.empty(x.shape[0], n_out, dtype=x.dtype, device=x.device)
        launch(x, weights[0], out, epilogue, n_out, tiles)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            print(f"    {tiles}: wrong output (relative error {err:.3g})", flush=True)
            return None
        return call_us(x, weights, epilogue, n_out, tiles)
    except Exception as e:  # noqa: BLE001 (a tile that does not fit the shared memory)
        print(f"    {tiles}: {type(e).__name__}", flush=True)
        return None


def random_weights(
    epilogue: int, n_out: int, k: int, device: torch.device
) -> tuple[list[torch.Tensor], float]:
    """CALLS distinct bf16 weights of a projection with ``n_out`` outputs over ``k`` inputs, and the GB of one."""
    weight_rows = 2 * n_out if epilogue == SWIGLU.value else n_out
    weights = [
        torch.randn(weight_rows, k, device=device, dtype=torch.bfloat16) * 0.02
        for _ in range(CALLS)
    ]
    return weights, weight_rows * k * 2 / 1e9


def main(out: str | None = None, *names: str) -> None:
    device = torch.device("cuda")
    rows = []
    for name in names or SHAPES:
        epilogue, n_out, k = SHAPES[name]
        weights, gb = random_weights(epilogue, n_out, k, device)
        for m in (1, 8):
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            if m == 1:
                candidates = TILES
            else:
                ranked = sorted((t for t in rows[-1]["us"].items() if t[1]), key=lambda t: t[1])
                candidates = [None] + [TILES[int(i)] for i, _ in ranked[:4] if i != "0"][:3]
            times = {}
            for tiles in candidates:
                times[str(TILES.index(tiles))] = measure(
                    x, weights, epilogue, n_out, resolve(tiles, epilogue, n_out, device)
                )
            ok = {i: t for i, t in times.items() if t is not None}
            best = min(ok, key=ok.get)
            default = times["0"]
            print(
                f"{name:>28} m={m:>2} default {default:6.1f} us {gb / default * 1e3:5.2f} TB/s | best "
                f"{TILES[int(best)]} {ok[best]:6.1f} us {gb / ok[best] * 1e3:5.2f} TB/s",
                flush=True,
            )
            rows.append({"shape": name, "outputs": n_out, "k": k, "rows": m, "us": times})
    if out:
        with open(out, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "tiles": TILES, "rows": rows},
                f,
                separators=(",", ":"),
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
