"""layers/sampler.py's counter-based random numbers as Triton kernels (keys, uniforms, Gumbel noise), for the
GPU: the same bits as its torch code (which stays the CPU path and the reference:
tests/kernels/test_random_kernel.py), in one launch each instead of one launch per int64 operation (a
temperature-0.8 EAGLE3 step made about 150 of those, some 0.4 ms at batch 1 on the H100:
benchmarks/scripts/diag_spec_step.py).

splitmix64's finaliser and increment, as in sampler.py (Steele, Lea and Flood 2014), on uint64, where
shifts are logical and products wrap."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _mix64(x):
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _keys_kernel(seeds, counters, out, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    m = i < n
    seed = tl.load(seeds + i, mask=m).to(tl.uint64, bitcast=True)
    counter = tl.load(counters + i, mask=m).to(tl.uint64, bitcast=True)
    key = seed ^ _mix64(counter * 0x9E3779B97F4A7C15)
    tl.store(out + i, key.to(tl.int64, bitcast=True), mask=m)


@triton.jit
def _uniform_kernel(keys, out, num_cols, first_col, B: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * B + tl.arange(0, B)
    key = tl.load(keys + row).to(tl.uint64, bitcast=True)
    bits = _mix64(key + 0x9E3779B97F4A7C15 * (cols.to(tl.uint64) + first_col))
    u = ((bits >> 40) & 0xFFFFFF).to(tl.float32) * 5.9604644775390625e-08  # 24 bits, times 2 ** -24
    tl.store(out + row * num_cols + cols, u, mask=cols < num_cols)


@triton.jit
def _gumbel_kernel(keys, out, num_cols, first_col, B: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * B + tl.arange(0, B)
    key = tl.load(keys + row).to(tl.uint64, bitcast=True)
    bits = _mix64(key + 0x9E3779B97F4A7C15 * (cols.to(tl.uint64) + first_col))
    u = ((bits >> 40) & 0xFFFFFF).to(tl.float32) * 5.9604644775390625e-08  # as _uniform_kernel
    u = tl.maximum(u, 2.98023223876953125e-08)  # 2 ** -25: finite noise
    tl.store(out + row * num_cols + cols, -tl.log(-tl.log(u)), mask=cols < num_cols)


def random_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """sampler.random_keys.  # [n] int64"""
    seeds, counters = (t.contiguous() for t in torch.broadcast_tensors(seeds, counters))
    out = torch.empty_like(seeds)
    n = out.numel()
    if n:
        _keys_kernel[(triton.cdiv(n, BLOCK),)](seeds, counters, out, n, B=BLOCK)
    return out


def draw_uniform(keys: torch.Tensor, num_cols: int, stream: int) -> torch.Tensor:
    """sampler.draw_uniform with keys.  # [len(keys), num_cols] float32"""
    out = torch.empty(keys.shape[0], num_cols, dtype=torch.float32, device=keys.device)
    if out.numel() == 0:  # e.g. a chain step of no drafts: nothing to draw
        return out
    block = min(BLOCK, triton.next_power_of_2(num_cols))
    _uniform_kernel[(keys.shape[0], triton.cdiv(num_cols, block))](
        keys.contiguous(), out, num_cols, stream * (1 << 32) + 1, B=block
    )
    return out


def draw_gumbel(keys: torch.Tensor, num_cols: int, stream: int) -> torch.Tensor:
    """sampler.draw_gumbel: -log(-log(u)) of draw_uniform's u (the same bits; the logarithms may round
    differently from torch's in the last bit).  # [len(keys), num_cols] float32"""
    out = torch.empty(keys.shape[0], num_cols, dtype=torch.float32, device=keys.device)
    if out.numel() == 0:
        return out
    block = min(1024, triton.next_power_of_2(num_cols))
    _gumbel_kernel[(keys.shape[0], triton.cdiv(num_cols, block))](
        keys.contiguous(), out, num_cols, stream * (1 << 32) + 1, B=block
    )
    return out
