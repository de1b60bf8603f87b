"""A mixture's routing in Triton (layers/router.py ``Router`` on CUDA): two launches per layer, no host
synchronisation, every grid fixed by the shapes (capturable in a CUDA graph at every verify width). Both use
programmatic dependent launch on Hopper (layers/pdl.py): the logits' programs bring their router weight rows
into L2 while the kernel before them drains, then wait for it; the route kernel waits before anything.

1. ``_router_logits_kernel``, grid (token blocks, expert blocks, hidden splits): float32 partial router
   logits, x (any dtype, converted in registers: no float32 copy of x) times the float32 router weight,
   each split of the hidden dimension into its own [tokens, experts] slice. The router weight is the only
   large read of routing (DeepSeek-V2-Lite 64 x 2048 x 4 B = 0.5 MB, V3 256 x 7168 x 4 B = 7.3 MB): split
   over up to 264 programs it streams at the device's bandwidth, where the one program of step 2 would
   read it at one SM's (microseconds to tens of microseconds). So the matvec keeps its own launch. Up to
   one block of tokens (decode, verify; in batch-invariant mode at every count, block by block) a program
   sums its products across the columns (a reduction tree) token by token, the weight tile read once: a
   float32 ``tl.dot`` takes its K steps one after the other in each thread, 256 dependent steps a program
   (on an H200 12 us a layer for Qwen3-Next's 4.2 MB router weight, 23 us for DeepSeek-V3's 7.3 MB:
   benchmarks/results/gpu_2026-11-29e/call1).
2. ``_route_kernel``: the split logits summed in split order (deterministic), the scores (softmax or
   sigmoid), the selection scores (+ ``e_score_correction_bias``), the group limit (groups scored by their
   best expert, "max", or the sum of their two best, "top2_sum"; the ``top_groups`` best kept), the top_k (by
   top_k rounds of a max, or from ``sorted_top_k_experts`` experts without a bias one partial sort), the weights (the uncorrected scores, renormalised with ``normalize``, times ``scaling``), as layers/moe.py
   ``Router.reference`` computes them. Up to ``FUSED_LAYOUT_TOKENS`` tokens (decode, verify) one program of
   ``token_route_warps`` warps a token (1 up to 256 experts, 8 past 64 tokens), all in parallel; up
   to 64 tokens a token's bits are then those it gets routed alone, whatever the batch. Beyond
   ``FUSED_LAYOUT_TOKENS`` (prefill) one program of 8 warps per block of tokens.
3. The block layout of the grouped-expert kernels (layers/expert_blocks.py ``BlockLayout``, shared-expert
   slots included) in the same launch, up to ``FUSED_LAYOUT_TOKENS`` tokens: each token's program sets its
   bit in the token mask of every expert it chose (integer atomic ORs: the same masks in any order; token
   t's bit is bit t % 64 of the mask's int64 word t // 64, so 65 to 128 tokens, a batch of 32 verifying 3
   or 4 tokens each, use a second word), then
   takes a ticket (an atomic add); the program that draws the last one has seen every other program
   finish, zeroes the ticket and places every pair from the masks (``place_pairs_by_token_masks``: the
   layout ``align`` writes, bit for bit), zeroing the masks. The ticket and the masks live in a buffer per
   device and expert count (``layout_scratch``), zero between launches, which the launches on a device
   share (layers/zeroed_scratch.py: they must not overlap). Memory order (the PTX memory
   model; CUDA's cooperative-groups grid barrier follows the same pattern): a program's threads write their
   ids and set their bits, meet at a barrier, and then one thread takes the ticket with acq_rel at gpu
   scope, a release cumulative over what the barrier ordered before it; the last ticket's acquire, shared
   with the program's other threads through a barrier, orders every program's writes, its own included,
   before the layout's reads, which are volatile besides (L1 is not coherent across SMs). A single token
   (decode at batch 1) needs none of it: its program writes the layout from the experts in its registers
   (``place_one_token``: each chosen expert one block), no mask, ticket or read back, where the masks and
   the ticket are a chain of round trips through L2. Beyond ``FUSED_LAYOUT_TOKENS`` (prefill) the layout is
   ``expert_blocks.align``'s own launch. (At 64 tokens this launch routed and laid out Qwen3-Next's 512 experts
   in 8.5 us on an H200, at 65, then past the bound of one word, the block route and align took 57.6:
   benchmarks/scripts/routing_timings.py, gpu_2026-12-04d call 5. The bound is 128 since; those counts were
   not timed yet.)
   Triton's interpreter (the CPU tests) runs the programs one after the other, so it checks the layout
   and the ticket's reset, not the ordering.
4. Expert parallel (layers/moe.py ``ExpertPlacement``: this rank holds experts first .. first + count - 1
   of them all): routing as above over every expert, the ids written as chosen, and the layout of this
   rank's experts only, in the same launch. Each token's program also writes its experts as local
   indices (e - first, -1 for another rank's: ``ExpertPlacement.local_ids``) after the ids, sets the mask
   bits of its local experts only (the shared slots' masks follow the count local ones) and the layout is
   placed from the local ids: the other ranks' slots in no block, the grouped kernels' experts 0 .. count
   - 1 this rank's stacks and count .. the shared slots. Beyond ``FUSED_LAYOUT_TOKENS`` ``align`` of the
   local ids. So a rank's routing is the same two launches as one GPU's, no torch op between them and the
   grouped kernels.
5. Rows that route nowhere (layers/routed_rows.py): as 4., the layout of the local ids, each of a masked row's
   -1 (its ids and weights still written as chosen), so that its routed slots are in no block and skipped.

Two options for routers beyond DeepSeek's (Gemma 4's: transformers Gemma4TextRouter):
- ``RouterInputNorm``: the router reads RMSNorm(x) (no weight) times a per-column scale and a constant.
  Folded into the two launches: the matvec reads x times the column scale and also sums x^2 over its
  split of the hidden dimension (one more column of the partial logits); the route kernel multiplies each
  token's summed logits by constant * rsqrt(mean(x^2) + eps), the norm's one number a token, before
  scoring. No normalised copy of x is written.
- ``expert_scale`` [experts]: each chosen expert's weight times its entry, after the renormalisation and
  the scaling (Gemma 4's per_expert_scale).

One for a block on a fused residual stack (layers/moe.py ``RowNorm``): x is the stream times its norm's
weight (``NormedRows.normed``, layers/normed_rows.py) and the norm's sums of squares come in parts; the
route kernel multiplies each token's summed logits (the shared gate's too) by rsqrt(mean(s^2) + eps) and
writes that factor, which the grouped gate/up kernel applies to its products: the norm costs no launch.

One for a shared expert with a gate of its own (Qwen3-Next's: transformers
Qwen3NextSparseMoeBlock, ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``): ``shared_gate``, the
router weight with the gate's row appended ([experts + 1, hidden]), so that the matvec computes the gate's
logit as one more column; the route kernel leaves it out of the scores and writes sigmoid(it) as the weight
of each of the token's ``num_shared`` fused shared slots (layers/moe_kernels.py), after its top_k weights.

Ties: a top-k takes the largest value first and, among equal values, the lowest index (expert or group);
the chosen experts are written in that order (largest selection score first). torch.topk leaves the order
of ties unspecified, so on scores without ties (random scores, as the tests use) both choose the same set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import torch
import triton
import triton.language as tl

from outpace.attention.context import batch_invariant
from outpace.layers.expert_blocks import (
    BlockLayout,
    align,
    place_one_token,
    place_pairs_by_token_masks,
)
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options, prefetch_l2
from outpace.layers.routed_rows import routed_mask
from outpace.layers.zeroed_scratch import zeroed_scratch

if TYPE_CHECKING:
    from outpace.layers.moe import ExpertPlacement, RowNorm

# up to this many tokens one program routes each token and routing writes the block layout itself
# (module docstring 2. and 3.); at most 64 * MAX_MASK_WORDS, the bits of an expert's token mask
FUSED_LAYOUT_TOKENS = 128
MAX_MASK_WORDS = 2  # int64 words of an expert's token mask
_PAIR_BLOCK = (
    1024  # pairs the last program places a step (expert_blocks.place_pairs_by_token_masks)
)
# programs the logits matvec aims for up to 64 tokens (two waves of an H200's 132 SMs)
_LOGIT_PROGRAMS = 264
# ... and past 64 tokens (a batch's verify, a prefill chunk). The token tiles are counted over the count's power of
# two (``logit_splits``), so at Qwen3-Next's 512 experts 65 tokens get one split where 64 get two: 160 programs of
# 32 K steps each, 35.55 us at 65 tokens against 16.35 at 64, and 19.70 aiming for 1056 (routing_timings.py,
# gpu_2026-12-04f call 5; at 96 / 128 tokens 31.64 / 31.67 against 23.18 / 30.53, gpu_2026-12-04g call 1). In the
# Qwen3-Next slice's block-FP8 decode step at batch 96 / 128 (decode_settings.py many_token_logits_qwen3next,
# gpu_2026-12-04g call 1) 1056 gave 11.053 / 11.903 ms against 10.809 / 12.261, within the 0.4-0.7 ms its two
# passes differed by: 264 stays.
many_token_logit_programs = 264
_MAX_SPLITS = (
    16  # hidden splits at most: the route kernel reads splits x tokens x experts partial logits
)
_FEW_TOKENS_BLOCK_K = 256  # up to one token block: each program's split in one or two wide steps
# the tl.dot path's K step (more tokens). Batch-invariant mode once took this path at every count: 12.1 us a
# layer on the Qwen3-Next slice's batch-1 step against 3.0 for the per-token sums (gpu_2026-12-03d call 4), and
# 11.2 / 11.4 / 17.3 us at K steps of 64 / 128 / 256 (gpu_2026-12-03e call 1: router_logit_paths.py's first
# form, benchmarks/scripts/invariant_router_logits.py); it now sums token by token at every count
_DOT_BLOCK_K = 64
# the tl.dot path's precision: "ieee" (float32 products on the CUDA cores, one K step after another in each thread),
# or "tf32x3" (three tf32 tensor-core products a step, about float32's accuracy; bf16 x is exact in tf32). In the
# Qwen3-Next slice's block-FP8 decode step at batch 32 (decode_settings.py router_dot_qwen3next, gpu_2026-12-04f
# call 1): 3.246 ms against 3.358 in "ieee"; aiming for 1056 programs rather than 264 (``_LOGIT_PROGRAMS``): 3.375,
# and 3.267 with tf32x3.
dot_precision = "tf32x3"
# From this many experts (None: never) the route kernel takes a token's top_k from one partial sort of its keys
# (tl.topk: a bitonic network over the experts) rather than top_k rounds of a max over them, each a reduction across
# the program's warps; not with a correction bias (the weight is then the score, not the ranked choice). Both give
# the same experts in the same order (unique keys). On an H200 (gpu_2026-12-04e call 5): Qwen3-Next's 512 experts
# routed alone at 1 / 2 / 8 / 32 / 64 tokens in 4.48 / 5.68 / 5.78 / 6.69 / 8.54 us against 5.31 / 5.94 / 6.19 /
# 7.10 / 8.53 by rounds (benchmarks/scripts/routing_timings.py), the Qwen3-Next slice's block-FP8 decode step at
# batch 1 in 0.621 ms against 0.629 (decode_settings.py one_token_qwen3next_fp8). Routings of up to 256 experts (a
# token's program one warp: ``token_route_warps``) were not timed with it and keep the rounds.
sorted_top_k_experts: int | None = 257
# the route kernel's warps for a block of tokens: 8 (no register spills at the DeepSeek shapes: ptxas for
# sm_90a; 4 warps spill)
ROUTE_WARPS = 8
# a token's program's warps up to 256 experts past 64 tokens (``token_route_warps``)
many_token_route_warps = 8


def token_route_warps(block_e: int, tokens: int = 1) -> int:
    """The route kernel's warps for programs that route one token each over ``block_e`` (a power of two)
    experts, ``tokens`` of them. Up to 256 experts one warp, every reduction within it: on an H200
    (benchmarks/scripts/routing_timings.py, gpu_2026-11-30h call 1) one token of DeepSeek-V3's 256 experts took
    6.07 us against 9.01 at 4 warps, V2-Lite's 64 3.37 against 4.20. Wider, 4 warps: the one warp's 512-wide
    rows and the 1024-wide layout spill (ptxas for sm_90a: 255 registers and 528 B of spills at Qwen3-Next's
    512 + 1 experts); one token of Qwen3-Next took 10.37 us at 1 warp, 6.65 at 4 (7.85 at 2, 6.67 at 8), of
    Step-3.5's 288 7.28 against 6.20, and 4 warps were the fastest or within 0.2 us of it up to 64 tokens
    (call 3).

    Past 64 tokens (a batch's verify, up to ``FUSED_LAYOUT_TOKENS``) outside batch-invariant mode the one warp
    becomes ``many_token_route_warps``: the last program places every pair alone, and more warps share it.
    Routed alone (routing_timings.py, gpu_2026-12-04g call 5), at 96 / 128 tokens at 1 / 4 / 8 warps:
    DeepSeek-V2-Lite's 64 experts 17.73 / 8.46 / 8.15 and 19.45 / 9.58 / 9.65 us, DeepSeek-V3's 256 17.76 /
    12.12 / 14.27 and 20.38 / 13.36 / 15.35 (Qwen3-Next's 512 at 4 / 8 warps 14.41 / 12.87 and 15.92 / 14.01,
    call 1). 8, as 4 spill registers at V2-Lite's width (ptxas for sm_90a), and 512-wide routes keep their 4
    (8 spill there). A token's weights then need not be the bits it gets routed alone (the reductions span
    other warps); up to 64 tokens, and in batch-invariant mode at every count, they are."""
    if block_e > 256:
        return 4
    return many_token_route_warps if tokens > 64 and not batch_invariant() else 1


@triton.jit(do_not_specialize=["n"])  # (the call's token count: engine/warm_up.py)
def _router_logits_kernel(
    x_ptr,  # [n, hidden] any float dtype
    w_ptr,  # [experts, hidden] float32 (or any float dtype, converted in registers)
    scale_ptr,  # [hidden] any float dtype: x's column scale (read with INPUT_NORM)
    partial_ptr,  # [splits, n, row_len] float32, written
    n,
    hidden,
    num_experts,
    row_len,  # num_experts, + 1 with INPUT_NORM: the split's sum of x^2 in the last column
    split_len,  # hidden columns per split, a multiple of BLOCK_K
    stride_x,
    stride_w,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INPUT_NORM: tl.constexpr,
    FEW_TOKENS: tl.constexpr,  # per-token sums over the block's tokens, no tl.dot (module docstring 1.)
    DOT_PRECISION: tl.constexpr,  # the tl.dot path's (``dot_precision``)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)  # [BLOCK_E]
    split = tl.program_id(2)
    t_ok, e_ok = tokens < n, experts < num_experts
    # with PDL: the weight rows of the split's first two steps into L2 (no earlier kernel writes them), a
    # 128-byte line (32 float32 columns) at a time
    if PDL:
        lines = split * split_len + tl.arange(0, 2 * BLOCK_K // 32) * 32
        ok = e_ok[:, None] & (lines < hidden)[None, :]
        prefetch_l2(w_ptr + tl.where(ok, experts[:, None] * stride_w + lines[None, :], 0))
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    sq = tl.zeros([BLOCK_T], tl.float32)  # the split's sum of x^2 per token (INPUT_NORM)
    for k0 in range(split * split_len, (split + 1) * split_len, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < hidden
        w = tl.load(
            w_ptr + experts[:, None] * stride_w + k[None, :],
            mask=e_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_E, BLOCK_K]
        if INPUT_NORM:
            col = tl.load(scale_ptr + k, mask=k_ok, other=0.0).to(tl.float32)  # [BLOCK_K]
        if FEW_TOKENS:
            first = tl.program_id(0) * BLOCK_T
            x_row = x_ptr + first.to(tl.int64) * stride_x  # the block's first token
            for t in range(first, tl.minimum(first + BLOCK_T, n)):  # the block's tokens one by one
                xt = tl.load(x_row + k, mask=k_ok, other=0.0).to(tl.float32)  # [BLOCK_K]
                x_row += stride_x
                if INPUT_NORM:
                    sq = tl.where(tokens == t, sq + tl.sum(xt * xt, axis=0), sq)
                    xt *= col
                products = tl.sum(w * xt[None, :], axis=1)  # [BLOCK_E]
                acc = tl.where(tokens[:, None] == t, acc + products[None, :], acc)
        else:
            x = tl.load(
                x_ptr + tokens[:, None].to(tl.int64) * stride_x + k[None, :],
                mask=t_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(tl.float32)  # [BLOCK_T, BLOCK_K]
            if INPUT_NORM:
                sq += tl.sum(x * x, axis=1)
                x *= col[None, :]
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    row = (split * n + tokens).to(tl.int64) * row_len  # [BLOCK_T]
    tl.store(partial_ptr + row[:, None] + experts[None, :], acc, mask=t_ok[:, None] & e_ok[None, :])
    if INPUT_NORM:
        tl.store(partial_ptr + row + num_experts, sq, mask=t_ok & (tl.program_id(1) == 0))


@triton.jit
def _top_index(values, index, NONE: tl.constexpr):
    """values [rows, cols], index [cols] -> per row the index of its largest value, the lowest among
    equal ones, and that value ([rows] each)."""
    best = tl.max(values, axis=1)
    return tl.min(tl.where(values == best[:, None], index[None, :], NONE), axis=1), best


@triton.jit
def _ranked_keys(values, index, BLOCK: tl.constexpr):
    """values [rows, BLOCK] float32 (no NaN), index [BLOCK] (0 .. BLOCK - 1) -> int64 keys ordered as
    (value, then the lower index first): the value's bits made monotone in the high word (negatives'
    magnitude bits flipped; -0.0 taken as 0.0), BLOCK - 1 - index in the low word. So one max reduction
    picks a row's largest value and, among equal ones, its lowest index, where a max and then a min over
    the indices of the maximum took two reductions, each a round trip through shared memory across warps."""
    bits = (values + 0.0).to(tl.int32, bitcast=True)  # (+ 0.0: -0.0 becomes 0.0)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (BLOCK - 1 - index).to(tl.int64)[None, :]


@triton.jit
def _key_value(key):
    """The float32 value a key of ``_ranked_keys`` ranks."""
    ordered = (key >> 32).to(tl.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _limit_to_top_groups(
    choice,  # [BLOCK_T, BLOCK_E] selection scores, -inf past the last expert
    experts,  # [BLOCK_E]
    NUM_EXPERTS: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOP_GROUPS: tl.constexpr,
    TOP2_SUM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """choice with every expert outside its token's TOP_GROUPS best groups at -inf (layers/moe.py
    ``_limit_to_top_groups``)."""
    group = experts // (NUM_EXPERTS // NUM_GROUPS)  # [BLOCK_E] (>= NUM_GROUPS past the last expert)
    groups = tl.arange(0, BLOCK_G)
    scores = tl.full([BLOCK_T, BLOCK_G], float("-inf"), tl.float32)  # [BLOCK_T, BLOCK_G]
    for g in tl.static_range(NUM_GROUPS):
        v = tl.where(group[None, :] == g, choice, float("-inf"))  # [BLOCK_T, BLOCK_E]
        score = tl.max(v, axis=1)  # [BLOCK_T]
        if TOP2_SUM:  # the best plus the best of the rest (the best twice when it is there twice)
            first, _ = _top_index(v, experts, BLOCK_E)
            score += tl.max(tl.where(experts[None, :] == first[:, None], float("-inf"), v), axis=1)
        scores = tl.where(groups[None, :] == g, score[:, None], scores)
    keep = tl.zeros([BLOCK_T, BLOCK_E], tl.int1)
    for _ in tl.static_range(TOP_GROUPS):
        best, _ = _top_index(scores, groups, BLOCK_G)  # [BLOCK_T]
        scores = tl.where(groups[None, :] == best[:, None], float("-inf"), scores)
        keep = keep | (group[None, :] == best[:, None])
    return tl.where(keep, choice, float("-inf"))


@triton.jit
def _route_tokens(
    t0,
    partial_ptr,
    bias_ptr,
    expert_scale_ptr,
    weights_ptr,
    ids_ptr,
    sq_ptr,
    row_scale_ptr,
    n,
    scaling,
    hidden,
    norm_eps,
    norm_constant,
    num_sq_parts,
    SPLITS: tl.constexpr,
    NUM_EXPERTS: tl.constexpr,
    TOP_K: tl.constexpr,
    SOFTMAX: tl.constexpr,
    BIAS: tl.constexpr,
    INPUT_NORM: tl.constexpr,
    ROW_NORM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    EXPERT_SCALE: tl.constexpr,
    SHARED_GATE: tl.constexpr,
    NUM_SHARED: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOP_GROUPS: tl.constexpr,
    TOP2_SUM: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SORTED_TOP_K: tl.constexpr,  # the top_k by one partial sort of the keys (``sorted_top_k_experts``; no BIAS)
):
    """Tokens t0 .. t0 + BLOCK_T - 1: their weights and expert ids (module docstring 2.), written and
    returned ([BLOCK_T, BLOCK_K] int32, slots past TOP_K zero)."""
    # a row of the partial logits: the experts' logits, the shared gate's, then with the norm the sum of x^2
    ROW: tl.constexpr = NUM_EXPERTS + SHARED_GATE + INPUT_NORM
    W_ROW: tl.constexpr = TOP_K + SHARED_GATE * NUM_SHARED  # a row of the weights written
    tokens = t0 + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    experts = tl.arange(0, BLOCK_E)  # [BLOCK_E]
    t_ok, e_ok = tokens < n, experts < NUM_EXPERTS
    ok = t_ok[:, None] & e_ok[None, :]
    row = tokens.to(tl.int64) * ROW  # [BLOCK_T]
    cell = row[:, None] + experts[None, :]  # [BLOCK_T, BLOCK_E]
    logits = tl.load(partial_ptr + cell, mask=ok, other=0.0)
    sq = tl.zeros([BLOCK_T], tl.float32)  # the sum of x^2 per token (INPUT_NORM)
    gate = tl.zeros([BLOCK_T], tl.float32)  # the shared gate's logit per token (SHARED_GATE)
    SQ: tl.constexpr = NUM_EXPERTS + SHARED_GATE  # the column of the sum of x^2
    # in split order: the same bits every time; unrolled, so that every split's load is issued before the
    # first add waits (a loop waited for each in turn: one L2 round trip a split)
    for s in tl.static_range(SPLITS):
        if s > 0:
            logits += tl.load(partial_ptr + s * n * ROW + cell, mask=ok, other=0.0)
        if SHARED_GATE:
            gate += tl.load(partial_ptr + s * n * ROW + row + NUM_EXPERTS, mask=t_ok, other=0.0)
        if INPUT_NORM:
            sq += tl.load(partial_ptr + s * n * ROW + row + SQ, mask=t_ok, other=0.0)
    if INPUT_NORM:  # RMSNorm(x) @ W.T = rsqrt(mean(x^2) + eps) * (x @ W.T): one number a token
        factor = tl.rsqrt(sq / hidden + norm_eps) * norm_constant  # [BLOCK_T]
        logits *= factor[:, None]
        gate *= factor
    if (
        ROW_NORM
    ):  # the rows are s * w (NormedRows): RMSNorm(s) @ W.T = rsqrt(mean(s^2) + eps) * (s * w) @ W.T
        parts = tl.arange(0, BLOCK_P)
        sq = tl.load(
            sq_ptr + parts[None, :] * n + tokens[:, None],
            mask=t_ok[:, None] & (parts < num_sq_parts)[None, :],
            other=0.0,
        )  # [BLOCK_T, BLOCK_P]
        factor = tl.rsqrt(tl.sum(sq, axis=1) / hidden + norm_eps)  # [BLOCK_T]
        logits *= factor[:, None]
        gate *= factor
        tl.store(
            row_scale_ptr + tokens, factor, mask=t_ok
        )  # (the grouped gate/up kernel's row scale)
    if SOFTMAX:
        logits = tl.where(e_ok[None, :], logits, float("-inf"))
        p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
    else:
        scores = tl.sigmoid(logits)
    choice = scores
    if BIAS:
        choice += tl.load(bias_ptr + experts, mask=e_ok, other=0.0)[None, :]
    choice = tl.where(e_ok[None, :], choice, float("-inf"))
    if NUM_GROUPS > 1:
        choice = _limit_to_top_groups(
            choice,
            experts,
            NUM_EXPERTS,
            NUM_GROUPS,
            TOP_GROUPS,
            TOP2_SUM,
            BLOCK_T,
            BLOCK_E,
            BLOCK_G,
        )
    slots = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_T, BLOCK_K], tl.float32)  # [BLOCK_T, BLOCK_K] weight per slot
    top_i = tl.zeros([BLOCK_T, BLOCK_K], tl.int32)  # expert per slot
    key = _ranked_keys(choice, experts, BLOCK_E)  # [BLOCK_T, BLOCK_E] int64
    if SORTED_TOP_K:  # the BLOCK_K largest keys, largest first: the loop's choices in its order
        top = tl.topk(key, BLOCK_K, dim=1)  # [BLOCK_T, BLOCK_K] int64
        chosen = slots[None, :] < TOP_K
        top_i = tl.where(chosen, (BLOCK_E - 1) - (top & 0xFFFFFFFF).to(tl.int32), 0)
        top_w = tl.where(chosen, _key_value(top), 0.0)  # (no BIAS: the choice is the score)
    for j in tl.static_range(0 if SORTED_TOP_K else TOP_K):
        best_key = tl.max(
            key, axis=1
        )  # [BLOCK_T]: the largest choice, the lowest expert among equal ones
        best = (BLOCK_E - 1) - (best_key & 0xFFFFFFFF).to(tl.int32)  # [BLOCK_T]
        pick = experts[None, :] == best[:, None]  # [BLOCK_T, BLOCK_E]
        if BIAS:
            weight = tl.sum(tl.where(pick, scores, 0.0), axis=1)  # (one nonzero term: exact)
        else:  # the choice is the score itself (or -inf, never chosen): its largest is the weight
            weight = _key_value(best_key)
        key = tl.where(pick, -(2**63), key)
        top_w = tl.where(slots[None, :] == j, weight[:, None], top_w)
        top_i = tl.where(slots[None, :] == j, best[:, None], top_i)
    if NORMALIZE:
        top_w = top_w / (tl.sum(top_w, axis=1)[:, None] + 1e-20)
    top_w *= scaling
    mask = t_ok[:, None] & (slots[None, :] < TOP_K)
    if EXPERT_SCALE:
        top_w *= tl.load(expert_scale_ptr + top_i, mask=mask, other=0.0).to(tl.float32)
    w_rows = tokens.to(tl.int64) * W_ROW  # [BLOCK_T]
    tl.store(weights_ptr + w_rows[:, None] + slots[None, :], top_w, mask=mask)
    tl.store(
        ids_ptr + tokens[:, None].to(tl.int64) * TOP_K + slots[None, :],
        top_i.to(tl.int64),
        mask=mask,
    )
    if SHARED_GATE:  # every shared slot of the token weighted by its gate
        for j in tl.static_range(NUM_SHARED):
            tl.store(weights_ptr + w_rows + TOP_K + j, tl.sigmoid(gate), mask=t_ok)
    return top_i


@triton.jit
def _local_ids(
    top_i,  # [BLOCK_T, BLOCK_K] int32: tokens t0 .. t0 + BLOCK_T - 1's experts, slots past TOP_K zero
    t0,
    local_ids_ptr,  # [n, TOP_K] int64, written
    n,
    first_expert,
    local_experts,
    live_ptr,  # [n] bool (LIVE): the rows that route (module docstring 5.)
    TOP_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LIVE: tl.constexpr,
):
    """The experts as indices of first_expert .. first_expert + local_experts - 1, -1 for any other (as
    layers/moe.py ``ExpertPlacement.local_ids``) and for every slot of a row that routes nowhere, written and
    returned ([BLOCK_T, BLOCK_K] int32)."""
    tokens = t0 + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    slots = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    local = top_i - first_expert
    local = tl.where((local >= 0) & (local < local_experts), local, -1)
    if LIVE:
        live = tl.load(live_ptr + tokens, mask=tokens < n, other=0) != 0  # [BLOCK_T]
        local = tl.where(live[:, None], local, -1)
    tl.store(
        local_ids_ptr + tokens[:, None].to(tl.int64) * TOP_K + slots[None, :],
        local.to(tl.int64),
        mask=(tokens < n)[:, None] & (slots < TOP_K)[None, :],
    )
    return local


# The token count and the layout's block bound change from call to call (engine/warm_up.py: Triton would compile a
# kernel of its own for each of their values that is 1 or a multiple of 16, met first inside a request).
@triton.jit(do_not_specialize=["n", "max_blocks"])
def _route_kernel(
    partial_ptr,  # [splits, n, experts (+ 1 with SHARED_GATE, + 1 with INPUT_NORM)] float32 partial logits
    bias_ptr,  # [experts] float32 (read when BIAS)
    expert_scale_ptr,  # [experts] any float dtype (read when EXPERT_SCALE)
    weights_ptr,  # [n, TOP_K (+ NUM_SHARED with SHARED_GATE)] float32, written
    ids_ptr,  # [n, TOP_K] int64, written; with EXPERT_RANGE [2, n, TOP_K], the local ids after (docstring 4.)
    sorted_pairs_ptr,
    block_expert_ptr,  # the block layout, written when LAYOUT
    cursor_ptr,  # its scratch
    ticket_ptr,  # [1 + local + shared experts] int64, zero on entry and on exit: ticket, token masks (LAYOUT)
    sq_ptr,  # [num_sq_parts, n] float32 (ROW_NORM): the rows' partial sums of squares (NormedRows.sq_parts)
    row_scale_ptr,  # [n] float32 (ROW_NORM), written: each row's norm factor
    live_ptr,  # [n] bool (LIVE): the rows that route (docstring 5.)
    n,
    scaling,
    hidden,
    norm_eps,
    norm_constant,
    num_sq_parts,
    max_blocks,
    first_expert,  # the layout's experts: first_expert .. + local_experts - 1 (all without EXPERT_RANGE)
    local_experts,
    SPLITS: tl.constexpr,
    NUM_EXPERTS: tl.constexpr,
    TOP_K: tl.constexpr,
    SOFTMAX: tl.constexpr,
    BIAS: tl.constexpr,
    INPUT_NORM: tl.constexpr,
    ROW_NORM: tl.constexpr,  # x was NormedRows.normed: logits times each row's norm factor (docstring 2.)
    BLOCK_P: tl.constexpr,  # a power of two >= num_sq_parts (ROW_NORM)
    EXPERT_SCALE: tl.constexpr,
    SHARED_GATE: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOP_GROUPS: tl.constexpr,
    TOP2_SUM: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SORTED_TOP_K: tl.constexpr,
    LAYOUT: tl.constexpr,  # one program a token (BLOCK_T 1), the last to finish writes the block layout
    ONE_TOKEN: tl.constexpr,  # LAYOUT of a single token: its program writes the layout from its registers
    EXPERT_RANGE: tl.constexpr,  # the layout of an expert-parallel rank's experts (module docstring 4.)
    LIVE: tl.constexpr,  # the layout of the rows live_ptr names alone (with EXPERT_RANGE; docstring 5.)
    NUM_SHARED: tl.constexpr,
    BLOCK_SHARED: tl.constexpr,  # a power of two >= NUM_SHARED
    SORT_BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PAIR_BLOCK: tl.constexpr,
    MASK_WORDS: tl.constexpr,  # (LAYOUT) the token masks' int64 words: the tokens' 64s
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    t0 = tl.program_id(0) * BLOCK_T
    top_i = _route_tokens(
        t0,
        partial_ptr,
        bias_ptr,
        expert_scale_ptr,
        weights_ptr,
        ids_ptr,
        sq_ptr,
        row_scale_ptr,
        n,
        scaling,
        hidden,
        norm_eps,
        norm_constant,
        num_sq_parts,
        SPLITS,
        NUM_EXPERTS,
        TOP_K,
        SOFTMAX,
        BIAS,
        INPUT_NORM,
        ROW_NORM,
        BLOCK_P,
        EXPERT_SCALE,
        SHARED_GATE,
        NUM_SHARED,
        NUM_GROUPS,
        TOP_GROUPS,
        TOP2_SUM,
        NORMALIZE,
        BLOCK_T,
        BLOCK_E,
        BLOCK_G,
        BLOCK_K,
        SORTED_TOP_K,
    )  # [BLOCK_T, BLOCK_K] ([1, BLOCK_K] with LAYOUT)
    layout_ids_ptr = ids_ptr  # the ids the layout is of: [n, TOP_K]
    if EXPERT_RANGE:  # (module docstring 4. and 5.)
        layout_ids_ptr = ids_ptr + n * TOP_K
        top_i = _local_ids(
            top_i,
            t0,
            layout_ids_ptr,
            n,
            first_expert,
            local_experts,
            live_ptr,
            TOP_K,
            BLOCK_T,
            BLOCK_K,
            LIVE,
        )
    if LAYOUT and ONE_TOKEN:  # (module docstring 3.)
        place_one_token(
            top_i,
            sorted_pairs_ptr,
            block_expert_ptr,
            max_blocks,
            local_experts,
            TOP_K,
            TOP_K + NUM_SHARED,
            BLOCK_K,
            PAIR_BLOCK,
            BLOCK_M,
        )
    elif LAYOUT:
        masks_ptr = ticket_ptr + 1  # [MASK_WORDS, local + shared experts] int64 token masks
        # the token's bit: bit t0 % 64 of word t0 // 64
        word_ptr = masks_ptr + (t0 // 64).to(tl.int64) * (local_experts + NUM_SHARED)
        bit = (t0 % 64).to(tl.int64)
        token_bit = tl.full([1, BLOCK_K], 1, tl.int64) << bit
        slots = tl.arange(0, BLOCK_K)[None, :]
        chosen = (slots < TOP_K) & (top_i >= 0)  # (-1: another rank's expert, in no block)
        tl.atomic_or(word_ptr + top_i, token_bit, mask=chosen, sem="relaxed", scope="gpu")
        if NUM_SHARED > 0:  # every token chooses every shared expert
            shared = tl.arange(0, BLOCK_SHARED)
            tl.atomic_or(
                word_ptr + local_experts + shared,
                tl.full([BLOCK_SHARED], 1, tl.int64) << bit,
                mask=shared < NUM_SHARED,
                sem="relaxed",
                scope="gpu",
            )
        # every thread's ids and mask bits come before the ticket (thread 0 takes it for the program)
        tl.debug_barrier()
        # acq_rel at gpu scope: releases this program's writes (cumulative over the barrier above), and the
        # program that draws the last ticket acquires every program's, its own included (without a ticket, one
        # H200 replay in 30 read one of its own mask bits before the atomic OR that set it: V3 and Step-3.5 at
        # 1 token, benchmarks/results/gpu_2026-11-30b call 4; one token now takes ``place_one_token``)
        if tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == n - 1:
            # every program has taken its ticket: zero again for the next launch
            tl.store(ticket_ptr, 0)
            place_pairs_by_token_masks(
                layout_ids_ptr,
                masks_ptr,
                sorted_pairs_ptr,
                block_expert_ptr,
                cursor_ptr,
                n,
                max_blocks,
                local_experts,
                TOP_K,
                TOP_K + NUM_SHARED,
                SORT_BLOCK_E,
                BLOCK_M,
                PAIR_BLOCK,
                MASK_WORDS,
            )


def layout_scratch(device: torch.device, experts: int) -> torch.Tensor:
    """[1 + MAX_MASK_WORDS * experts] int64 zeros on ``device``: the fused layout's ticket and token masks over
    that many experts (routed + shared; a word a 64 tokens), left zero by every launch (module docstring 3.):
    layers/zeroed_scratch.py's buffer, made by the first eager call."""
    return zeroed_scratch(
        "layers/moe_routing_kernel.py: the routing kernel's layout ticket and token masks",
        device,
        1 + MAX_MASK_WORDS * experts,
        torch.int64,
    )


