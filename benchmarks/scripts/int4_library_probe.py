"""Our INT4 few-row products against the INT4 kernels a user could install (issue 44: "a library kernel is welcome
where it installs from PyPI and beats ours in a measurement"): torch's own tinygemm (``torch._weight_int4pack_mm``,
gpt-fast's and torchao's int4 weight-only path, tensor-core tiled layout) and GemLite (pip ``gemlite``: Triton
GEMV / split-K kernels, its shipped per-GPU configs), with bf16 ``F.linear`` beside them, at 1 / 8 / 32 rows on the
decoder projections of Llama-3.1-8B and Gemma-3-12B (``bench families --quantized w4a16``'s shapes: symmetric groups
of 128, compressed-tensors' stored + 8 nibbles).

Each product is checked against the dequantized weight (float32, relative error of the output), then timed as one
call's share of a CUDA graph of calls on ``copies`` distinct weights (enough that they do not fit L2, so every call
reads its weight from memory; launch gaps included, as a decode step's graph pays them).

    PYTHONPATH=. python3 benchmarks/scripts/int4_library_probe.py OUT.json [--rows 1 8 32]

Layouts (facts from public code): tinygemm takes uint8 [N, K/2], even column in the high nibble
(gpt-fast's quantize.py ``prepare_int4_weight_and_scales_and_zeros``), through ``torch._convert_weight_to_int4pack``,
and scales_and_zeros [K/group, N, 2] with w = (q - 8) * scale + zero (gpt-fast ``group_quantize_tensor``: zeros =
min + 8 * scale); so a symmetric weight stored + 8 has zero 0. GemLite's ``A16Wn.from_weights`` takes q [N, K] with w
= (q - zero) * scale (gemlite/helper.py), so zero 8."""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

from outpace.bench.graph_timing import graph_call_us
from outpace.bench.quant_kernels import random_int4
from outpace.layers.quant import quant_matmul_kernel as qm
from outpace.layers.quant.dequantize import dequantize_int4_group, unpack_int4
from outpace.layers.quant.int4_linear_kernel import int4_group_linear

GROUP = 128
# (N, K) of each projection; config.json of meta-llama/Llama-3.1-8B (hidden 4096, 32 / 8 heads of 128,
# intermediate 14336) and google/gemma-3-12b-it (hidden 3840, 16 / 8 heads of 256, intermediate 15360)
SHAPES = {
    "llama-8b qkv": (6144, 4096),
    "llama-8b o": (4096, 4096),
    "llama-8b gate_up": (28672, 4096),
    "llama-8b down": (4096, 14336),
    "gemma-12b qkv": (8192, 3840),
    "gemma-12b o": (3840, 4096),
    "gemma-12b gate_up": (30720, 3840),
    "gemma-12b down": (3840, 15360),
}
# the copies' INT4 bytes together at least this (an H100's L2 is 50 MB, an H200's 60)
_L2_BYTES = 120e6
# ``--tiles``: our kernel at other few-row tiles too (few_row_tiles' block_n, block_k, num_warps, num_stages), beside
# plan's (64, 128, 4, 4 up to 32 rows)
OUR_TILES = [
    (64, 256, 4, 3),
    (128, 128, 8, 4),
    (128, 256, 8, 3),
    (32, 512, 4, 3),
    (64, 512, 8, 3),
    (256, 128, 8, 3),
]


