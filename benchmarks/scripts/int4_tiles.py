"""Tiles for INT4 weights (compressed-tensors pack-quantized, group 32, bf16 scales: Kimi-K2-Thinking's layout) on
one GPU: the grouped experts' gate/up and down kernels (layers/moe_kernels.py ``few_token_gate_up`` /
``few_token_down`` and their INT4 pair) at a few tokens, and the few-row product (layers/quant/quant_matmul_kernel.py
``few_row_tiles``) at a few rows, for candidate (BLOCK_N, BLOCK_K, warps, stages).

- Experts: Kimi-K2's / DeepSeek-V3's (hidden 7168, intermediate 2048, top 8) over STACKED experts, each token's
  8 distinct; one call's microseconds (bench/graph_timing.py ``captured_call_us``: captured, L2 flushed between calls) and
  TB/s of the distinct experts' packed bytes and scales. A setting pairs a gate/up candidate with a down one.
- Dense: products of (N, K) at 1, 8 and 16 rows, microseconds and TB/s of the packed bytes and scales.
Every setting's output is checked against the shipped setting's first (the same dequantized values; K steps of
another width sum in another order).

With ``--a3b``: the shipped tiles alone over Qwen3-30B-A3B's experts in groups of 128 (RedHatAI's w4a16).
With ``--one-row``: one token's experts and one row's products on the CUDA cores (ONE-ROW) against the 16-row
tiles, for the one-row settings ``ONE_ROW_TILES``.

    PYTHONPATH=. python3 benchmarks/scripts/int4_tiles.py OUT.json [--tokens N ...] [--one-row | --a3b]"""

from __future__ import annotations

import argparse
import json
import time

import torch

from outpace.bench.graph_timing import captured_call_us
from outpace.bench.quant_kernels import random_int4
from outpace.layers import moe_kernels as mk
from outpace.layers.quant import quant_matmul_kernel as qm
from outpace.layers.quant.int4_linear_kernel import int4_group_linear
from outpace.layers.quant.moe_quant_kernels import int4_group_grouped_experts

GROUP = 32
HIDDEN, INTER, TOP_K, STACKED = 7168, 2048, 8, 64
EXPERT_TILES = [  # (BLOCK_N, BLOCK_K, warps, stages) candidates beside the shipped
    (32, 128, 4, 4),
    (64, 128, 4, 4),
    (64, 128, 4, 3),
    (32, 256, 4, 3),
    (64, 256, 4, 3),
    (64, 256, 8, 3),
    (128, 128, 8, 3),
    (128, 256, 8, 3),
    (64, 512, 8, 2),
]
DENSE = {
    "kimi expert_gate_up": (4096, 7168),
    "kimi expert_down": (7168, 2048),
    "v3 o": (7168, 16384),
}
DENSE_TILES = [  # few_row_tiles' (block_n, block_k, num_warps, num_stages); the first the shipped (plan's)
    None,
    (64, 128, 4, 4),
    (64, 256, 4, 3),
    (32, 512, 4, 3),
    (64, 512, 8, 3),
    (128, 256, 8, 3),
]