@dataclass(frozen=True)
class RouterInputNorm:
    """A router that projects RMSNorm(x) * column_scale * constant, the norm without a weight (Gemma 4:
    transformers Gemma4TextRouter, ``norm(x) * scale * hidden_size ** -0.5``; module docstring)."""

    column_scale: torch.Tensor  # [hidden], any float dtype
    eps: float
    constant: float


_LOGIT_TOKENS, _LOGIT_EXPERTS = 16, 16  # the logits kernel's tile: tokens by experts
# Tokens up to which the logits take the per-token sums outside batch-invariant mode (the mode takes them at
# every count), each token block's splits as for one block (``logit_splits``). Alone, one captured call, the sums
# were faster than the tl.dot path from 17 to 4096 tokens on every seed router but DeepSeek-V2-Lite's at 17-32
# (e.g. V3's 32.6 against 127.9 us at 32 tokens; benchmarks/scripts/router_logit_paths.py, gpu_2026-12-03f call 2),
# but inside a batch-32 decode step, decode graphs captured again per setting, at 16 / at every count: the
# Qwen3-Next slice 4.245 / 4.210 ms, the Step-3.5 slice 7.657 / 7.667, DeepSeek-V2-Lite 9.185 / 9.379 and in
# block FP8 7.146 / 7.330 (calls 4 and 5). So 16 stays.
per_token_max = 16


