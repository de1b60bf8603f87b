"""One row (decode at batch 1) on the CUDA cores against the 16-row tensor-core tiles: the quantized few-row
product (layers/quant/quant_matmul_kernel.py ONE-ROW, ``one_row_tiles``) over block-FP8 weights, and the
grouped experts at one token (layers/moe_kernels.py ONE-ROW, ``one_token_gate_up`` / ``one_token_down``) over
bf16 and block-FP8 stacks.

1. Dense: at each projection shape, the 16-row tiles (``one_row_cuda_cores`` off: ``plan``'s), the bf16 weight's
   few-row product (layers/fused_projection.py ``project_rows``) for scale, and the one-row settings
   ``DENSE_SETTINGS`` (the fastest of gpu_2026-12-04 call 1's sweep at some shape). Each time is one call's share
   of a CUDA graph of 8 calls on 8 distinct weights (fp8_projection_settings.py ``graph_us``), every output
   checked against F.linear on the dequantized weight first.
2. Experts: one token's grouped experts at the MoE families' expert shapes (routed experts only, chosen among
   ``STACKED`` of them: the kernels read the chosen ones alone; block FP8 where the intermediate size is whole
   scale blocks), the 16-row tiles against the one-row (gate/up, down) tiles ``EXPERT_SETTINGS``, each call's
   share of a graph of 4 layers' distinct stacks, and each kernel's share of it (torch.profiler); floor: the
   chosen experts' bytes over 4.8 TB/s.

    PYTHONPATH=. python3 benchmarks/scripts/one_row_products.py [OUT.json]"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).parent))
from fp8_projection_settings import CALLS, graph_us  # noqa: E402

from outpace.layers import moe_kernels as mk  # noqa: E402
from outpace.layers.expert_blocks import align  # noqa: E402
from outpace.layers.fused_projection import project_rows  # noqa: E402
from outpace.layers.grouped_experts import grouped_experts  # noqa: E402
from outpace.layers.quant import quant_matmul_kernel as qm  # noqa: E402
from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block  # noqa: E402
from outpace.layers.quant.moe_quant_kernels import fp8_block_grouped_experts  # noqa: E402

BLOCK = (128, 128)
HBM_BYTES_PER_S = 4.8e12
DENSE = {  # name: (N, K)
    "deepseek-v2-lite kv_a": (576, 2048),
    "deepseek-v2-lite q": (3072, 2048),
    "deepseek-v2-lite o": (2048, 2048),
    "qwen3-next out_proj": (2048, 4096),
    "qwen3-next in_proj_qkvz": (12288, 2048),
    "step-3.5 tp2 q_proj": (6144, 4096),
    "llama-8b down_proj": (4096, 14336),
    "llama-8b gate_up": (28672, 4096),
}
# name: (experts, top_k, hidden, intermediate, activation), bench/family_shapes.py's configs
EXPERTS = {
    "deepseek-v2-lite": (64, 6, 2048, 1408, "silu"),
    "gemma-4-26b-a4b": (128, 8, 2816, 704, "gelu_tanh"),
    "qwen3-next-80b": (512, 10, 2048, 512, "silu"),
    "deepseek-v3": (256, 8, 7168, 2048, "silu"),
}
LAYERS = 4
STACKED = (
    32  # experts a stack holds (DeepSeek-V3's 256 of 7168 x 2048 would take 90 GB in 4 layers)
)
# (BN, BK, warps, stages, programs an SM, least K steps a split): quant_matmul_kernel.py one_row_tiles
DENSE_SETTINGS = [
    (16, 256, 4, 2, 8, 1),
    (32, 256, 4, 2, 8, 1),
    (8, 256, 4, 1, 8, 1),
    (16, 512, 2, 1, 8, 1),
    (8, 512, 4, 2, 8, 1),
    (32, 512, 8, 1, 8, 1),
    (32, 256, 4, 1, 8, 4),
]
# (gate/up, down) one-row tiles (BLOCK_N, BLOCK_K, warps, stages): moe_kernels.py one_token_gate_up / _down
EXPERT_SETTINGS = [
    ((16, 512, 4, 1), (16, 512, 4, 1)),
    ((16, 512, 4, 1), (16, 256, 4, 1)),
    ((16, 256, 4, 2), (16, 256, 4, 2)),
    ((32, 512, 8, 1), (16, 256, 4, 1)),
    ((8, 512, 4, 1), (8, 512, 4, 1)),
]
PROFILED_REPLAYS = 20


def us(t: float | None) -> str:
    return "     -" if t is None else f"{t:6.2f}"


def kernel_us(replay, calls: int) -> dict[str, float]:
    """{kernel: us a call} over ``PROFILED_REPLAYS`` replays of a graph of ``calls`` calls (torch.profiler)."""
    replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_REPLAYS):
            replay()
        torch.cuda.synchronize()
    return {
        e.key: e.device_time_total / (PROFILED_REPLAYS * calls)
        for e in prof.key_averages()
        if e.device_time_total > 0
    }


def one_row_us(x, weights, dense, setting) -> float | None:
    """us a call at ``setting`` (None: the 16-row tiles), None where it fails or computes wrongly."""
    qm.one_row_cuda_cores = setting is not None
    if setting is not None:
        qm.one_row_tiles = setting
    try:
        got = qm.quant_matmul(x, weights[0][0], weights[0][1], "fp8_block", BLOCK)
        ref = F.linear(x.float(), dense)
        err = ((got.float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            print(f"    {setting}: wrong (relative error {err:.3g})", flush=True)
            return None
        return graph_us(lambda: [qm.quant_matmul(x, w, s, "fp8_block", BLOCK) for w, s in weights])
    except Exception as e:  # noqa: BLE001 (a setting beyond the registers or shared memory)
        print(f"    {setting}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return None


def dense_rows(device) -> list[dict]:
    shipped = qm.one_row_cuda_cores, qm.one_row_tiles
    rows = []
    for name, (n, k) in DENSE.items():
        raw = torch.randn(n, k, device=device) * 0.02
        q, scale = quantize_fp8_block(raw, BLOCK)
        dense = dequantize_fp8_block(q, scale, BLOCK)
        weights = [(q.clone(), scale.clone()) for _ in range(CALLS)]
        bf16 = [dense.to(torch.bfloat16) for _ in range(CALLS)]
        x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
        floor = (n * k + scale.numel() * 4) / HBM_BYTES_PER_S * 1e6
        times = {"16-row tiles": one_row_us(x, weights, dense, None)}
        times["bf16 project_rows"] = graph_us(lambda: [project_rows(x, w) for w in bf16])
        for setting in DENSE_SETTINGS:
            times[str(setting)] = one_row_us(x, weights, dense, setting)
        qm.one_row_cuda_cores, qm.one_row_tiles = shipped
        times["shipped"] = one_row_us(x, weights, dense, shipped[1])
        ok = {s: t for s, t in times.items() if t and s.startswith("(")}
        best = min(ok, key=ok.get)
        print(
            f"{name:>26} floor {floor:5.2f} | 16-row {us(times['16-row tiles'])} | bf16 "
            f"{us(times['bf16 project_rows'])} | shipped {us(times['shipped'])} | best {best} "
            f"{us(ok[best])}",
            flush=True,
        )
        rows.append({"shape": name, "n": n, "k": k, "floor_us": floor, "us": times})
    qm.one_row_cuda_cores, qm.one_row_tiles = shipped
    return rows


def expert_stacks(experts, hidden, inter, fp8: bool, device):
    if not fp8:

        def rand(*shape):
            return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

        return {"gate": rand(experts, inter, hidden), "up": rand(experts, inter, hidden),
                "down": rand(experts, hidden, inter)}  # fmt: skip
    gate_up, gate_up_s = quantize_fp8_block(
        torch.randn(experts, 2 * inter, hidden, device=device) * 0.02, BLOCK
    )
    down, down_s = quantize_fp8_block(
        torch.randn(experts, hidden, inter, device=device) * 0.02, BLOCK
    )
    return {"gate_up": gate_up, "gate_up_s": gate_up_s, "down": down, "down_s": down_s}


def expert_rows(device) -> list[dict]:
    shipped = mk.one_token_cuda_cores, mk.one_token_gate_up, mk.one_token_down
    rows = []
    for (name, (experts, top_k, hidden, inter, act)), fp8 in itertools.product(
        EXPERTS.items(), (False, True)
    ):
        if fp8 and inter % BLOCK[0]:
            continue  # (packed gate/up rows of partial scale blocks: no such checkpoint)
        experts = min(experts, STACKED)
        layers = [expert_stacks(experts, hidden, inter, fp8, device) for _ in range(LAYERS)]
        gen = torch.Generator().manual_seed(0)
        ids = [
            torch.randperm(experts, generator=gen)[:top_k][None].to(device).int() for _ in layers
        ]
        weights = torch.rand(1, top_k, device=device)
        x = torch.randn(1, hidden, device=device, dtype=torch.bfloat16)
        layouts = [align(i, experts) for i in ids]
        floor = top_k * 3 * inter * hidden * (1 if fp8 else 2) / HBM_BYTES_PER_S * 1e6

        def call(i: int) -> torch.Tensor:
            w = layers[i]
            if fp8:
                return fp8_block_grouped_experts(
                    x, weights, ids[i], w["gate_up"], w["gate_up_s"], w["down"], w["down_s"],
                    activation=act, layout=layouts[i],
                )  # fmt: skip
            return grouped_experts(
                x, weights, ids[i], w["gate"], w["up"], w["down"], activation=act, layout=layouts[i]
            )

        mk.one_token_cuda_cores = False
        reference = call(0).float()
        times, kernels = {}, {}
        settings = [("16-row tiles", None, None)]
        settings += [(str(tiles), *tiles) for tiles in EXPERT_SETTINGS]
        for key, up_tiles, down_tiles in settings:
            mk.one_token_cuda_cores = up_tiles is not None
            if up_tiles is not None:
                mk.one_token_gate_up, mk.one_token_down = up_tiles, down_tiles
            try:
                err = ((call(0).float() - reference).norm() / reference.norm()).item()
                if not err < 1e-2:
                    print(f"  {name} {key}: wrong (relative error {err:.3g})", flush=True)
                    continue
                call(1)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for i in range(LAYERS):
                        call(i)
                times[key] = do_bench(graph.replay, return_mode="median") * 1e3 / LAYERS
                kernels[key] = kernel_us(graph.replay, LAYERS)
            except Exception as e:  # noqa: BLE001 (a tile beyond the registers or shared memory)
                print(f"  {name} {key}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        mk.one_token_cuda_cores, mk.one_token_gate_up, mk.one_token_down = shipped
        best = min((k for k in times if k != "16-row tiles"), key=times.get, default=None)
        shipped_key = str((shipped[1], shipped[2]))
        for key in ("16-row tiles", best):
            if key in kernels:
                parts = " ".join(f"{k[:24]} {v:5.2f}" for k, v in kernels[key].items())
                print(f"    {key}: {parts}", flush=True)
        print(
            f"{name:>18} {'fp8 ' if fp8 else 'bf16'} floor {floor:6.2f} | 16-row "
            f"{us(times.get('16-row tiles'))} | shipped {us(times.get(shipped_key))} | best {best} "
            f"{us(times.get(best))}",
            flush=True,
        )
        rows.append(
            {"shape": name, "fp8": fp8, "floor_us": floor, "us": times, "kernel_us": kernels}
        )
    return rows


def main(out: str | None = None) -> None:
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(), "dense": dense_rows(device)}
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
    report["experts"] = expert_rows(device)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