def expert_stacks(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    def scale(*shape):
        return (torch.rand(*shape, generator=gen) * 1e-2).to(torch.bfloat16).cuda()

    return (
        random_int4((STACKED, 2 * INTER, HIDDEN // 8)),
        scale(STACKED, 2 * INTER, HIDDEN // GROUP),
        random_int4((STACKED, HIDDEN, INTER // 8)),
        scale(STACKED, HIDDEN, INTER // GROUP),
    )


def dense_weight(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A random INT4 [n, k] weight: (packed words, bf16 scales, their bytes)."""
    packed = random_int4((n, k // 8))
    scale = (torch.rand(n, k // GROUP, generator=gen) * 1e-2).to(torch.bfloat16).cuda()
    return packed, scale, packed.nbytes + scale.nbytes


def checked_us(call, reference: torch.Tensor | None) -> tuple[torch.Tensor, float, float]:
    """call()'s output in float32, its relative error against ``reference`` (0 without one: it is the reference)
    and the microseconds a call takes."""
    out = call().float()
    err = 0.0 if reference is None else ((out - reference).norm() / reference.norm()).item()
    return out, err, captured_call_us(call)


def experts_sweep(tokens_list: list[int], candidates: bool = True) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    stacks = expert_stacks(gen)
    per_expert = sum(t.nbytes for t in stacks) // STACKED
    shipped = (mk.int4_few_token_gate_up, mk.int4_few_token_down)
    rows = []
    for tokens in tokens_list:
        ids = torch.stack([torch.randperm(STACKED, generator=gen)[:TOP_K] for _ in range(tokens)])
        distinct = ids.unique().numel()
        ids = ids.to(torch.int32).cuda()
        weights = torch.rand(tokens, TOP_K, generator=gen).cuda()
        x = (torch.randn(tokens, HIDDEN, generator=gen) * 0.1).to(torch.bfloat16).cuda()
        reference = None
        # the shipped pair, then each candidate for the gate/up kernel (the shipped down), then for the down
        settings = [shipped]
        if candidates:
            settings += [(c, shipped[1]) for c in EXPERT_TILES] + [
                (shipped[0], c) for c in EXPERT_TILES
            ]
        for setting in settings:
            mk.int4_few_token_gate_up, mk.int4_few_token_down = setting
            try:
                out, err, us = checked_us(
                    lambda: int4_group_grouped_experts(x, weights, ids, *stacks, GROUP), reference
                )
                reference = out if reference is None else reference
            except Exception as e:  # (a setting that does not compile is reported, not fatal)
                rows.append(
                    dict(tokens=tokens, gate_up=setting[0], down=setting[1], error=repr(e)[:200])
                )
                print(tokens, setting, "failed", repr(e)[:120], flush=True)
                continue
            tbs = distinct * per_expert / us / 1e6
            rows.append(
                dict(tokens=tokens, gate_up=setting[0], down=setting[1], us=us, tb_per_s=tbs,
                     distinct=distinct, rel_error=err, shipped=setting == shipped)
            )  # fmt: skip
            print(f"experts {tokens:>3} {str(setting):>40} {us:8.1f} us {tbs:5.2f} TB/s err {err:.1e}",
                  flush=True)  # fmt: skip
    mk.int4_few_token_gate_up, mk.int4_few_token_down = shipped
    return rows


def dense_sweep() -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(1)
    for name, (n, k) in DENSE.items():
        packed, scale, nbytes = dense_weight(n, k, gen)
        for m in (1, 8, 16):
            x = (torch.randn(m, k, generator=gen) * 0.1).to(torch.bfloat16).cuda()
            reference = int4_group_linear(x, packed, scale, GROUP).float()
            for tiles in DENSE_TILES:
                t = None
                if tiles is not None:
                    bn, bk, warps, stages = tiles
                    t = qm.few_row_tiles(m, n, k, x.device, block_n=bn, block_k=bk, num_warps=warps,
                                         num_stages=stages)  # fmt: skip
                try:
                    _, err, us = checked_us(
                        lambda: qm.quant_matmul(x, packed, scale, "int4_group", (1, GROUP), t),
                        reference,
                    )
                except Exception as e:
                    rows.append(dict(shape=name, rows=m, tiles=tiles, error=repr(e)[:200]))
                    print(name, m, tiles, "failed", repr(e)[:120], flush=True)
                    continue
                rows.append(dict(shape=name, rows=m, tiles=tiles, us=us, tb_per_s=nbytes / us / 1e6,
                                 rel_error=err, shipped=tiles is None))  # fmt: skip
                print(f"dense {name:>20} {m:>3} {str(tiles):>22} {us:8.1f} us "
                      f"{nbytes / us / 1e6:5.2f} TB/s err {err:.1e}", flush=True)  # fmt: skip
    return rows


# One row on the CUDA cores (``--one-row``: quant_matmul_kernel.py ``_int4_row_part``) against the 16-row tiles: the
# one-row settings (BN, BK, warps, stages, programs an SM, K steps a split at least; the experts' take the first
# four): the first the products' shipped (quant_matmul_kernel.one_row_tiles), the sixth the experts'
# (moe_kernels.int4_one_token_gate_up / _down)
ONE_ROW_TILES = [
    (16, 512, 2, 1, 8, 1),
    (16, 1024, 2, 1, 8, 1),
    (16, 256, 2, 1, 8, 1),
    (32, 512, 4, 1, 8, 1),
    (16, 512, 4, 1, 8, 1),
    (8, 512, 1, 1, 8, 1),
    (16, 512, 2, 2, 8, 1),
]


def one_row_sweep() -> list[dict]:
    """One token's grouped experts and one row's products: the 16-row tiles (ONE-ROW off) and each one-row
    setting (the experts': gate/up and down alike)."""
    rows = []
    gen = torch.Generator().manual_seed(2)
    stacks = expert_stacks(gen)
    per_expert = sum(t.nbytes for t in stacks) // STACKED
    ids = torch.randperm(STACKED, generator=gen)[:TOP_K][None].to(torch.int32).cuda()
    weights = torch.rand(1, TOP_K, generator=gen).cuda()
    x = (torch.randn(1, HIDDEN, generator=gen) * 0.1).to(torch.bfloat16).cuda()
    shipped = (mk.int4_one_token_gate_up, mk.int4_one_token_down)
    reference = None
    for tiles in [None, *ONE_ROW_TILES]:
        mk.one_token_cuda_cores = tiles is not None
        if tiles is not None:
            mk.int4_one_token_gate_up = mk.int4_one_token_down = tiles[:4]
        out, err, us = checked_us(
            lambda: int4_group_grouped_experts(x, weights, ids, *stacks, GROUP), reference
        )
        reference = out if reference is None else reference
        tbs = TOP_K * per_expert / us / 1e6
        rows.append(dict(what="experts", tiles=tiles, us=us, tb_per_s=tbs, rel_error=err))
        print(
            f"one token's experts {str(tiles):>26} {us:8.1f} us {tbs:5.2f} TB/s err {err:.1e}",
            flush=True,
        )
    mk.one_token_cuda_cores, (mk.int4_one_token_gate_up, mk.int4_one_token_down) = True, shipped
    for name, (n, k) in DENSE.items():
        packed, scale, nbytes = dense_weight(n, k, gen)
        x = (torch.randn(1, k, generator=gen) * 0.1).to(torch.bfloat16).cuda()
        reference = None
        for tiles in [None, *ONE_ROW_TILES]:
            if tiles is None:  # the 16-row tiles (plan's for two rows)
                t = qm.plan(2, n, k, "int4_group", GROUP, x.device)
            else:
                bn, bk, warps, stages, per_sm, steps = tiles
                t = qm.few_row_tiles(1, n, k, x.device, block_n=bn, block_k=bk, num_warps=warps,
                                     num_stages=stages, programs_per_sm=per_sm, min_split_steps=steps,
                                     one_row=True)  # fmt: skip
            out, err, us = checked_us(
                lambda: qm.quant_matmul(x, packed, scale, "int4_group", (1, GROUP), t), reference
            )
            reference = out if reference is None else reference
            rows.append(
                dict(what=name, tiles=tiles, us=us, tb_per_s=nbytes / us / 1e6, rel_error=err)
            )
            print(f"{name:>20} {str(tiles):>26} {us:8.1f} us {nbytes / us / 1e6:5.2f} TB/s err {err:.1e}",
                  flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument(
        "--one-row", action="store_true", help="only the one-row settings against the 16-row tiles"
    )
    ap.add_argument(
        "--a3b",
        action="store_true",
        help="the shipped tiles alone over Qwen3-30B-A3B's experts in RedHatAI's w4a16 layout (groups of 128, "
        "a K step in one group: moe_kernels.py SCALES AHEAD), no dense products",
    )
    args = ap.parse_args()
    start = time.time()
    result = {"device": torch.cuda.get_device_name()}
    if args.a3b:
        # huggingface.co/Qwen/Qwen3-30B-A3B config.json: hidden 2048, moe_intermediate_size 768, 128 experts, top 8
        global GROUP, HIDDEN, INTER, STACKED
        GROUP, HIDDEN, INTER, STACKED = 128, 2048, 768, 128
        result["experts"] = experts_sweep(args.tokens, candidates=False)
    elif args.one_row:
        result["one_row"] = one_row_sweep()
    else:
        result["experts"] = experts_sweep(args.tokens)
        result["dense"] = dense_sweep()
    result["seconds"] = time.time() - start
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
