"""Routed experts as grouped GEMMs in Triton, without a host synchronisation (capturable in a CUDA graph).

``grouped_experts`` computes what layers/moe.py ``run_experts`` computes for experts whose weights are
stacked: gate and up [experts, inter, hidden] (any expert and row strides, the hidden dimension contiguous:
views of one packed gate/up tensor, or two stacks), or up alone for ungated experts, and down [experts,
hidden, inter]. The activation between the two projections is a constexpr (``ACTIVATIONS``), computed in
float32 on the projections' float32 accumulators:
- "silu": silu(gate) * up (DeepSeek, Qwen3-Next, Step-3.5);
- "gelu_tanh": gelu_tanh(gate) * up, 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (Gemma 4's
  gelu_pytorch_tanh), written as g * sigmoid(2 sqrt(2 / pi) (g + 0.044715 g^3)) (0.5 (1 + tanh z) =
  sigmoid(2 z));
- "relu2": relu(up)^2, no gate (Nemotron-H);
- with ``limit`` L (Step-3.5's swiglu_limits, vLLM SwigluStepAndMul): act(gate).clamp(max=L) * up.clamp(-L, L).
Three kernels, every grid fixed by the shapes:

1. ``_align_kernel`` (one program): sorts the n * top_k (token, slot) pairs by expert into blocks of
   BLOCK_M rows, each expert's pairs padded to a whole number of blocks, so that a block holds one
   expert's pairs only. The number of blocks depends on the routing, but never exceeds
   max_blocks = (pairs + min(experts, pairs) * (BLOCK_M - 1)) // BLOCK_M (each expert in use adds at most
   one partly filled block; vLLM's moe_align_block_size bounds its padded length the same way), so the
   grid is sized for that and the blocks past the routing's last are marked expert -1.
2. ``_gate_up_kernel``, grid (max_blocks, inter / BLOCK_N): a block's rows times its expert's gate and up
   rows (up only when ungated), the activation, into an intermediate row per pair slot.
3. ``_down_kernel``, grid (max_blocks, hidden / BLOCK_N): the intermediate rows times the expert's down
   weight, times the pair's routing weight, into one float32 row per pair; the top_k rows of a token are
   then summed in slot order (no atomics: the same inputs give the same bits).

An expert's weights are read once per block, however many of the block's rows use them: at a decode or
verify batch (a few tokens, each expert in use seen by at most BLOCK_M pairs) a forward reads the weights
of the experts in use once, which is what its cost is measured against (bench/deepseek_shape.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_SMALL_BLOCK_M = (
    16  # rows per block when the experts see few pairs each (decode, verify): tl.dot's minimum
)
_LARGE_BLOCK_M = (
    64  # rows per block for prefill-sized batches: fewer re-reads of each expert's weights
)
ACTIVATIONS = ("silu", "gelu_tanh", "relu2")  # the kernels' expert activations (module docstring)


@triton.jit
def _align_kernel(
    ids_ptr,  # [pairs] int64: expert of pair p = (token p // top_k, slot p % top_k)
    sorted_pairs_ptr,  # [max_blocks * BLOCK_M] int32, written: pair per row, pairs if padding
    block_expert_ptr,  # [max_blocks] int32, written: each block's expert, -1 past the last
    pairs,
    max_blocks,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program. Pairs keep their order within an expert (stable), rows past an expert's pairs hold
    the sentinel ``pairs``."""
    experts = tl.arange(0, BLOCK_E)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros([BLOCK_E], tl.int32)
    for start in range(0, pairs, CHUNK):
        ids = tl.load(ids_ptr + start + offs, mask=start + offs < pairs, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M  # [BLOCK_E]
    first_block = tl.cumsum(blocks, axis=0) - blocks  # [BLOCK_E] exclusive
    last_block = first_block + blocks
    for start in range(0, max_blocks * BLOCK_M, CHUNK):  # every row: padding first
        tl.store(
            sorted_pairs_ptr + start + offs,
            tl.full([CHUNK], 0, tl.int32) + pairs,
            mask=start + offs < max_blocks * BLOCK_M,
        )
    for start in range(0, max_blocks, CHUNK):
        b = start + offs
        inside = (b[:, None] >= first_block[None, :]) & (
            b[:, None] < last_block[None, :]
        )  # [CHUNK, BLOCK_E]
        expert = (
            tl.sum(tl.where(inside, experts[None, :] + 1, 0), axis=1) - 1
        )  # -1: past the last block
        tl.store(block_expert_ptr + b, expert, mask=b < max_blocks)
    tl.debug_barrier()  # the padding rows are written before the pairs overwrite theirs
    seen = tl.zeros([BLOCK_E], tl.int32)  # pairs of each expert placed so far
    for start in range(0, pairs, CHUNK):
        ids = tl.load(ids_ptr + start + offs, mask=start + offs < pairs, other=-1).to(tl.int32)
        hit = (ids[:, None] == experts[None, :]).to(tl.int32)  # [CHUNK, BLOCK_E]
        rank = tl.cumsum(hit, axis=0) - hit + seen[None, :]  # earlier pairs of the same expert
        row = tl.sum(hit * (first_block[None, :] * BLOCK_M + rank), axis=1)  # [CHUNK]
        tl.store(sorted_pairs_ptr + row, start + offs, mask=start + offs < pairs)
        seen += tl.sum(hit, axis=0)


@triton.jit
def _block_rows(sorted_pairs_ptr, block_expert_ptr, pairs, BLOCK_M: tl.constexpr):
    """The program's block: its expert (-1: no block), its rows' pair slots and pairs, which rows are real."""
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    slots = block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of the block
    pair = tl.load(sorted_pairs_ptr + slots)
    return expert, slots, pair, pair < pairs


@triton.jit
def _activation(gate, up, limit, ACT: tl.constexpr, GATED: tl.constexpr, CLAMP: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32 projections -> the expert's intermediate (module docstring)."""
    h = gate if GATED else up
    if ACT == "silu":
        h = h * tl.sigmoid(h)
    elif ACT == "gelu_tanh":
        h = h * tl.sigmoid(1.5957691216057308 * (h + 0.044715 * h * h * h))  # 2 * sqrt(2 / pi)
    else:  # "relu2"
        h = tl.maximum(h, 0.0)
        h = h * h
    if GATED:
        if CLAMP:
            h = tl.minimum(h, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        h = h * up
    return h


@triton.jit(do_not_specialize=["pairs"])
def _gate_up_kernel(
    x_ptr,  # [n, hidden]
    gate_ptr,  # [experts, inter, hidden] (read only when GATED)
    up_ptr,  # [experts, inter, hidden]
    act_ptr,  # [max_blocks * BLOCK_M, inter], written for the real rows
    sorted_pairs_ptr,
    block_expert_ptr,  # from _align_kernel
    pairs,
    inter,
    hidden,
    limit,
    stride_xt,
    stride_ge,
    stride_gn,
    stride_ue,
    stride_un,
    stride_act,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    ACT: tl.constexpr,
    GATED: tl.constexpr,
    CLAMP: tl.constexpr,
):
    expert, slots, pair, row_ok = _block_rows(sorted_pairs_ptr, block_expert_ptr, pairs, BLOCK_M)
    if expert >= 0:
        token = pair // TOP_K
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(
            0, BLOCK_N
        )  # [BLOCK_N] intermediate columns
        n_ok = offs_n < inter
        offs_k = tl.arange(0, BLOCK_K)
        e = expert.to(tl.int64)
        gate_rows = gate_ptr + e * stride_ge + offs_n[:, None] * stride_gn  # [BLOCK_N, 1]
        up_rows = up_ptr + e * stride_ue + offs_n[:, None] * stride_un
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < hidden
            x = tl.load(
                x_ptr + token[:, None] * stride_xt + k[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )  # [BLOCK_M, BLOCK_K]
            w_ok = n_ok[:, None] & k_ok[None, :]
            if GATED:
                w_gate = tl.load(gate_rows + k[None, :], mask=w_ok, other=0.0)  # [BLOCK_N, BLOCK_K]
                gate = tl.dot(x, tl.trans(w_gate), gate, input_precision=PRECISION)
            w_up = tl.load(up_rows + k[None, :], mask=w_ok, other=0.0)
            up = tl.dot(x, tl.trans(w_up), up, input_precision=PRECISION)
        act = _activation(gate, up, limit, ACT, GATED, CLAMP)  # [BLOCK_M, BLOCK_N] float32
        tl.store(
            act_ptr + slots[:, None] * stride_act + offs_n[None, :],
            act.to(act_ptr.dtype.element_ty),
            mask=row_ok[:, None] & n_ok[None, :],
        )


@triton.jit(do_not_specialize=["pairs"])
def _down_kernel(
    act_ptr,  # [max_blocks * BLOCK_M, inter]
    w_ptr,  # [experts, hidden, inter]
    weights_ptr,  # [pairs] float32: the routing weight of each pair
    out_ptr,  # [pairs, hidden] float32, written
    sorted_pairs_ptr,
    block_expert_ptr,
    pairs,
    inter,
    hidden,
    stride_act,
    stride_we,
    stride_wn,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    expert, slots, pair, row_ok = _block_rows(sorted_pairs_ptr, block_expert_ptr, pairs, BLOCK_M)
    if expert >= 0:
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] hidden columns
        n_ok = offs_n < hidden
        offs_k = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None] * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < inter
            a = tl.load(
                act_ptr + slots[:, None] * stride_act + k[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )  # [BLOCK_M, BLOCK_K]
            w = tl.load(
                w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0
            )  # [BLOCK_N, BLOCK_K]
            acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
        weight = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)  # [BLOCK_M]
        tl.store(
            out_ptr + pair[:, None] * stride_out + offs_n[None, :],
            acc * weight[:, None],
            mask=row_ok[:, None] & n_ok[None, :],
        )


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the blocks ``_align_kernel`` fills (module docstring), whatever the routing."""
    return (pairs + min(num_experts, pairs) * (block_m - 1)) // block_m


def grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate: torch.Tensor | None,
    up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
    limit: float | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """x [n, hidden]; weights [n, top_k] float32; ids [n, top_k] int; gate (None: ungated experts) and up
    [experts, inter, hidden]; down [experts, hidden, inter] (x's dtype, each with its last dimension
    contiguous); ``activation`` one of ``ACTIVATIONS``, ``limit`` the optional clamp (module docstring) ->
    sum over slots j of weights[:, j] times expert ids[:, j] applied to x: [n, hidden] in x's dtype,
    accumulated in float32 (the intermediate rounded to x's dtype, as the eager experts round it). No host
    synchronisation."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"grouped experts compute {', '.join(ACTIVATIONS)}, not {activation!r}")
    if gate is None and limit is not None:
        raise ValueError("the clamp limit applies to gated experts only")
    n, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = down.shape[0], down.shape[2]
    assert up.stride(-1) == 1 and down.stride(-1) == 1 and (gate is None or gate.stride(-1) == 1)
    gate_w = up if gate is None else gate  # (not read when ungated)
    pairs = n * top_k
    block_m = _SMALL_BLOCK_M if pairs <= _SMALL_BLOCK_M * num_experts else _LARGE_BLOCK_M
    blocks = max_blocks(pairs, num_experts, block_m)
    x = x if x.stride(-1) == 1 else x.contiguous()
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=x.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=x.device)
    _align_kernel[(1,)](
        ids.reshape(-1),
        sorted_pairs,
        block_expert,
        pairs,
        blocks,
        NUM_EXPERTS=num_experts,
        BLOCK_E=max(16, triton.next_power_of_2(num_experts)),
        BLOCK_M=block_m,
        CHUNK=128,
    )
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    fp32 = x.dtype == torch.float32
    block_k = 32 if fp32 else 128
    act = torch.empty(blocks * block_m, inter, dtype=x.dtype, device=x.device)
    bn_up = block_n or (32 if fp32 or block_m == _SMALL_BLOCK_M else 64)
    _gate_up_kernel[(blocks, triton.cdiv(inter, bn_up))](
        x,
        gate_w,
        up,
        act,
        sorted_pairs,
        block_expert,
        pairs,
        inter,
        hidden,
        float(limit or 0.0),
        x.stride(0),
        gate_w.stride(0),
        gate_w.stride(1),
        up.stride(0),
        up.stride(1),
        act.stride(0),
        TOP_K=top_k,
        BLOCK_M=block_m,
        BLOCK_N=bn_up,
        BLOCK_K=block_k,
        PRECISION=precision,
        ACT=activation,
        GATED=gate is not None,
        CLAMP=limit is not None,
        num_warps=4,
        num_stages=2 if fp32 else 4,
    )
    out = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    bn_down = block_n or (32 if fp32 else 64)
    _down_kernel[(blocks, triton.cdiv(hidden, bn_down))](
        act,
        down,
        weights.reshape(-1).float(),
        out,
        sorted_pairs,
        block_expert,
        pairs,
        inter,
        hidden,
        act.stride(0),
        down.stride(0),
        down.stride(1),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=bn_down,
        BLOCK_K=block_k,
        PRECISION=precision,
        num_warps=4,
        num_stages=2 if fp32 else 4,
    )
    return out.view(n, top_k, hidden).sum(dim=1).to(x.dtype)