def tinygemm_operands(
    packed: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Our int32 [N, K/8] words (+8 nibbles, lowest first) and scales [N, K/g] -> tinygemm's packed weight and
    scales_and_zeros [K/g, N, 2] (zero 0)."""
    q = unpack_int4(packed, packed.shape[1] * 8).to(torch.int32) + 8  # [N, K] in 0..15
    as_bytes = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # [N, K/2]
    tiled = torch._convert_weight_to_int4pack(as_bytes.contiguous(), 8)
    zeros = torch.zeros_like(scale)
    scales_and_zeros = (
        torch.stack([scale, zeros], dim=-1).transpose(0, 1).contiguous()
    )  # [K/g, N, 2]
    return tiled, scales_and_zeros.to(torch.bfloat16)


def gemlite_layer(packed: torch.Tensor, scale: torch.Tensor):
    """GemLite's A16W4 layer of the same weight (zero 8)."""
    from gemlite.helper import A16Wn

    q = (unpack_int4(packed, packed.shape[1] * 8).to(torch.int32) + 8).to(torch.uint8)
    zeros = torch.full_like(scale, 8)
    return A16Wn(device=str(packed.device), dtype=torch.bfloat16).from_weights(
        q, scale, zeros, 4, GROUP
    )


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


def tiled(packed, scale, m: int, n: int, k: int, tile: tuple[int, int, int, int]):
    """Our product of these weights at ``tile`` for ``m`` rows."""
    bn, bk, warps, stages = tile
    t = qm.few_row_tiles(
        m, n, k, packed.device, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages
    )
    return lambda x: qm.quant_matmul(x, packed, scale, "int4_group", (1, GROUP), tiles=t)


def probe(name: str, n: int, k: int, rows: list[int], tiles: bool) -> list[dict]:
    copies = max(2, min(16, math.ceil(_L2_BYTES / (n * k / 2))))
    packed = [random_int4((n, k // 8)) for _ in range(copies)]
    scale = [
        torch.rand(n, k // GROUP, device="cuda", dtype=torch.bfloat16) * 2e-3 for _ in range(copies)
    ]
    bf16 = [dequantize_int4_group(packed[0], scale[0], GROUP).to(torch.bfloat16)]
    bf16 += [torch.randn_like(bf16[0]) for _ in range(max(1, math.ceil(_L2_BYTES / (2 * n * k))))]
    kernels: dict[str, list] = {
        "ours": [
            lambda x, i=i: int4_group_linear(x, packed[i], scale[i], GROUP) for i in range(copies)
        ],
        "bf16": [lambda x, w=w: F.linear(x, w) for w in bf16],
    }
    try:
        tg = [tinygemm_operands(p, s) for p, s in zip(packed, scale)]
        kernels["tinygemm"] = [
            lambda x, w=w, sz=sz: torch._weight_int4pack_mm(x, w, GROUP, sz) for w, sz in tg
        ]
    except Exception as e:  # (reported, not hidden: the row says why)
        print(f"{name}: tinygemm unavailable: {type(e).__name__}: {e}", file=sys.stderr)
    last = {}  # (timed after our tiles: GemLite autotunes where it ships no configs for the GPU)
    try:
        gl = [gemlite_layer(p, s) for p, s in zip(packed, scale)]
        last = {"gemlite": [lambda x, layer=layer: layer(x) for layer in gl]}
    except Exception as e:
        print(f"{name}: gemlite unavailable: {type(e).__name__}: {e}", file=sys.stderr)
    ref_weight = dequantize_int4_group(packed[0], scale[0], GROUP)  # [N, K] float32
    results = []
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ ref_weight.T
        row = {
            "shape": name,
            "n": n,
            "k": k,
            "rows": m,
            "int4_bytes": n * k // 2 + n * k // GROUP * 2,
        }
        these = dict(kernels)
        if tiles and m > 1:
            for tile in OUR_TILES:
                these["ours " + ",".join(map(str, tile))] = [
                    tiled(p, s, m, n, k, tile) for p, s in zip(packed, scale)
                ]
        these.update(last)
        for label, calls in these.items():
            try:
                err = relative_error(calls[0](x), ref)
                us = graph_call_us(lambda calls=calls: [c(x) for c in calls], calls=4) / len(calls)
            except Exception as e:
                print(f"{name} {label} {m}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            row[label] = {"us": us, "relative_error": err}
        results.append(row)
        cells = "  ".join(
            f"{label} {row[label]['us']:7.2f} us ({row['int4_bytes'] / row[label]['us'] / 1e6:4.2f} TB/s, "
            f"err {row[label]['relative_error']:.1e})"
            for label in these
            if label in row
        )
        print(f"{name:18} {m:3}  {cells}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--tiles", action="store_true", help="our kernel at OUR_TILES too")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    results = []
    for name in (
        args.shapes
    ):  # (written after each shape: a run cut by its time limit keeps what it measured)
        results += probe(name, *SHAPES[name], args.rows, args.tiles)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
