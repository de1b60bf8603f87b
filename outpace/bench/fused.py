"""The fused few-row projections (layers/fused_projection.py) at the Llama-3.1-8B decode shapes, batch 1,
against the plain few-row matmul (layers/skinny_gemm.py): GPU time of one call captured in a CUDA
graph, L2 flushed, for a sweep of tiles (``python -m outpace.bench.fused``)."""

from __future__ import annotations

import itertools

import torch

from outpace.bench.graph_timing import captured_call_us
from outpace.layers import fused_projection as fp
from outpace.layers.fused_rows_kernel import PLAIN, QKV, SWIGLU

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 128256


def _calls(m: int):
    """name -> (weight rows, K, fn(tiles))."""
    dev, bf16 = "cuda", torch.bfloat16
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    x = torch.randn(m, HIDDEN, device=dev, dtype=bf16)
    act = torch.randn(m, INTER, device=dev, dtype=bf16)
    sq = torch.full(
        (128, m), float(HIDDEN) / 128, device=dev
    )  # partial sums of squares, as o_proj leaves them
    w = {
        "qkv": (q_size + 2 * kv_size, HIDDEN),
        "o": (HIDDEN, q_size),
        "gate_up": (2 * INTER, HIDDEN),
        "down": (HIDDEN, INTER),
        "lm_head": (VOCAB, HIDDEN),
    }
    w = {k: torch.randn(*s, device=dev, dtype=bf16) * 0.02 for k, s in w.items()}
    caches = [torch.zeros(64, 16, KV_HEADS, HEAD_DIM, device=dev, dtype=bf16) for _ in range(2)]
    cos = torch.ones(8192, HEAD_DIM // 2, device=dev)
    pos, slots = torch.arange(m, device=dev), torch.arange(m, device=dev)
    out = {k: torch.empty(m, v.shape[0], device=dev, dtype=bf16) for k, v in w.items()}
    qkv_args = (pos, cos, cos, *caches, slots, q_size, kv_size)
    return {
        "qkv": (
            w["qkv"],
            x,
            lambda t: fp._launch(
                x,
                w["qkv"],
                out["qkv"],
                w["qkv"].shape[0] // 2,
                QKV.value,
                half=HEAD_DIM // 2,
                norm=(sq, 1e-5),
                qkv=qkv_args,
                pdl=False,
                tiles=t,
            ),
        ),
        "o": (
            w["o"],
            x,
            lambda t: fp._launch(
                x, w["o"], out["o"], HIDDEN, PLAIN.value, residual=x, pdl=False, tiles=t
            ),
        ),
        "gate_up": (
            w["gate_up"],
            x,
            lambda t: fp._launch(
                x,
                w["gate_up"],
                out["gate_up"],
                INTER,
                SWIGLU.value,
                half=INTER,
                norm=(sq, 1e-5),
                pdl=False,
                tiles=t,
            ),
        ),
        "down": (
            w["down"],
            act,
            lambda t: fp._launch(
                act, w["down"], out["down"], HIDDEN, PLAIN.value, residual=x, pdl=False, tiles=t
            ),
        ),
        "lm_head": (
            w["lm_head"],
            x,
            lambda t: fp._launch(
                x,
                w["lm_head"],
                out["lm_head"],
                VOCAB,
                PLAIN.value,
                norm=(sq, 1e-5),
                pdl=False,
                tiles=t,
            ),
        ),
    }


def run(m: int = 1) -> None:
    from outpace.layers.skinny_gemm import skinny_linear

    print(
        f"{'shape':>8} {'skinny us':>10} {'TB/s':>6} {'fused default':>14} {'TB/s':>6} {'best fused':>11} "
        f"{'TB/s':>6}  tiles"
    )
    for name, (w, x, fn) in _calls(m).items():
        gb = w.numel() * 2 / 1e9
        skinny = captured_call_us(lambda: skinny_linear(x, w))
        default = captured_call_us(lambda: fn(None))
        paired = name in ("qkv", "gate_up")
        best = (float("inf"), None)
        for bn, bk, warps, stages in itertools.product(
            (16, 32, 64) if not paired else (8, 16, 32), (128, 256), (4, 8), (3, 5)
        ):
            try:
                best = min(
                    best,
                    (
                        captured_call_us(lambda: fn((bn, bk, warps, stages, None))),
                        (bn, bk, warps, stages),
                    ),
                )
            except Exception as e:  # a config that does not compile (shared memory, registers)
                print(f"  {type(e).__name__} for {(bn, bk, warps, stages)}")
        print(
            f"{name:>8} {skinny:>10.1f} {gb / skinny * 1e3:>6.2f} {default:>14.1f} {gb / default * 1e3:>6.2f} "
            f"{best[0]:>11.1f} {gb / best[0] * 1e3:>6.2f}  {best[1]}"
        )


if __name__ == "__main__":
    run()
