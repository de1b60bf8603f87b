"""Where a one-row fp8 product's time goes (layers/quant/quant_matmul_kernel.py ONE-ROW): the same loop as
``row_times_tile`` with the weight's values made three ways, timed alone at the shapes decode reads.

- ``cvt``: ``w.to(tl.float32)``, as the shipped kernel does: on sm_90 each pair of values one
  F2FP.F16.E4M3.UNPACK_B and each value one HADD2.F32 (the conversion units), then its FFMA;
- ``bits``: each value's float32 built from its bits by integer instructions (sign-extended byte, shift, and:
  the e4m3 exponent and mantissa placed as float32's, which is the value times 2^-120, the 2^120 folded into the
  scale), then its FFMA;
- ``int``: the bytes summed as integers, no float product (what reading the weight costs with this tiling).

- ``tma``: ``cvt`` and ``int`` with the weight's tiles brought into shared memory by the copy engine (TMA),
  ``num_stages`` tiles ahead.

If ``bits`` runs near ``int`` and ``cvt`` well above both, the one-row product is bound by the conversions, not by
memory. (On the H200, gpu_2026-12-04d calls 2-4: ``int`` took as long as ``cvt`` at every shape, ``bits`` no less, and
``tma`` no less than plain loads: benchmarks/results/gpu_2026-12-04d/README.md.) Each time is one call's share of a CUDA graph of 8 calls on distinct weights; each program writes its
split's partial sums (no reduction: the same for every mode). A mode's output is checked against the dequantized
product (``int`` excepted).

    PYTHONPATH=. python3 benchmarks/scripts/fp8_row_conversion.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
from fp8_projection_settings import CALLS, graph_us  # noqa: E402 (this directory's)

GROUP = 128  # columns a block-FP8 scale covers
MODES = ("cvt", "int")  # (and "bits", which call 2 of gpu_2026-12-04d found no faster than "cvt")
SHAPES = {  # name: (N, K)
    "qwen3-next in_proj 12352 x 2048": (12352, 2048),
    "qwen3-next out_proj 2048 x 4096": (2048, 4096),
    "v2-lite q 3072 x 2048": (3072, 2048),
    "v2-lite o 2048 x 2048": (2048, 2048),
    "step-3.5 q 6144 x 4096": (6144, 4096),
}
# (BN, BK, warps, stages): call 2 of gpu_2026-12-04d swept the first five; the rest take a whole row (or half) a step
TILES = [(16, 512, 2, 1), (8, 512, 4, 1), (8, 2048, 8, 1)]  # (call 3 swept ten)
# (BN, BK, warps, stages, programs an SM): the weight's tiles by the copy engine (``_row_tma_kernel``; a box is at
# most 256 columns)
TMA_TILES = [
    (16, 256, 4, 4, 8),
    (32, 256, 4, 4, 4),
    (64, 256, 4, 3, 2),
    (64, 256, 8, 4, 2),
    (128, 256, 8, 3, 1),
    (32, 128, 4, 6, 4),
    (16, 256, 2, 6, 8),
    (64, 128, 4, 8, 2),
]
TWO_TO_120 = 2.0**120


@triton.jit
def _row_kernel(
    x_ptr,  # [K] bf16
    w_ptr,  # [N, K] int8 (the fp8 bytes)
    s_ptr,  # [ceil(N / 128), ceil(K / 128)] float32 (times 2^120 for MODE "bits")
    partial_ptr,  # [splits, N] float32, written
    N,
    K,
    stride_sn,
    k_per_split,
    MODE: tl.constexpr,
    BN: tl.constexpr,
    GROUPS: tl.constexpr,  # BK / GROUP
    GROUP: tl.constexpr,
):
    col_block, split = tl.program_id(0), tl.program_id(1)
    cols = col_block * BN + tl.arange(0, BN)  # [BN]
    n_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K  # [BN, 1]
    s_rows = s_ptr + (cols // GROUP).to(tl.int64)[:, None] * stride_sn  # [BN, 1]
    acc = tl.zeros((BN, GROUPS), dtype=tl.float32)
    k_start = split * k_per_split
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), GROUPS * GROUP):
        ks = (
            k0 + tl.arange(0, GROUPS)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        )  # [GROUPS, GROUP]
        x = tl.load(x_ptr + ks).to(tl.float32)  # [GROUPS, GROUP]
        w = tl.load(w_rows[:, :, None] + ks[None, :, :], mask=n_ok[:, None, None], other=0)  # int8
        if MODE == "int":
            part = tl.sum(w.to(tl.int32), axis=2).to(tl.float32)  # [BN, GROUPS]
        else:
            if MODE == "cvt":
                wf = w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            else:  # sign at bit 31, exponent and mantissa at 26..20: the value times 2^-120
                wf = ((w.to(tl.int32) << 20) & -2014314496).to(
                    tl.float32, bitcast=True
                )  # 0x87F00000
            part = tl.sum(wf * x[None, :, :], axis=2)  # [BN, GROUPS]
        columns = (k0 + tl.arange(0, GROUPS) * GROUP) // GROUP
        acc += part * tl.load(s_rows + columns[None, :], mask=n_ok[:, None], other=0.0)
    tl.store(partial_ptr + split * N + cols, tl.sum(acc, axis=1), mask=n_ok)


@triton.jit
def _row_tma_kernel(
    x_ptr,  # [K] bf16
    w_desc,  # TensorDescriptor over [N, K] int8 (the fp8 bytes), block [BN, BK]
    s_ptr,
    partial_ptr,  # [splits, N] float32, written
    N,
    K,
    stride_sn,
    k_per_split,
    MODE: tl.constexpr,
    BN: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP: tl.constexpr,
):
    """``_row_kernel`` with the weight's tiles brought into shared memory by the copy engine (TMA), which the
    software pipeline keeps ``num_stages`` tiles ahead."""
    col_block, split = tl.program_id(0), tl.program_id(1)
    cols = col_block * BN + tl.arange(0, BN)  # [BN]
    n_ok = cols < N
    s_rows = s_ptr + (cols // GROUP).to(tl.int64)[:, None] * stride_sn  # [BN, 1]
    acc = tl.zeros((BN, GROUPS), dtype=tl.float32)
    k_start = split * k_per_split
    for k0 in tl.range(k_start, tl.minimum(k_start + k_per_split, K), GROUPS * GROUP):
        ks = (
            k0 + tl.arange(0, GROUPS)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        )  # [GROUPS, GROUP]
        x = tl.load(x_ptr + ks).to(tl.float32)  # [GROUPS, GROUP]
        w = tl.reshape(w_desc.load([col_block * BN, k0]), (BN, GROUPS, GROUP))  # int8
        if MODE == "int":
            part = tl.sum(w.to(tl.int32), axis=2).to(tl.float32)  # [BN, GROUPS]
        else:
            part = tl.sum(w.to(tl.float8e4nv, bitcast=True).to(tl.float32) * x[None, :, :], axis=2)
        columns = (k0 + tl.arange(0, GROUPS) * GROUP) // GROUP
        acc += part * tl.load(s_rows + columns[None, :], mask=n_ok[:, None], other=0.0)
    tl.store(partial_ptr + split * N + cols, tl.sum(acc, axis=1), mask=n_ok)


def splits_for(n: int, k: int, bn: int, bk: int, per_sm: int = 8) -> int:
    """About ``per_sm`` programs an SM (quant_matmul_kernel.py ``few_row_tiles``, at least one K step a split)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    wanted = max(1, per_sm * sms // triton.cdiv(n, bn))
    steps = triton.cdiv(k, bk)
    return triton.cdiv(steps, triton.cdiv(steps, min(steps, wanted)))


def run(kernel, x, w, s, partial, mode: str, tiles: tuple[int, int, int, int], splits: int) -> None:
    """``kernel`` (``_row_kernel`` over w [N, K] int8, ``_row_tma_kernel`` over a descriptor of it) at tiles
    (BN, BK, warps, stages), K in ``splits`` splits."""
    (n, k), (bn, bk, warps, stages) = w.shape, tiles
    steps_per_split = triton.cdiv(triton.cdiv(k, bk), splits)
    kernel[(triton.cdiv(n, bn), splits)](
        x, w, s, partial, n, k, s.stride(0), steps_per_split * bk,
        MODE=mode, BN=bn, GROUPS=bk // GROUP, GROUP=GROUP, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def sweep(row: dict, label: str, kernel, weights: list, scales: dict, x, ref, tiles, splits: int):
    """Each mode of ``kernel`` at ``tiles`` over ``weights`` (one per call of the graph): us a call into row["us"],
    after checking the first call's output against ``ref`` (``int`` excepted)."""
    n = weights[0].shape[0]
    partial = torch.empty(splits, n, device="cuda")
    for mode in MODES:
        key = f"{label}{mode} {tiles} x{splits}"
        try:
            run(kernel, x, weights[0], scales[mode], partial, mode, tiles, splits)
        except Exception as e:  # noqa: BLE001 (a tile that does not fit)
            print(f"  {key}: {type(e).__name__} {e}"[:300], flush=True)
            continue
        if mode != "int":
            err = ((partial.sum(0) - ref).norm() / ref.norm()).item()
            if not err < 1e-3:
                print(f"  {key}: wrong output (relative error {err:.3g})", flush=True)
                continue
        row["us"][key] = graph_us(
            lambda m=mode: [
                run(kernel, x, w, scales[m], partial, m, tiles, splits) for w in weights
            ]
        )


def kernel_us(x, q, scale, ref, tiles) -> float | None:
    """The shipped kernel (quant_matmul_kernel.py, with PDL, its prefetch and its split-K sum) at one-row tiles
    ``tiles``: us a call, None where it computes wrongly."""
    from outpace.layers.quant import quant_matmul_kernel as qm

    shipped = qm.one_row_tiles
    qm.one_row_tiles = tiles
    try:
        x2 = x[None]
        weights = [q.clone() for _ in range(CALLS)]
        outs = [torch.empty(1, q.shape[0], device="cuda", dtype=x.dtype) for _ in weights]
        run_one = lambda w, o: qm.quant_matmul(x2, w, scale, "fp8_block", (GROUP, GROUP), out=o)  # noqa: E731
        run_one(weights[0], outs[0])
        err = ((outs[0][0].float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            print(f"  kernel {tiles}: wrong output (relative error {err:.3g})", flush=True)
            return None
        return graph_us(lambda: [run_one(w, o) for w, o in zip(weights, outs)])
    except Exception as e:  # noqa: BLE001 (a tile that does not compile)
        print(f"  kernel {tiles}: {type(e).__name__} {e}"[:300], flush=True)
        return None
    finally:
        qm.one_row_tiles = shipped


def main(out: str) -> None:
    from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block

    bandwidth = None
    rows = []
    for name, (n, k) in SHAPES.items():
        raw = torch.randn(n, k, device="cuda") * 0.02
        q, scale = quantize_fp8_block(raw, (GROUP, GROUP))
        ref_w = dequantize_fp8_block(q, scale, (GROUP, GROUP))
        x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
        ref = ref_w @ x.float()
        weights = [q.view(torch.int8).clone() for _ in range(CALLS)]
        scales = {"cvt": scale.float(), "bits": scale.float() * TWO_TO_120, "int": scale.float()}
        if bandwidth is None:  # copy bandwidth, for the floor
            big = torch.empty(2**30, dtype=torch.uint8, device="cuda")
            t = do_bench(lambda: big.clone(), return_mode="median") * 1e-3
            bandwidth = 2 * big.numel() / t
            del big
        floor = n * k / bandwidth * 1e6
        row = {"shape": name, "n": n, "k": k, "floor_us": floor, "us": {}}
        for bn, bk, warps, stages in TILES:
            t = kernel_us(x, q, scale, ref, (bn, bk, warps, stages, 8, 1))
            if t is not None:
                row["us"][f"kernel ({bn}, {bk}, {warps}, {stages})"] = t
            splits = splits_for(n, k, bn, bk)
            sweep(row, "", _row_kernel, weights, scales, x, ref, (bn, bk, warps, stages), splits)
        for bn, bk, warps, stages, per_sm in TMA_TILES:
            descs = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in weights]
            splits = splits_for(n, k, bn, bk, per_sm)
            tiles = (bn, bk, warps, stages)
            sweep(row, "tma ", _row_tma_kernel, descs, scales, x, ref, tiles, splits)
        rows.append(row)
        line = " | ".join(f"{key} {t:6.2f}" for key, t in row["us"].items())
        print(f"{name:>34} floor {floor:5.2f} | {line}", flush=True)
    json.dump({"bandwidth_tb_s": bandwidth / 1e12, "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
