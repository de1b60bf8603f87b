"""The fused projections' plain kernel (layers/fused_projection.py ``project_rows``) at the families' few-row
projection shapes (benchmarks/scripts/projection_shapes.py's), for a sweep of tiles: outputs a sub-tile at most
(the default 32; a program's outputs are computed one sub-tile after another, each a new software pipeline over
K), BK, stages. Each time is one call's share of a CUDA graph of 8 calls on 8 distinct weights (more bytes than
L2 holds), launched with programmatic dependent launch as in a decode step: the cost a call adds to a step.
``PYTHONPATH=. python3 benchmarks/scripts/plain_tiles.py [OUT.json]``."""

from __future__ import annotations

import itertools
import json
import sys

import torch
from triton.testing import do_bench

from outpace.layers import fused_projection as fp

CALLS = 8
SHAPES = {
    "qwen3-next in_proj_qkvz": (12288, 2048),
    "qwen3-next out_proj": (2048, 4096),
    "deepseek-v3 q_a_proj": (1536, 7168),
    "deepseek-v3 o_proj": (7168, 16384),
    "deepseek-v2-lite o_proj": (2048, 2048),
    "gemma-4 q_proj": (4096, 2816),
    "gemma-4 o_proj": (2816, 4096),
    "llama-8b o_proj": (4096, 4096),
}
CONFIGS = [None] + list(itertools.product((32, 64, 128), (64, 128, 256), (3, 4, 6)))


def call_us(x: torch.Tensor, weights: list[torch.Tensor], tiles) -> float:
    """One call's share of a graph of len(weights) calls (us)."""
    outs = [torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device) for w in weights]

    def calls():
        for w, o in zip(weights, outs):
            fp._launch(x, w, o, w.shape[0], fp._PLAIN.value, pdl=True, tiles=tiles)

    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return do_bench(graph.replay, return_mode="median") * 1e3 / len(weights)


def main(out: str | None = None) -> None:
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(CALLS)
        ]
        gb = n * k * 2 / 1e9
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, weights[0]).float()
            times = {}
            for cfg in CONFIGS:
                tiles = None if cfg is None else (None, cfg[1], 4, cfg[2], cfg[0])
                try:
                    out_ = (
                        fp.project_rows(x, weights[0])
                        if cfg is None
                        else torch.empty_like(ref, dtype=x.dtype)
                    )
                    if cfg is not None:
                        fp._launch(x, weights[0], out_, n, fp._PLAIN.value, tiles=tiles)
                    err = ((out_.float() - ref).norm() / ref.norm()).item()
                    assert err < 1e-2, err
                    times[str(cfg)] = call_us(x, weights, tiles)
                except Exception as e:  # noqa: BLE001 (a tile that does not fit the shared memory)
                    times[str(cfg)] = None
                    print(f"  {name} m={m} {cfg}: {type(e).__name__}", flush=True)
            ok = {c: t for c, t in times.items() if t is not None}
            best = min(ok, key=ok.get)
            default = times["None"]
            print(
                f"{name:>26} m={m:>2} default {default:6.1f} us {gb / default * 1e3:5.2f} TB/s | best {best} "
                f"{ok[best]:6.1f} us {gb / ok[best] * 1e3:5.2f} TB/s",
                flush=True,
            )
            rows.append({"shape": name, "n": n, "k": k, "rows": m, "us": times})
    if out:
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
