"""Few-row matrix products at the 8B decode shapes: cuBLAS (F.linear) against layers/skinny_gemm.py,
GPU time of one call captured in a CUDA graph, L2 flushed (``python -m outpace.bench.skinny``)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from outpace.bench.graph_timing import captured_call_us

SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


def run(rows=(1, 8)) -> None:
    from outpace.layers.skinny_gemm import skinny_linear

    configs = list(itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 5)))
    print(
        f"{'shape':>8} {'M':>3} {'cublas us':>10} {'TB/s':>6} {'best skinny us':>15} {'TB/s':>6}  config"
    )
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w)
            cublas = captured_call_us(lambda: F.linear(x, w))
            best = (float("inf"), None)
            for bn, bk, warps, stages in configs:
                try:
                    out = skinny_linear(x, w, bn, bk, warps, stages)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    if err > 1e-2:
                        print(f"  wrong result {err} for {(bn, bk, warps, stages)}")
                        continue
                    t = captured_call_us(lambda: skinny_linear(x, w, bn, bk, warps, stages))
                    best = min(best, (t, (bn, bk, warps, stages)))
                except Exception as e:  # a config that does not compile (shared memory, registers)
                    print(f"  {type(e).__name__} for {(bn, bk, warps, stages)}")
            gb = n * k * 2 / 1e9
            print(
                f"{name:>8} {m:>3} {cublas:>10.1f} {gb / cublas * 1e3:>6.2f} {best[0]:>15.1f} "
                f"{gb / best[0] * 1e3:>6.2f}  {best[1]}"
            )


if __name__ == "__main__":
    run()
