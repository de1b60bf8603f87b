"""How the few-row block-FP8 product (layers/quant/quant_matmul_kernel.py) should turn its fp8 weight tile into
bf16 before the tensor cores: the shipped path against three others, at the FP8 families' decode shapes.

- ``f32``: the shipped ``weight_tile`` (each value to float32 through Triton's conversion, times its scale, rounded
  to bf16);
- ``cvt_acc``: Triton's fp8 -> bf16 conversion (exact), the block's scale applied to the float32 product of each
  K step instead of to every weight value (BK = the scale's 128 columns: one scale a row a step);
- ``bits_acc``: the same with the conversion written as bit moves in PTX (two bytes a ``prmt``, the exponent and
  mantissa shifted into bf16's places, then ``fma.rn.bf16x2`` by 2^120 to rebias the exponent: exact for every
  finite e4m3 value, the subnormals included, as bf16 keeps its subnormals);
- ``bits_elem``: the bit moves, then each value times its scale in float32 and rounded to bf16 (the shipped
  numerics, only the conversion changed);
- ``w8a8``: no conversion of the weight: each K step's 128 columns of x quantized to e4m3 by their absmax / 448
  (DeepSeek-V3's ``act_quant``, 1 x 128 groups; other numerics than the shipped path's), the fp8 weight tile and
  the fp8 x multiplied as wgmma's A and B operands (the weight's BN rows as wgmma's M), the product times the
  weight's and x's scales into a float32 [BN, BM] accumulator;
- ``shipped``: ``quant_matmul``'s launch itself (its plan's tiles, the settings below ignored): since gpu_2026-12-01g call
  1, launched with programmatic dependent launch and its weight's first lines prefetched into L2 (the graph's
  calls launched so, as in a decode step), where the variants above launch plainly; ``--prefetch-bytes``
  times it once for each amount prefetched of a row (0: none).

``_variant_kernel`` is the shipped kernel's few-row loop (layers/quant/quant_matmul_kernel.py ``_quant_matmul_kernel``)
with MODE's conversion in place of ``weight_tile``, its tile stored by the shipped ``store_tile``: a copy of the loop
kept here so that the measurement can be run again (gpu_2026-12-01g's README has its figures).

Each time is one call's share of a CUDA graph of 8 calls on 8 distinct weights (more bytes than L2 holds),
the median of the replays (fp8_projection_settings.py ``graph_us``); each variant's output is first checked
against torch's product on the dequantized weight. The floor is the fp8 bytes and the float32 scales over 4.8
TB/s.

    PYTHONPATH=. python3 benchmarks/scripts/fp8_dequant_variants.py [--out OUT.json]"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from fp8_projection_settings import CALLS, graph_us

from outpace.layers.quant import quant_matmul_kernel as qm
from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block
from outpace.layers.quant.quant_matmul_kernel import (
    few_row_tiles,
    scale_rows,
    store_tile,
    weight_tile,
)
from outpace.layers.zeroed_scratch import zeroed_scratch

BLOCK = (128, 128)
HBM_BYTES_PER_S = 4.8e12
SHAPES = {
    "qwen3-next in_proj_qkvz": (12288, 2048),
    "step-3.5 tp2 q_proj": (6144, 4096),
    "llama-8b down_proj": (4096, 14336),
    "deepseek-v2-lite q": (3072, 2048),
    "deepseek-v2-lite o": (2048, 2048),
    "deepseek-v2-lite kv_a": (576, 2048),
    "qwen3-next out_proj": (2048, 4096),
}
MODES = ("f32", "cvt_acc", "bits_acc", "bits_elem", "w8a8", "shipped")
# (columns a program, K step, warps, stages, programs an SM)
SETTINGS = [
    (32, 128, 4, 4, 8),
    (64, 128, 4, 4, 8),
    (64, 128, 4, 6, 4),
    (64, 128, 4, 4, 4),
    (128, 128, 8, 4, 4),
    (32, 128, 4, 6, 16),
    (64, 128, 8, 6, 8),
    (32, 64, 4, 8, 8),
    (64, 64, 4, 8, 8),
    (64, 64, 4, 6, 16),
    (64, 256, 4, 3, 4),
]
ROWS = (1, 8)


@triton.jit
def e4m3_bytes_to_bf16(raw):
    """raw uint8 e4m3 bytes -> the same values in bf16, exact: the sign to bf16's top bit, the 4 exponent and
    3 mantissa bits shifted under bf16's 8 and 7 (a value times 2^-120, subnormals landing on bf16
    subnormals), then times 2^120 (bf16 0x7B80) by one fma a pair, which keeps bf16 subnormal inputs."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 lo, hi, m_lo, m_hi, s_lo, s_hi, rebias, zero;
        mov.b32 rebias, 0x7B807B80;
        mov.b32 zero, 0x80008000;
        prmt.b32 lo, 0, $2, 0x5040;
        prmt.b32 hi, 0, $2, 0x7060;
        shr.b32 m_lo, lo, 4;
        shr.b32 m_hi, hi, 4;
        and.b32 m_lo, m_lo, 0x07F007F0;
        and.b32 m_hi, m_hi, 0x07F007F0;
        lop3.b32 s_lo, lo, 0x80008000, m_lo, 0xEA;
        lop3.b32 s_hi, hi, 0x80008000, m_hi, 0xEA;
        fma.rn.bf16x2 $0, s_lo, rebias, zero;
        fma.rn.bf16x2 $1, s_hi, rebias, zero;
        }
        """,
        constraints="=r,=r,r",
        args=[raw],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit(do_not_specialize=["M"])
def _variant_kernel(
    x_ptr,
    w_ptr,  # [N, K] fp8 (MODE f32, cvt_acc) or the same bytes as uint8
    s_ptr,
    out_ptr,
    partial_ptr,
    counter_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_om,
    splits,
    k_per_split,
    MODE: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    row_tile, col_block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_tile * BM + tl.arange(0, BM)
    cols = col_block * BN + tl.arange(0, BN)
    n_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    s_rows = scale_rows(s_ptr, cols, stride_sn, "fp8_block", SCALE_BN)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_t = tl.zeros((BN, BM), dtype=tl.float32)  # (w8a8)
    k_start = split * k_per_split
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BK):
        ks = k0 + tl.arange(0, BK)
        x = tl.load(x_rows + ks[None, :], mask=(rows < M)[:, None] & (ks < K)[None, :], other=0.0)
        if MODE == "w8a8":
            wq = tl.load(w_rows + ks[None, :], mask=n_ok[:, None] & (ks < K)[None, :], other=0.0)
            scale = tl.load(s_rows + (k0 // SCALE_BK) * stride_sk, mask=n_ok[:, None], other=0.0)
            xf = x.to(tl.float32)
            sx = tl.maximum(tl.max(tl.abs(xf), axis=1), 1e-12) / 448.0  # [BM]
            xq = (xf / sx[:, None]).to(tl.float8e4nv)
            part = tl.dot(wq, tl.trans(xq))  # [BN, BM]
            acc_t += part * scale.to(tl.float32) * sx[None, :]
        elif MODE == "f32":
            w = weight_tile(
                w_rows, s_rows, k0, K, n_ok, stride_sk, "fp8_block", SCALE_BK, BK, tl.bfloat16
            )
            acc = tl.dot(x, tl.trans(w), acc)
        else:
            w_ok = n_ok[:, None] & (ks < K)[None, :]
            if MODE == "cvt_acc":
                raw = tl.load(w_rows + ks[None, :], mask=w_ok, other=0.0)
            else:
                raw = tl.load(w_rows + ks[None, :], mask=w_ok, other=0)
            scale = tl.load(s_rows + (k0 // SCALE_BK) * stride_sk, mask=n_ok[:, None], other=0.0)
            if MODE == "cvt_acc":
                acc += tl.dot(x, tl.trans(raw.to(tl.bfloat16))) * tl.trans(scale.to(tl.float32))
            elif MODE == "bits_acc":
                w = e4m3_bytes_to_bf16(raw)
                acc += tl.dot(x, tl.trans(w)) * tl.trans(scale.to(tl.float32))
            else:
                w = (e4m3_bytes_to_bf16(raw).to(tl.float32) * scale.to(tl.float32)).to(tl.bfloat16)
                acc = tl.dot(x, tl.trans(w), acc)
    if MODE == "w8a8":
        acc = tl.trans(acc_t)
    store_tile(
        acc, out_ptr, partial_ptr, counter_ptr, rows, cols, n_ok, M, N, stride_om, splits, SPLIT_K
    )


def launch(x, weight, scale, out, mode: str, setting) -> None:
    if mode.startswith(
        "shipped"
    ):  # shipped@BYTES: quant_matmul's launch prefetching BYTES of each row
        qm._PREFETCH_BYTES = int(mode.partition("@")[2] or qm._PREFETCH_BYTES)
        tiles = qm.plan(x.shape[0], weight.shape[0], x.shape[1], "fp8_block", BLOCK[1], x.device)
        qm._launch(x, weight, scale, "fp8_block", BLOCK, tiles, out)  # (quant_matmul's, into out)
        return
    m, k = x.shape
    n = weight.shape[0]
    bn, bk, warps, stages, per_sm = setting
    t = few_row_tiles(
        m,
        n,
        k,
        x.device,
        block_n=bn,
        block_k=bk,
        num_warps=warps,
        num_stages=stages,
        programs_per_sm=per_sm,
    )
    partial = torch.empty(t.splits, m, n, dtype=torch.float32, device=x.device)
    counters = zeroed_scratch("fp8_dequant_variants counters", x.device, 1 << 16, torch.int32)
    w = weight if mode in ("f32", "cvt_acc", "w8a8") else weight.view(torch.uint8)
    _variant_kernel[t.grid(m, n)](
        x,
        w,
        scale,
        out,
        partial,
        counters,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        scale.stride(0),
        scale.stride(1),
        out.stride(0),
        t.splits,
        t.k_per_split,
        MODE=mode,
        SCALE_BN=BLOCK[0],
        SCALE_BK=BLOCK[1],
        BM=t.block_m,
        BN=t.block_n,
        BK=t.block_k,
        SPLIT_K=t.splits > 1,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )


def variant_us(x, weights, dense, mode, setting) -> tuple[float | None, float | None]:
    """(us a call, relative error against torch's product on the dequantized weight), (None, err) where the
    output is wrong, (None, None) where it does not compile."""
    outs = [torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device) for w, _ in weights]
    try:
        launch(x, *weights[0], outs[0], mode, setting)
        ref = x.float() @ dense.T
        err = ((outs[0].float() - ref).norm() / ref.norm()).item()
        if not err < (6e-2 if mode == "w8a8" else 1e-2):
            return None, err
        us = graph_us(
            lambda: [launch(x, w, s, o, mode, setting) for (w, s), o in zip(weights, outs)]
        )
        return us, err
    except Exception as e:  # noqa: BLE001 (a setting that does not fit)
        print(f"    {mode} {setting}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--prefetch-bytes", nargs="+", type=int, help="shipped: once a value of _PREFETCH_BYTES"
    )
    args = parser.parse_args()
    if args.prefetch_bytes and "shipped" in args.modes:
        args.modes.remove("shipped")
        args.modes += [f"shipped@{b}" for b in args.prefetch_bytes]
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = []
        for _ in range(CALLS):
            dense = torch.randn(n, k, device=device) * 0.02
            weights.append(quantize_fp8_block(dense, BLOCK))
        dense = dequantize_fp8_block(*weights[0], BLOCK)
        floor = (n * k + weights[0][1].numel() * 4) / HBM_BYTES_PER_S * 1e6
        for m in ROWS:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            for mode in args.modes:
                settings = SETTINGS[:1] if mode.startswith("shipped") else SETTINGS
                timed = [(variant_us(x, weights, dense, mode, s), s) for s in settings]
                ok = [(us, err, s) for (us, err), s in timed if us is not None]
                bad = [(err, s) for (us, err), s in timed if us is None and err is not None]
                for err, s in bad:
                    print(
                        f"    {name} m={m} {mode} {s}: WRONG (relative error {err:.3g})", flush=True
                    )
                best = min(ok, key=lambda t: t[0]) if ok else None
                row = {
                    "shape": name,
                    "n": n,
                    "k": k,
                    "rows": m,
                    "mode": mode,
                    "floor_us": round(floor, 2),
                    "by_setting": {str(s): round(us, 2) for us, _, s in ok},
                    "best_us": round(best[0], 2) if best else None,
                    "best_setting": str(best[2]) if best else None,
                    "rel_err": best[1] if best else None,
                }
                rows.append(row)
                print(
                    f"{name:26s} m={m:2d} {mode:9s} best {row['best_us']} us {row['best_setting']} "
                    f"(floor {floor:.1f}) shipped-tiles {row['by_setting'].get(str(SETTINGS[0]))}",
                    flush=True,
                )
    print("\nshape | rows | " + " | ".join(args.modes) + " | floor")
    for name in SHAPES:
        for m in ROWS:
            best = {r["mode"]: r["best_us"] for r in rows if r["shape"] == name and r["rows"] == m}
            floor = next(r["floor_us"] for r in rows if r["shape"] == name)
            print(
                f"{name} | {m} | " + " | ".join(str(best[md]) for md in args.modes) + f" | {floor}"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