class LogitSplits(NamedTuple):
    few: bool  # one token block: the per-token sums (FEW_TOKENS)
    block_k: int
    splits: int
    split_len: int  # hidden columns a split, a multiple of block_k


def logit_splits(n: int, hidden: int, experts: int) -> LogitSplits:
    """How ``router_logits`` over ``n`` tokens splits the hidden size: so that, with the tiles of tokens and
    experts, about ``_LOGIT_PROGRAMS`` programs run.

    Few tokens (decode, verify): the weight is the whole read, and a program's loop over its split is a chain
    of dependent loads, so the split is walked in one or two wide steps by more programs. On an H200 the
    64-wide steps took 15 us a layer for Qwen3-Next's 4.2 MB router weight (a 1 us read) and 20 us for
    DeepSeek-V3's 7.3 MB (benchmarks/results/gpu_2026-11-29d, call 3's kernel tables). Batch-invariant mode:
    always the per-token sums, over every token block, their splits as for one block, so a token's partial
    sums and their split boundaries do not depend on the token count (the dot path sums in another order).
    The token tiles are counted over the count's power of two: the splits are the routing kernel's SPLITS,
    compiled per value, which the engine's warm-up meets (engine/warm_up.py; gpu_2026-12-01h)."""
    few = n <= per_token_max or batch_invariant()
    block_k = _FEW_TOKENS_BLOCK_K if few else _DOT_BLOCK_K
    token_tiles = 1 if few else triton.cdiv(triton.next_power_of_2(n), _LOGIT_TOKENS)
    tiles = token_tiles * triton.cdiv(experts, _LOGIT_EXPERTS)
    programs = _LOGIT_PROGRAMS if n <= 64 else many_token_logit_programs
    splits = max(1, min(_MAX_SPLITS, triton.cdiv(hidden, block_k), programs // tiles))
    split_len = triton.cdiv(triton.cdiv(hidden, splits), block_k) * block_k
    return LogitSplits(few, block_k, triton.cdiv(hidden, split_len), split_len)


def router_logits(
    x: torch.Tensor, weight: torch.Tensor, column_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x [n, hidden]; weight [experts, hidden] (float32, DeepSeek's; another float dtype is converted in
    registers, as Gemma 4's bf16 router projection is) -> partial logits [splits, n, experts] float32
    (module docstring 1.), their sum over splits being x.float() @ weight.T. With ``column_scale``
    [hidden] (``RouterInputNorm``): of x * column_scale, each split's row one longer, its last entry the
    split's sum of x^2."""
    n, hidden = x.shape
    experts = weight.shape[0]
    row_len = experts + (column_scale is not None)
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    block_t, block_e = _LOGIT_TOKENS, _LOGIT_EXPERTS
    few, block_k, splits, split_len = logit_splits(n, hidden, experts)
    partial = torch.empty(splits, n, row_len, dtype=torch.float32, device=x.device)
    pdl = pdl_available(x.device)
    _router_logits_kernel[(triton.cdiv(n, block_t), triton.cdiv(experts, block_e), splits)](
        x,
        weight,
        weight if column_scale is None else column_scale,
        partial,
        n,
        hidden,
        experts,
        row_len,
        split_len,
        x.stride(0),
        weight.stride(0),
        BLOCK_T=block_t,
        BLOCK_E=block_e,
        BLOCK_K=block_k,
        INPUT_NORM=column_scale is not None,
        FEW_TOKENS=few,
        DOT_PRECISION=dot_precision,
        PDL=pdl,
        num_warps=4,
        **pdl_launch_options(pdl),
    )
    return partial


def select_experts(
    partial: torch.Tensor,
    bias: torch.Tensor | None,
    routing,
    num_shared: int = 0,
    layout: bool | ExpertPlacement = False,
    input_norm: RouterInputNorm | None = None,
    expert_scale: torch.Tensor | None = None,
    shared_gate: bool = False,
    row_norm: RowNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor, BlockLayout | None]:
    """partial logits [splits, n, experts] float32 (``router_logits``, or the logits as [1, n, experts]);
    bias [experts] float32 or None; routing a layers/router.py ``Routing`` -> (weights [n, top_k] float32,
    ids [n, top_k] int64, with ``layout`` the block layout of ids and ``num_shared`` shared slots per
    token (layers/moe_kernels.py), else None). ``layout`` an ``ExpertPlacement`` (layers/moe.py): the
    layout of its experts only (module docstring 4.; of every expert where it holds them all). With
    ``input_norm``, partial holds ``router_logits`` with the norm's column scale (one more entry a row);
    ``expert_scale`` [experts]: module docstring. With ``shared_gate`` each row holds the shared gate's
    logit after the experts' (module docstring), and the weights are [n, top_k + num_shared], the shared
    slots' sigmoid(gate) last. With ``row_norm`` (layers/moe.py ``RowNorm``) the logits are of a stream
    times its norm's weight: each row's are scaled by its norm factor, which is written into
    ``row_norm.scale`` (module docstring 2.)."""
    splits, n, experts = partial.shape
    norm = input_norm
    if norm is not None and row_norm is not None:
        raise ValueError(
            "a router reads x through its own input norm or a stream's NormedRows, not both"
        )
    # (each row ends with the shared gate's logit, then the sum of x^2)
    experts -= shared_gate + (norm is not None)
    if shared_gate and num_shared < 1:
        raise ValueError("a shared gate weights shared slots: num_shared must be at least 1")
    r = routing
    if r.correction_bias != (bias is not None):
        raise ValueError("the correction bias comes with Routing.correction_bias")
    top_k = r.top_k
    first, local = _expert_range(layout, experts)
    live = routed_mask(n) if layout else None  # (module docstring 5.)
    ranged = local != experts or live is not None
    weights = torch.empty(
        n, top_k + shared_gate * num_shared, dtype=torch.float32, device=partial.device
    )
    # [n, top_k] int64, with a range [2, n, top_k]: the ids, then the local ids the layout is of
    all_ids = torch.empty(1 + ranged, n, top_k, dtype=torch.int64, device=partial.device)
    ids, layout_ids = all_ids[0], all_ids[-1]
    block_e = triton.next_power_of_2(experts)
    few = n <= FUSED_LAYOUT_TOKENS  # one program a token (module docstring 2.)
    # In batch-invariant mode one program a token at every count: a token's reductions over the experts then
    # run as they do in a decode step, whatever the batch (the layout still fused only for few tokens).
    one_each = few or batch_invariant()
    block_t = 1 if one_each else min(triton.next_power_of_2(n), max(1, 4096 // block_e), 64)
    fused = layout and few
    slots = top_k + num_shared
    blocks = (
        BlockLayout.empty(n, slots, local + num_shared, partial.device)
        if fused
        else BlockLayout(ids, ids, 16, ids)  # (not written: LAYOUT off)
    )
    pdl = pdl_available(partial.device)
    _route_kernel[(triton.cdiv(n, block_t),)](
        partial,
        partial if bias is None else bias,
        partial if expert_scale is None else expert_scale,
        weights,
        all_ids,
        blocks.sorted_pairs,
        blocks.block_expert,
        blocks.cursor,
        layout_scratch(partial.device, local + num_shared) if fused else ids,
        partial if row_norm is None else row_norm.sq_parts,
        partial if row_norm is None else row_norm.scale,
        partial if live is None else live,
        n,
        float(r.scaling),
        _norm_width(norm, row_norm),  # the hidden size
        float(norm.eps) if norm is not None else float(row_norm.eps) if row_norm else 0.0,
        1.0 if norm is None else float(norm.constant),
        1 if row_norm is None else row_norm.sq_parts.shape[0],
        blocks.blocks,
        first,
        local,
        SPLITS=splits,
        NUM_EXPERTS=experts,
        TOP_K=top_k,
        SOFTMAX=r.scoring == "softmax",
        BIAS=bias is not None,
        INPUT_NORM=norm is not None,
        ROW_NORM=row_norm is not None,
        BLOCK_P=1 if row_norm is None else triton.next_power_of_2(row_norm.sq_parts.shape[0]),
        EXPERT_SCALE=expert_scale is not None,
        SHARED_GATE=shared_gate,
        NUM_GROUPS=r.num_groups,
        TOP_GROUPS=r.top_groups,
        TOP2_SUM=r.group_score == "top2_sum",
        NORMALIZE=r.normalize,
        BLOCK_T=block_t,
        BLOCK_E=block_e,
        BLOCK_G=triton.next_power_of_2(r.num_groups),
        BLOCK_K=triton.next_power_of_2(top_k),
        SORTED_TOP_K=bias is None
        and sorted_top_k_experts is not None
        and experts >= sorted_top_k_experts,
        LAYOUT=fused,
        ONE_TOKEN=fused and n == 1,
        EXPERT_RANGE=ranged,
        LIVE=live is not None,
        NUM_SHARED=num_shared,
        BLOCK_SHARED=triton.next_power_of_2(max(1, num_shared)),
        SORT_BLOCK_E=max(16, triton.next_power_of_2(local + num_shared)),
        BLOCK_M=blocks.block_m,
        # (of the count's power of two: a compile-time value per token bucket, engine/warm_up.py; one token:
        # the slots' power of two, place_one_token's BLOCK_S)
        PAIR_BLOCK=min(_PAIR_BLOCK, triton.next_power_of_2(triton.next_power_of_2(n) * slots))
        if fused
        else 1,
        MASK_WORDS=triton.cdiv(n, 64) if fused else 1,
        PDL=pdl,
        num_warps=token_route_warps(block_e, n) if one_each else ROUTE_WARPS,
        **pdl_launch_options(pdl),
    )
    if not layout:
        return weights, ids, None
    return (
        weights,
        ids,
        replace(
            blocks if fused else align(layout_ids, local, num_shared), ids=layout_ids, skips=ranged
        ),
    )


def _norm_width(input_norm: RouterInputNorm | None, row_norm: RowNorm | None) -> int:
    """The hidden size a norm folded into the routing averages over (1 without one: unread)."""
    if input_norm is not None:
        return input_norm.column_scale.shape[0]
    return 1 if row_norm is None else row_norm.hidden


def _expert_range(layout: bool | ExpertPlacement, experts: int) -> tuple[int, int]:
    """(first, count) of the experts whose layout ``select_experts`` writes: every one of ``experts`` but
    for a placement's."""
    if isinstance(layout, bool):
        return 0, experts
    if layout.total != experts:
        raise ValueError(f"a placement of {layout.total} experts for routing over {experts}")
    return layout.first, layout.count


def route(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    routing,
    num_shared: int = 0,
    layout: bool | ExpertPlacement = False,
    input_norm: RouterInputNorm | None = None,
    expert_scale: torch.Tensor | None = None,
    shared_gate: bool = False,
    row_norm: RowNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor, BlockLayout | None]:
    """x [n, hidden] -> ``select_experts`` of its router logits (module docstring), of RMSNorm(x) times
    the norm's scales with ``input_norm``, each weight times its expert's ``expert_scale`` [experts];
    with ``shared_gate`` the weight's last row is the shared expert's gate ([experts + 1, hidden]); with
    ``row_norm`` x is a stream times its norm's weight (``NormedRows.normed``), the norm applied here."""
    column_scale = None if input_norm is None else input_norm.column_scale
    return select_experts(
        router_logits(x, weight, column_scale),
        bias,
        routing,
        num_shared,
        layout,
        input_norm,
        expert_scale,
        shared_gate,
        row_norm,
    )
