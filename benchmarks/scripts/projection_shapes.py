"""The plain few-row projections of the seed families (the ones layers/linear.py ``project`` serves, not folded
into a neighbour): cuBLAS, the skinny kernel (layers/skinny_gemm.py) and the fused projections' plain kernel
(layers/fused_projection.py ``project_rows``), GPU time of one call captured in a CUDA graph with L2 flushed
(bench/graph_timing.py ``captured_call_us``), at 1, 8 and 16 rows. Shapes (outputs, inputs) from the configs of
bench/family_shapes.py. ``PYTHONPATH=. python3 benchmarks/scripts/projection_shapes.py [OUT.json]``."""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from outpace.bench.graph_timing import captured_call_us
from outpace.layers.fused_projection import project_rows
from outpace.layers.skinny_gemm import skinny_linear

SHAPES = {
    # Qwen3-Next-80B-A3B (hidden 2048; 16 key / 32 value heads of 128; 16 q heads of 256, 2 kv)
    "qwen3-next in_proj_qkvz": (12288, 2048),
    "qwen3-next out_proj": (2048, 4096),
    "qwen3-next attn q+gate": (8192, 2048),
    "qwen3-next attn o_proj": (2048, 4096),
    # DeepSeek-V3 (hidden 7168; q_lora 1536, kv_lora 512 + rope 64; 128 heads of 128/192)
    "deepseek-v3 q_a_proj": (1536, 7168),
    "deepseek-v3 q_b_proj": (24576, 1536),
    "deepseek-v3 kv_a_proj": (576, 7168),
    "deepseek-v3 o_proj": (7168, 16384),
    # DeepSeek-V2-Lite (hidden 2048; 16 heads)
    "deepseek-v2-lite q_proj": (3072, 2048),
    "deepseek-v2-lite kv_a_proj": (576, 2048),
    "deepseek-v2-lite o_proj": (2048, 2048),
    # Gemma 4 26B-A4B (hidden 2816; 16 heads of 256, 8 kv heads)
    "gemma-4 q_proj": (4096, 2816),
    "gemma-4 o_proj": (2816, 4096),
}
ROWS = (1, 8, 16)


def main(out: str | None = None) -> None:
    rows = []
    print(
        f"{'shape':>28} {'M':>3} {'cublas us':>10} {'skinny us':>10} {'plain us':>9} {'TB/s':>24}"
    )
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        gb = n * k * 2 / 1e9
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w).float()
            for fn in (skinny_linear, project_rows):
                err = ((fn(x, w).float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, f"{fn.__name__} at {name}, {m} rows: relative error {err}"
            us = {
                "cublas": captured_call_us(lambda: F.linear(x, w)),
                "skinny": captured_call_us(lambda: skinny_linear(x, w)),
                "plain": captured_call_us(lambda: project_rows(x, w)),
            }
            rows.append({"shape": name, "n": n, "k": k, "rows": m, "us": us})
            tbs = " / ".join(f"{gb / t * 1e3:.2f}" for t in us.values())
            print(
                f"{name:>28} {m:>3} {us['cublas']:>10.1f} {us['skinny']:>10.1f} {us['plain']:>9.1f} {tbs:>24}",
                flush=True,
            )
    if out:
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
