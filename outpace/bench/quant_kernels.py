"""Quantized-weight kernels at real shapes (``python -m outpace.bench.quant_kernels``): the few-row FP8 and INT4
products (layers/quant/fp8_linear_kernel.py, int4_linear_kernel.py) beside bf16 F.linear on the same shape,
and the grouped experts over FP8 and INT4 stacks (layers/quant/moe_quant_kernels.py) at 1..64 tokens routed
over 256 experts, top 8. GPU time of one call captured in a CUDA graph, L2 flushed between calls
(triton.testing.do_bench), as bench/skinny.py times; bandwidth = the bytes the call must read (the weights
as stored, scales included; for the experts only the distinct experts the tokens chose) over that time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from outpace.bench.graph_timing import captured_call_us

# (N, K) of each product. DeepSeek-V3 (config.json: hidden 7168, q_lora_rank 1536, kv_lora_rank 512 +
# qk_rope_head_dim 64, 128 heads of 192 query / 128 value dims, moe_intermediate 2048, dense intermediate
# 18432); Qwen3-Next-80B-A3B (hidden 2048, 16 query heads and 2 KV heads of 256 dims with the output gate,
# linear attention 16 key / 32 value heads of 128, moe_intermediate 512).
SHAPES = {
    "deepseek_v3": {
        "q_a": (1536, 7168),
        "kv_a": (576, 7168),
        "q_b": (24576, 1536),
        "o": (7168, 16384),
        "dense_gate_up": (36864, 7168),
        "dense_down": (7168, 18432),
        "expert_gate_up": (4096, 7168),
        "expert_down": (7168, 2048),
    },
    "qwen3_next": {
        "qkv": (9216, 2048),
        "o": (2048, 4096),
        "linear_qkvz": (12288, 2048),
        "linear_out": (2048, 4096),
        "expert_gate_up": (1024, 2048),
        "expert_down": (2048, 512),
    },
}
ROWS = (1, 8, 32, 64)


def random_fp8(shape: tuple[int, ...], device="cuda") -> torch.Tensor:
    """Finite e4m3 values of both signs (bytes 0x00-0x7e, sign bit random), without a float32 copy."""
    magnitude = torch.randint(0, 0x7F, shape, dtype=torch.uint8, device=device)
    sign = torch.randint(0, 2, shape, dtype=torch.uint8, device=device) << 7
    return (magnitude | sign).view(torch.float8_e4m3fn)


def random_int4(shape: tuple[int, ...], device="cuda") -> torch.Tensor:
    """Packed int32 words of random nibbles."""
    return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device=device)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def report_linear(shapes: dict = SHAPES, rows=ROWS, formats=("fp8", "int4")) -> None:
    """Prints, for each shape and row count, the microseconds and TB/s of bf16 F.linear and of the
    quantized kernels (over their stored bytes)."""
    from outpace.layers.quant.fp8_linear_kernel import fp8_block_linear
    from outpace.layers.quant.int4_linear_kernel import int4_group_linear

    print(f"{'model':>12} {'shape':>15} {'M':>3} {'bf16 us':>8} {'TB/s':>5}", end="")
    for fmt in formats:
        print(f" {fmt + ' us':>8} {'TB/s':>5} {'x bf16':>6}", end="")
    print()
    for model, products in shapes.items():
        for name, (n, k) in products.items():
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            fp8 = random_fp8((n, k))
            fp8_scale = torch.rand(_cdiv(n, 128), _cdiv(k, 128), device="cuda") * 1e-3
            packed = random_int4((n, k // 8))
            int4_scale = torch.rand(n, k // 32, device="cuda", dtype=torch.bfloat16) * 1e-2
            calls = {
                "fp8": (
                    lambda x: fp8_block_linear(x, fp8, fp8_scale),
                    n * k + fp8_scale.numel() * 4,
                ),
                "int4": (
                    lambda x: int4_group_linear(x, packed, int4_scale),
                    n * k // 2 + int4_scale.numel() * 2,
                ),
            }
            for m in rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                bf16 = captured_call_us(lambda: F.linear(x, w))
                print(
                    f"{model:>12} {name:>15} {m:>3} {bf16:>8.1f} {2 * n * k / bf16 / 1e6:>5.2f}",
                    end="",
                )
                for fmt in formats:
                    fn, nbytes = calls[fmt]
                    t = captured_call_us(lambda: fn(x))
                    print(f" {t:>8.1f} {nbytes / t / 1e6:>5.2f} {bf16 / t:>6.2f}", end="")
                print()


def report_moe(
    tokens=(1, 2, 4, 8, 16, 32, 64), experts: int = 256, top_k: int = 8, hidden=7168, inter=2048
) -> None:
    """Prints the grouped experts' microseconds and TB/s over the distinct experts' bytes, FP8 block and
    INT4 stacks of DeepSeek-V3's shape (256 experts of hidden 7168, inter 2048, top 8)."""
    from outpace.layers.quant.moe_quant_kernels import (
        fp8_block_grouped_experts,
        int4_group_grouped_experts,
    )

    fp8 = (
        random_fp8((experts, 2 * inter, hidden)),
        torch.rand(experts, _cdiv(2 * inter, 128), _cdiv(hidden, 128), device="cuda") * 1e-3,
        random_fp8((experts, hidden, inter)),
        torch.rand(experts, _cdiv(hidden, 128), _cdiv(inter, 128), device="cuda") * 1e-3,
    )
    int4 = (
        random_int4((experts, 2 * inter, hidden // 8)),
        torch.rand(experts, 2 * inter, hidden // 32, device="cuda", dtype=torch.bfloat16) * 1e-2,
        random_int4((experts, hidden, inter // 8)),
        torch.rand(experts, hidden, inter // 32, device="cuda", dtype=torch.bfloat16) * 1e-2,
    )
    per_expert = {
        fmt: sum(t.nbytes for t in stacks) // experts  # weights and scales
        for fmt, stacks in (("fp8", fp8), ("int4", int4))
    }
    print(
        f"{'tokens':>6} {'experts read':>12} {'fp8 us':>8} {'TB/s':>5} {'int4 us':>8} {'TB/s':>5}"
    )
    g = torch.Generator().manual_seed(0)
    for n in tokens:
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(n)])
        distinct = ids.unique().numel()
        ids = ids.to(torch.int32).cuda()
        weights = torch.rand(n, top_k, device="cuda")
        x = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16) * 0.1
        t8 = captured_call_us(lambda: fp8_block_grouped_experts(x, weights, ids, *fp8))
        t4 = captured_call_us(lambda: int4_group_grouped_experts(x, weights, ids, *int4))
        print(
            f"{n:>6} {distinct:>12} {t8:>8.1f} {distinct * per_expert['fp8'] / t8 / 1e6:>5.2f} "
            f"{t4:>8.1f} {distinct * per_expert['int4'] / t4 / 1e6:>5.2f}"
        )


if __name__ == "__main__":
    report_linear()
    report_moe()
