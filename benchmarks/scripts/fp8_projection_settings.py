"""The fused few-row projections over block-FP8 weights (layers/fused_projection.py ``Fp8Weight``) at the FP8
families' decode shapes: the shipped setting and a set of K steps, stages and warps, beside the weight-streaming
quantized kernel they replace (layers/quant/quant_matmul_kernel.py) and the bf16 projection of the same shape.
Each time is one call's share of a CUDA graph of 8 calls on 8 distinct weights (more bytes than L2 holds),
launched with programmatic dependent launch as in a decode step. Every output is checked against torch's
product on the dequantized weight first. Batch 1 sweeps every setting; batch 8 runs the shipped one and batch
1's best two.

    PYTHONPATH=. python3 benchmarks/scripts/fp8_projection_settings.py [OUT.json]"""

from __future__ import annotations

import json
import sys

import torch
from projection_tiles import launch  # the bf16 sweep beside this file's (Fp8Weight too)
from triton.testing import do_bench

from outpace.layers.fused_rows_kernel import PLAIN, SWIGLU
from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.quant_matmul_kernel import quant_matmul

CALLS = 8
BLOCK = (128, 128)
# name: (epilogue, outputs, K), a rank's part where a shape is tensor-parallel; a SwiGLU's outputs are its
# intermediate size (weights of 2 x that many rows)
SHAPES = {
    "step-3.5 tp2 q_proj": (PLAIN.value, 6144, 4096),
    "step-3.5 tp2 o_proj": (PLAIN.value, 4096, 6144),
    "step-3.5 tp2 k_proj": (PLAIN.value, 512, 4096),
    "step-3.5 tp2 shared gate_up": (SWIGLU.value, 640, 4096),
    "step-3.5 tp2 shared down": (PLAIN.value, 4096, 640),
    "qwen3-next in_proj_qkvz": (PLAIN.value, 12288, 2048),
    "llama-8b gate_up": (SWIGLU.value, 14336, 4096),
    "llama-8b down_proj": (PLAIN.value, 4096, 14336),
}
# (outputs a program, BK, warps, stages, outputs a sub-tile at most); None: the shipped setting
TILES = [None] + [
    (None, 128, 4, 3, None),
    (None, 128, 4, 4, None),
    (None, 128, 4, 6, None),
    (None, 128, 4, 10, None),
    (None, 64, 4, 8, None),
    (None, 64, 4, 12, None),
    (None, 128, 8, 6, None),
]


def reference(x: torch.Tensor, dense: torch.Tensor, epilogue: int, n_out: int) -> torch.Tensor:
    y = x.float() @ dense.T
    if epilogue == SWIGLU.value:
        return torch.nn.functional.silu(y[:, :n_out]) * y[:, n_out:]
    return y


def graph_us(calls) -> float:
    """One call's share of a captured graph of ``calls()`` (``CALLS`` launches)."""
    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return do_bench(graph.replay, return_mode="median") * 1e3 / CALLS


def fused_us(x, weights, dense, epilogue: int, n_out: int, tiles) -> float | None:
    """us a call of the fused kernel, None where the setting does not compile or computes wrongly."""
    outs = [torch.empty(x.shape[0], n_out, dtype=x.dtype, device=x.device) for _ in weights]
    try:
        launch(x, weights[0], outs[0], epilogue, n_out, tiles)
        ref = reference(x, dense, epilogue, n_out)
        err = ((outs[0].float() - ref).norm() / ref.norm()).item()
        if not err < 2e-2:
            print(f"    {tiles}: wrong output (relative error {err:.3g})", flush=True)
            return None
        return graph_us(
            lambda: [launch(x, w, o, epilogue, n_out, tiles) for w, o in zip(weights, outs)]
        )
    except Exception as e:  # noqa: BLE001 (a setting that does not fit the shared memory)
        print(f"    {tiles}: {type(e).__name__}", flush=True)
        return None


def main(out: str | None = None) -> None:
    device = torch.device("cuda")
    rows = []
    for name, (epilogue, n_out, k) in SHAPES.items():
        weight_rows = 2 * n_out if epilogue == SWIGLU.value else n_out
        raw = torch.randn(weight_rows, k, device=device) * 0.02
        q, scale = quantize_fp8_block(raw, BLOCK)
        dense = dequantize_fp8_block(q, scale, BLOCK)
        weights = [Fp8Weight(q.clone(), scale.clone(), BLOCK) for _ in range(CALLS)]
        bf16 = [dense.to(torch.bfloat16) for _ in range(CALLS)]
        gb = weight_rows * k / 1e9  # the fp8 bytes
        for m in (1, 8):
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            if m == 1:
                candidates = TILES
            else:
                ranked = sorted(
                    (t for t in rows[-1]["fused_us"].items() if t[1]), key=lambda t: t[1]
                )
                candidates = [None] + [TILES[int(i)] for i, _ in ranked if i != "0"][:2]
            times = {
                str(TILES.index(t)): fused_us(x, weights, dense, epilogue, n_out, t)
                for t in candidates
            }
            quant = (
                graph_us(
                    lambda: [
                        quant_matmul(x, w.weight, w.scale, "fp8_block", BLOCK) for w in weights
                    ]
                )
                if epilogue == PLAIN.value
                else None
            )  # (the quantized kernel has no SwiGLU epilogue)
            outs16 = [torch.empty(m, n_out, dtype=x.dtype, device=device) for _ in bf16]
            half = graph_us(
                lambda: [launch(x, w, o, epilogue, n_out, None) for w, o in zip(bf16, outs16)]
            )
            ok = {i: t for i, t in times.items() if t is not None}
            best = min(ok, key=ok.get)
            shipped = times["0"]
            quant_text = f"quant_matmul {quant:6.1f} us | " if quant else ""
            print(
                f"{name:>28} m={m} shipped {shipped:6.1f} us {gb / shipped * 1e3:5.2f} TB/s | best "
                f"{TILES[int(best)]} {ok[best]:6.1f} us {gb / ok[best] * 1e3:5.2f} TB/s | "
                f"{quant_text}bf16 {half:6.1f} us {2 * gb / half * 1e3:5.2f} TB/s",
                flush=True,
            )
            rows.append(
                {
                    "shape": name,
                    "outputs": n_out,
                    "k": k,
                    "rows": m,
                    "fp8_gb": gb,
                    "fused_us": times,
                    "quant_matmul_us": quant,
                    "bf16_us": half,
                }
            )
    if out:
        with open(out, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "tiles": TILES, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
