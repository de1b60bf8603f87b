"""Routed experts as grouped GEMMs in Triton, without a host synchronisation (capturable in a CUDA graph).
Over half-precision stacks its three launches (gate/up, down, the combine of a token's slots) use
programmatic dependent launch on Hopper (layers/pdl.py): each waits for its predecessor before its first read
or write, and lets the next one start launching meanwhile.

``grouped_experts`` (layers/grouped_experts.py, the launcher) computes what layers/moe.py ``run_experts`` computes for experts whose weights are
stacked: gate and up [experts, inter, hidden] (any expert and row strides, the hidden dimension contiguous:
views of one packed gate/up tensor, or two stacks), or up alone for ungated experts, and down [experts,
hidden, inter]. The activation between the two projections is a constexpr (``ACTIVATIONS``), computed in
float32 on the projections' float32 accumulators:
- "silu": silu(gate) * up (DeepSeek, Qwen3-Next, Step-3.5);
- "gelu_tanh": gelu_tanh(gate) * up (Gemma 4's gelu_pytorch_tanh; layers/fused_kernels.py ``gelu_tanh``);
- "relu2": relu(up)^2, no gate (Nemotron-H);
- with ``limit`` L (Step-3.5's swiglu_limits, vLLM SwigluStepAndMul): act(gate).clamp(max=L) * up.clamp(-L, L).

Shared experts fused with the routed ones (SGLang's "shared experts fusion", sgl-project/sglang PR 4918,
``num_fused_shared_experts``; first proposed for vLLM in vllm-project/vllm PR 15502): a shared MLP of
S * inter rows is S more experts of inter rows (the activation acts per intermediate row, the down
projection's column blocks sum), chosen by every token with weight 1, or with a weight per token where the
routing gives one (Qwen3-Next's sigmoid-gated shared expert: layers/moe_routing_kernel.py
``shared_gate``, the weights then [tokens, SLOTS]). They come as a second set of stacks
(``shared``: views of the shared MLP's own parameters, so nothing is copied); expert ids NUM_ROUTED ..
NUM_ROUTED + S - 1 name them. A token's (token, slot) pairs are its top_k routed slots and then its S
shared slots: SLOTS = top_k + S per token, pair p = token * SLOTS + slot.

A dense MLP beside the experts (Gemma 4: its MLP reads the stream under one norm, the experts under another,
and each output has a norm of its own before they are added; transformers Gemma4TextDecoderLayer) fuses the
same way with its input and output apart (``shared_input``): the shared slots' blocks read that input's rows,
and the combine writes their sum beside the routed one. Its bytes then stream in the experts' two launches
rather than in two of their own.

Four kernels, every grid fixed by the shapes:

1. the block layout (layers/expert_blocks.py ``BlockLayout``): the (token, slot) pairs sorted by expert into
   blocks of BLOCK_M rows, written by ``align``'s launch or, up to 128 tokens, by the routing kernel itself
   (layers/moe_routing_kernel.py). The grid is sized for the most blocks any routing fills (``max_blocks``),
   the blocks past the routing's last marked expert -1.
2. ``expert_gate_up_kernel``, grid (max_blocks, inter / BLOCK_N): a block's rows times its expert's gate and up
   rows (up only when ungated), the activation, into an intermediate row per block row. On a fused residual
   stack (``row_scale``) the rows are the stream times its norm's weight, and the products are scaled by
   each token's norm factor (the routing kernel's) before the activation. Its programs once also asked
   their expert's down rows into L2 (prefetch.global.L2 after the wait, each program a slice of rows; 9bf1c9b)
   so that the down kernel would read them from there: the decode step lost at every setting measured
   (decode_settings.py prefetch_down_*, gpu_2026-12-04g call 2, ms at batch 1 / 8, shipped against prefetching
   up to 1 / up to 8 tokens): V2-Lite in block FP8 1.830 / 4.039 against 1.923 / 4.043 and 1.921 / 4.422, in
   bf16 2.140 / 5.151 against 2.388 / 5.174 and 2.386 / 6.038, the Qwen3-Next slice in block FP8 0.621 / 1.366
   against 0.630 / 1.363 and 0.626 / 1.438; taken out. Not looked into further; a likely reason: the
   prefetches' HBM reads compete with the gate/up kernel's own, which the step then waits for.
3. ``expert_down_kernel``, grid (max_blocks, hidden / BLOCK_N): the intermediate rows times the expert's down
   weight, times the pair's routing weight (a shared slot's: 1, or its column of the weights), into one
   float32 row per pair.
4. ``expert_combine_kernel``, grid (tokens, hidden / BLOCK_H): each token's SLOTS rows summed in slot order (routed
   slots, then shared), in x's dtype. No atomics: the same inputs give the same bits. On the fused residual
   stack (``ready``) it also adds the sum to the residual stream and makes the new stream ready for the next
   layer's input norm (``NormedRows``: the stream times the norm's scale and each program's sum of squares),
   so that norm costs no launch of its own. Its launch was once folded into the down kernel (up to 8 tokens,
   the last program of each column block to count itself in an arrival counter summed the block's columns;
   e2412f4) and lost in every decode step measured (decode_settings.py combine_in_down_*, gpu_2026-12-04f call
   4, ms at batch 1 / 8, folded against this launch): V2-Lite in block FP8 1.864 / 4.101 against 1.819 / 4.035,
   in bf16 2.156 / 5.176 against 2.140 / 5.167, the Qwen3-Next slice in block FP8 0.636 / 1.383 against 0.621 /
   1.359. Not looked into further; a likely reason: under programmatic dependent launch this launch waits out
   of sight, while the fold's barrier and atomic in every program and the last ones' sums delay the end of the
   whole grid, which the next layer waits for.

ONE-ROW: with one token (decode at batch 1) each block holds one pair, at its first row, and a kernel over
block-FP8 or INT4 stacks of at most ``one_row_max_k`` columns reads that row alone (ROWS 1, ``one_token_rows``): each
weight value converted to float32 and multiplied by it on the CUDA cores (layers/quant/quant_matmul_kernel.py
``row_times_tile``), as the quantized few-row product does with one row, where the 16-row tiles convert each
value into x's dtype and stage it through shared memory for tl.dot's 15 rows of zeros. On an H200
(benchmarks/scripts/one_row_products.py and decode_settings.py, gpu_2026-12-04 call 2), one token's block-FP8
experts took 26.7 us against 28.9 at DeepSeek-V2-Lite's shapes and 22.3 against 25.1 at Qwen3-Next's, and the
decode step at batch 1 1.830 ms against 1.936 (V2-Lite) and 0.670 against 0.700 (the Qwen3-Next slice, the dense
one-row product too); but over DeepSeek-V3's 7168 columns the gate/up kernel took 75.3 us (73.2 at the best of 5
tiles) against 70.1 (the 16-row tiles' cp.async pipeline pays over many K steps), and over bf16 stacks the step
lost (V2-Lite 2.225 ms against 2.139, Gemma 4 3.351 against 3.297), so those keep the 16-row tiles. INT4 words
are turned into float32 by integer operations alone (quant_matmul_kernel.py ``_int4_row_part``).

PAIRS APART: with a few tokens (up to the format's ``pairs_apart_max_tokens``: decode at small batches, a verify
of a few rows at batch 1; INT4 stacks, as measured) over stacks whose both kernels read one row a block, a 16-row
block of the layout rarely holds more than one pair either (an expert of many, chosen by one of a few tokens), so
the kernels skip the layout: grid row b is pair b (token b // SLOTS, slot b % SLOTS), its expert read from the
ids (a shared slot's its own), its intermediate row b, read one row on the CUDA cores as one token's blocks are.
An expert two of the tokens chose is read twice (the second read mostly from L2: both programs run in the same
wave), a shared expert once a token.

Quantized expert stacks (block FP8, INT4 groups) go through the same kernels: the constexpr FORMAT makes
their weight loads ``weight_tile`` of layers/quant/weight_tiles.py, which dequantizes a tile in
registers into x's dtype ("none": the plain load of half-precision stacks; ``_add_product``).
layers/quant/moe_quant_kernels.py
checks the quantized stacks and passes their scales (``quant``). A quantized shared MLP fuses as a
half-precision one does: its stored weights and its scales are strided views of its own tensors (a
block-FP8 down scale [hidden / bn, S * inter / bk] seen as [S, hidden / bn, inter / bk] of strides
(inter / bk, S * inter / bk, 1)), and each slot's scale rows are chosen as its weight rows
are (``_expert_rows``), their column stride the routed scales' (a choice per slot of it too spilled
registers in the fp8 gate/up kernel's few-token tile, ptxas -v for sm_90a).

SCALES AHEAD: over INT4 stacks whose K step lies in one group (groups of 128 columns: RedHatAI's w4a16 releases of
Qwen3-30B-A3B, against Kimi-K2's 32) a row's scales for a step are one 2-byte value, which Triton's software
pipeline does not stream (its cp.async takes 4 bytes or more), so each step would wait on their load; the
few-token tiles' K loops load each step's scales in the step before instead (``_first_scales``, ``_add_product``),
as layers/quant/quant_matmul_kernel.py's dense few-row product does (its docstring: INT4 K steps).
"""

from __future__ import annotations

import triton
import triton.language as tl

from outpace.attention.context import batch_invariant
from outpace.layers.expert_blocks import SMALL_BLOCK_M
from outpace.layers.fused_kernels import gelu_tanh
from outpace.layers.pdl import pdl_enter
from outpace.layers.quant.quant_matmul_kernel import one_row_max_k
from outpace.layers.quant.weight_tiles import (
    int4_group_scales,
    int4_tile,
    row_sums,
    row_times_tile,
    scale_rows,
    weight_tile,
)

ACTIVATIONS = ("silu", "gelu_tanh", "relu2")  # the kernels' expert activations (module docstring)


# (BLOCK_N, BLOCK_K, warps, stages) of the gate/up and the down kernel over blocks of a few tokens (BLOCK_M 16:
# decode and verify), without register spills (ptxas -v for sm_90a). Over block-FP8 stacks too: of 9 settings
# (benchmarks/scripts/moe_fp8_settings.py, gpu_2026-11-30f call 3, with each step's product scaled) (32, 128, 4, 4)
# and (64, 128, 4, 4) were the fastest at 1-8 tokens at Step-3.5-Flash's and DeepSeek-V2-Lite's shapes (8 stages
# 10-30% slower). The gate/up kernel's K step of 256 over 3 stages since: in the decode step (decode_settings.py
# a3b_* and gate_up_k256_*, gpu_2026-12-05c calls 1-3, an H100, ms at batch 1 / 8 / 32, 512 cached tokens, against
# (32, 128, 4, 4)) Qwen3-30B-A3B 3.375 / 10.264 against 3.426 / 10.350, Qwen3.5-35B-A3B 3.299 / 8.466 against
# 3.332 / 8.528, DeepSeek-V2-Lite 2.533 / 6.997 / 12.370 against 2.581 / 6.965 / 12.399, in block FP8 2.038 / 4.764
# / 8.160 against 2.037 / 4.785 / 8.200, Gemma 4 3.900 / 9.460 / 18.826 against 3.894 / 9.475 / 18.890, the
# Mistral Small 4 slice 1.621 / 4.896 / 12.167 against 1.637 / 4.894 / 12.200.
# Longer K steps lost or tied (expert_k_steps_*, gpu_2026-12-05e call 13, an H100, batch 1 / 8): gate/up
# (32, 512, 4, 2) Qwen3-30B-A3B 3.412 / 10.324 against 3.365 / 10.288, DeepSeek-V2-Lite 2.577 / 7.003 against
# 2.508 / 6.971; down (64, 256, 4, 3) 3.315 / 10.306 and 2.495 / 6.985: within the runs' spread but at one batch.
few_token_gate_up = (32, 256, 4, 3)
few_token_down = (64, 128, 4, 4)
# Whether quantized stacks launch with programmatic dependent launch too, by format. Alone (decode_settings.py
# moe_pdl_*, gpu_2026-12-04e call 4), decode step ms at batch 1 / 8, 512 cached tokens, without / with: block FP8
# DeepSeek-V2-Lite 1.784 / 4.093 against 1.756 / 4.041, the Qwen3-Next slice 0.645 / 1.392 against 0.632 / 1.376;
# INT4 the Kimi-K2 slice 1.407 / 3.157 against 1.412 / 3.287, so INT4 stacks launch without.
quantized_pdl = {"fp8_block": True, "int4_group": False}
# One token (decode at batch 1; module docstring, ONE-ROW): each block's one row on the CUDA cores over block-FP8
# stacks, outside batch-invariant mode, with these (BLOCK_N, BLOCK_K, warps, stages); off (False): the 16-row tiles.
# benchmarks/scripts/one_row_products.py sweeps them (V2-Lite's fastest of 5 in gpu_2026-12-04 call 2). In the Qwen3-Next
# slice's decode step at batch 1 (decode_settings.py one_token_qwen3next_fp8, gpu_2026-12-04e call 5) wider K steps
# lost: 0.629 ms shipped, gate/up (8, 2048, 8, 1) 0.638, (16, 1024, 4, 1) 0.667, down (8, 512, 4, 1) or (32, 512, 8,
# 1) 0.632.
one_token_cuda_cores = True
one_token_gate_up = (16, 512, 4, 1)
one_token_down = (16, 512, 4, 1)
# ... over INT4 stacks. Of 7 one-row settings against the 16-row tiles (benchmarks/scripts/int4_tiles.py --one-row,
# gpu_2026-12-04b call 5: Kimi-K2's experts, one token, both kernels, us a call): 141.3 at 8 columns a program
# and one warp, 151.5 the 16-row tiles, 164.4-215.9 the others (169.6 block FP8's).
int4_one_token_gate_up = (8, 512, 1, 1)
int4_one_token_down = (8, 512, 1, 1)
# Up to this many tokens (decode at small batches, a verify of a few rows), by format, the grouped kernels over
# stacks whose both kernels read one row a block give each (token, slot) pair a program row of its own, read on the
# CUDA cores with the one-token tiles (module docstring, PAIRS APART; ``pairs_apart``); 0: the layout's blocks (one
# token's on the CUDA cores). Measured on an H200 (benchmarks/results/gpu_2026-12-04c):
# - INT4: DeepSeek-V3's experts alone at 1 / 2 / 3 / 4 / 8 tokens 135.7 / 250.2 / 364.0 / 472.7 / 900.6 us apart
#   against 141.2 / 276.4 / 402.7 / 505.4 / 900.8 in the layout (call 1); the Kimi-K2 slice's decode step at batch
#   2 / 4 / 8 1.584 / 2.053 / 2.987 ms against 1.629 / 2.137 / 3.046 (call 1), the DeepSeek-V3 slice's at batch 4
#   2.728 ms either way, at 8 4.100 against 3.829 (call 8: 8 tokens' pairs share its 256 experts of 22 MB more
#   often than Kimi-K2's 384, and each pair reads its own). So up to 4 tokens.
# - Block FP8: apart, the experts alone were slower at 1 and 2 tokens at Step-3.5's, DeepSeek-V2-Lite's and
#   Qwen3-Next's shapes (benchmarks/scripts/pair_order.py, calls 3, 5, 6: 55.5 / 30.9 / 26.7 us at one token
#   against 44.4 / 25.0 / 20.8), and so was the Step-3.5 slice's step at every batch (1.363 / 1.646 ms at batch 1 / 2
#   against 1.305 / 1.556, call 1), though the Qwen3-Next slice's and V2-Lite's steps at batch 2 were faster (0.776
#   against 0.814 ms, 2.344 against 2.424; V2-Lite's at batch 4 slower, 3.227 against 3.073). Why the same one-row
#   kernels run slower apart than in the layout at one token was not found, so block FP8 keeps the layout.
pairs_apart_max_tokens = {"int4_group": 4, "fp8_block": 0}

# The few-token tiles over INT4 stacks (half a byte a column: a K step of 128 columns is 64 bytes of a row). Of 10
# (benchmarks/scripts/int4_tiles.py, gpu_2026-12-04b call 3: Kimi-K2's experts, group 32, bf16 scales, us a call
# of both kernels at 1 / 8 / 32 tokens) the gate/up kernel's fastest, 153.6 / 654.1 / 1022.6 against 166.3 /
# 718.9 / 1129.0 with the bf16 tiles (32, 128, 4, 4); 8 warps and 256- or 512-column steps 9-45% slower. The down
# kernel's fastest were the bf16 tiles or within 1% of them.
int4_few_token_gate_up = (64, 128, 4, 3)
int4_few_token_down = (64, 128, 4, 4)

Tiles = tuple[int, int, int, int]  # (BLOCK_N, BLOCK_K, warps, stages)


def expert_tiles(block_m: int, fp32: bool, fmt: str) -> tuple[Tiles, Tiles]:
    """The gate/up and the down kernel's tiles: the few-token tiles (``fmt``'s: INT4 stacks take their own);
    over blocks of 64 tokens (prefill) 64 x 64 at 8 warps; float32 (Triton's interpreter, tests) 32 x 32. (A
    kernel that reads one row a block takes ``one_token_tiles``.)"""
    if fp32:
        return (32, 32, 4, 2), (32, 32, 4, 2)
    if block_m == SMALL_BLOCK_M and fmt == "int4_group":
        return int4_few_token_gate_up, int4_few_token_down
    if block_m == SMALL_BLOCK_M:
        return few_token_gate_up, few_token_down
    return (64, 64, 8, 4), (64, 64, 8, 4)


def one_token_tiles(fmt: str) -> tuple[Tiles, Tiles]:
    """The gate/up and the down kernel's tiles where a block is read one row at a time (``one_token_rows``):
    ``fmt``'s (INT4 stacks take their own)."""
    if fmt == "int4_group":
        return int4_one_token_gate_up, int4_one_token_down
    return one_token_gate_up, one_token_down


def _reads_one_row(fmt: str, k: int) -> bool:
    """Whether a kernel over stacks in ``fmt`` of ``k`` columns may read a block's one row on the CUDA cores
    (module docstring, ONE-ROW): block-FP8 or INT4 stacks of at most ``one_row_max_k`` columns, outside
    batch-invariant mode (where a token's sums run in the 16-row tiles' order at every count: ``block_rows``)."""
    return (
        one_token_cuda_cores
        and fmt in ("fp8_block", "int4_group")
        and k <= one_row_max_k(fmt)
        and not batch_invariant()
    )


def one_token_rows(tokens: int, fmt: str, k: int) -> bool:
    """Whether a kernel over ``tokens`` tokens and stacks in ``fmt`` of ``k`` columns reads one row a block of
    the layout on the CUDA cores (module docstring, ONE-ROW): one token (each block holds one pair, at its
    first row) and ``_reads_one_row``."""
    return tokens == 1 and _reads_one_row(fmt, k)


def pairs_apart(tokens: int, fmt: str, hidden: int, inter: int) -> bool:
    """Whether both grouped kernels over ``tokens`` tokens give each (token, slot) pair a program row of its own
    (module docstring, PAIRS APART): at most ``fmt``'s ``pairs_apart_max_tokens`` tokens, and both kernels'
    columns (``hidden`` for gate/up, ``inter`` for down) within ``_reads_one_row``."""
    return (
        0 < tokens <= pairs_apart_max_tokens.get(fmt, 0)
        and _reads_one_row(fmt, hidden)
        and _reads_one_row(fmt, inter)
    )


@triton.jit
def _block_rows(
    sorted_pairs_ptr,
    block_expert_ptr,
    ids_ptr,  # [tokens, TOP_K] int (PAIRS_APART): the routed experts, -1 for a skipped slot
    stride_ids,
    pairs,
    num_routed,
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    PAIRS_APART: tl.constexpr,
):
    """The program's block: its expert (-1: no block), its first ROWS rows (BLOCK_M, or 1 when each block
    holds one pair: ``one_token_rows``), their pairs, which rows are real. PAIRS_APART (module docstring): block
    b is pair b alone, its expert read from the ids (a shared slot's its own), its intermediate row b."""
    block = tl.program_id(0)
    if PAIRS_APART:
        token, slot = block // SLOTS, block % SLOTS
        routed = tl.load(ids_ptr + token * stride_ids + slot, mask=slot < TOP_K, other=0)
        expert = tl.where(slot < TOP_K, routed.to(tl.int32), num_routed + slot - TOP_K)
        rows = block + tl.arange(0, 1)  # [1]
        pair = rows
    else:
        expert = tl.load(block_expert_ptr + block)
        rows = block * BLOCK_M + tl.arange(0, ROWS)  # [ROWS] rows of the block
        pair = tl.load(sorted_pairs_ptr + rows)
    return expert, rows, pair, pair < pairs


@triton.jit
def _expert_rows(
    expert, routed_ptr, stride_re, stride_rn, shared_ptr, stride_se, stride_sn, NUM_ROUTED
):
    """(the expert's base pointer, its row stride) in its weights or its scales: routed experts in the
    routed stack, expert NUM_ROUTED + s at shared expert s."""
    e = expert.to(tl.int64)
    shared = e >= NUM_ROUTED
    base = tl.where(shared, shared_ptr + (e - NUM_ROUTED) * stride_se, routed_ptr + e * stride_re)
    return base, tl.where(shared, stride_sn, stride_rn)


@triton.jit
def _activation(gate, up, limit, ACT: tl.constexpr, GATED: tl.constexpr, CLAMP: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32 projections -> the expert's intermediate (module docstring)."""
    h = gate if GATED else up
    if ACT == "silu":
        h = h * tl.sigmoid(h)
    elif ACT == "gelu_tanh":
        h = gelu_tanh(h)
    else:  # "relu2"
        h = tl.maximum(h, 0.0)
        h = h * h
    if GATED:
        if CLAMP:
            h = tl.minimum(h, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        h = h * up
    return h


@triton.jit
def _first_scales(
    s_base,  # the expert's scales (``_expert_rows``)
    s_rs,  # and their row stride
    offs_n,  # [BLOCK_N] the weight rows
    K,
    n_ok,  # [BLOCK_N]
    stride_sk,
    FORMAT: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_TILED: tl.constexpr,
    AHEAD: tl.constexpr,  # the K loop loads each step's INT4 scales a step ahead (module docstring, SCALES AHEAD)
):
    """-> (the weight rows' scale pointers [BLOCK_N, 1], the first K step's INT4 group scales [BLOCK_N, BLOCK_K /
    SCALE_BK] where ``AHEAD``, else a placeholder: what ``_add_product`` carries from step to step)."""
    # (one return: Triton compiles every return of a function, a constexpr branch's too, and their types must agree)
    s_rows = scale_rows(s_base, offs_n, s_rs, FORMAT, SCALE_BN)
    if AHEAD:  # (column 0 as a tensor: ``int4_group_scales`` hints its multiple)
        k0 = tl.full([], 0, tl.int32)
        first = int4_group_scales(s_rows, k0, K, n_ok, stride_sk, SCALE_BK, BLOCK_K, K_TILED)
    else:
        first = tl.zeros([1], tl.float32)
    return s_rows, first


@triton.jit
def _add_product(
    acc,  # [BLOCK_M, BLOCK_N] float32
    scale,  # AHEAD: [BLOCK_N, BLOCK_K / SCALE_BK] this step's INT4 group scales, loaded a step ago; else unused
    x,  # [BLOCK_M, BLOCK_K] the rows' columns k0 .. k0 + BLOCK_K - 1, in the compute dtype
    w_rows,  # [BLOCK_N, 1] pointers: each weight row's start
    s_rows,  # [BLOCK_N, 1] pointers: each weight row's scales (``_first_scales``)
    k0,
    K,  # the weight's columns (logical, unpacked)
    n_ok,  # [BLOCK_N] the weight rows that exist
    stride_sk,  # the scales' column stride
    FORMAT: tl.constexpr,
    SCALE_BK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    K_TILED: tl.constexpr,  # K a multiple of BLOCK_K (``weight_tile``)
    AHEAD: tl.constexpr,  # (``_first_scales``)
):
    """-> (acc + x times the weight's tile at columns k0 .. k0 + BLOCK_K - 1, transposed: [BLOCK_M, BLOCK_N]; the
    next step's ``scale``): the tile dequantized in registers (``weight_tile``). For block FP8 this read the
    experts faster than scaling each step's product of the raw fp8 values (as layers/fused_projection.py's
    ``_weighed_product`` does) on the H200: Step-3.5-Flash-FP8 at EP = 2, one token, 28.1 us a layer's gate/up
    against 35.3 (gpu_2026-11-30f calls 1 and 5, step timelines; DeepSeek-V2-Lite FP8 450.0 against 423.1 tok/s at
    batch 1)."""
    if AHEAD:  # the next step's scales asked for before this step's tile (masked along K: none past the last)
        following = int4_group_scales(
            s_rows, k0 + BLOCK_K, K, n_ok, stride_sk, SCALE_BK, BLOCK_K, False
        )
        w = int4_tile(w_rows, scale, k0, K, n_ok, SCALE_BK, BLOCK_K, x.dtype, K_TILED)
    else:
        following = scale
        w = weight_tile(
            w_rows, s_rows, k0, K, n_ok, stride_sk, FORMAT, SCALE_BK, BLOCK_K, x.dtype, K_TILED
        )
    return tl.dot(x, tl.trans(w), acc, input_precision=PRECISION), following


@triton.jit
def _add_row_product(
    acc,  # [BLOCK_N, BLOCK_K / GROUP] float32 (``row_times_tile``'s)
    x_row,  # [1, 1] pointer: the block's one row, its column 0
    w_rows,  # [BLOCK_N, 1] pointers: each weight row's start
    s_base,  # the expert's scales (``_expert_rows``)
    s_rs,  # and their row stride
    offs_n,  # [BLOCK_N] the weight rows
    k0,
    K,
    n_ok,  # [BLOCK_N] the weight rows that exist
    stride_sk,
    FORMAT: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
):
    """``_add_product`` for a block of one row (module docstring, ONE-ROW): on the CUDA cores."""
    s_rows = scale_rows(s_base, offs_n, s_rs, FORMAT, SCALE_BN)  # (loop-invariant)
    return row_times_tile(
        acc,
        x_row,
        w_rows,
        s_rows,
        k0,
        K,
        n_ok,
        stride_sk,
        FORMAT,
        SCALE_BK,
        BLOCK_K // GROUP,
        GROUP,
    )


@triton.jit(do_not_specialize=["pairs"])
def expert_gate_up_kernel(
    x_ptr,  # [tokens, hidden]
    shared_x_ptr,  # [tokens, hidden], x's row stride: the rows the shared slots read (x_ptr's, or their own)
    gate_ptr,  # [routed, inter, hidden] (read only when GATED)
    up_ptr,  # [routed, inter, hidden]
    shared_gate_ptr,  # [shared, inter, hidden] (read only when GATED)
    shared_up_ptr,  # [shared, inter, hidden]
    act_ptr,  # [max_blocks * BLOCK_M, inter], written for the real rows
    row_scale_ptr,  # [tokens] float32 (ROW_SCALE): each token's products times it (layers/moe.py RowNorm)
    gate_scale_ptr,  # quantized stacks (FORMAT != "none"): the gate's and up's scales [routed, ., .]
    up_scale_ptr,
    shared_gate_scale_ptr,  # and the shared experts' [shared, ., .] (the routed ones' column stride)
    shared_up_scale_ptr,
    sorted_pairs_ptr,
    block_expert_ptr,  # the block layout (unread with PAIRS_APART)
    ids_ptr,  # [tokens, TOP_K] int (read with PAIRS_APART): each slot's expert, -1 skipped
    stride_ids,
    pairs,
    num_routed,
    inter,
    hidden,
    limit,
    stride_xt,
    stride_ge,
    stride_gn,
    stride_ue,
    stride_un,
    stride_sge,
    stride_sgn,
    stride_sue,
    stride_sun,
    stride_act,
    stride_gse,
    stride_gsn,
    stride_gsk,
    stride_use,
    stride_usn,
    stride_usk,
    stride_sgse,
    stride_sgsn,
    stride_suse,
    stride_susn,
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,  # rows read of a block: BLOCK_M, or 1 (``one_token_rows``: on the CUDA cores)
    PAIRS_APART: tl.constexpr,  # a program row a pair, ROWS 1 (module docstring, PAIRS APART)
    GROUP: tl.constexpr,  # ROWS 1: columns summed as one (quant_matmul_kernel.py ``row_times_tile``)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_TILED: tl.constexpr,  # the hidden size a multiple of BLOCK_K (quant/weight_tiles.py ``weight_tile``)
    PRECISION: tl.constexpr,
    ACT: tl.constexpr,
    GATED: tl.constexpr,
    CLAMP: tl.constexpr,
    FORMAT: tl.constexpr,  # "none" or a quantized format (module docstring)
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    ROW_SCALE: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    # INT4 stacks whose K step lies in one group: each step's scales loaded a step ahead (SCALES AHEAD)
    AHEAD: tl.constexpr = FORMAT == "int4_group" and ROWS > 1 and SCALE_BK >= BLOCK_K
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    expert, rows, pair, row_ok = _block_rows(
        sorted_pairs_ptr, block_expert_ptr, ids_ptr, stride_ids, pairs, num_routed, TOP_K, SLOTS,
        BLOCK_M, ROWS, PAIRS_APART,
    )  # fmt: skip
    if expert >= 0:
        token = pair // SLOTS
        x_rows = tl.where(expert >= num_routed, shared_x_ptr, x_ptr)  # (a block is one expert's)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] intermediate rows
        n_ok = offs_n < inter
        offs_k = tl.arange(0, BLOCK_K)
        gate_base, gate_rs = _expert_rows(
            expert,
            gate_ptr,
            stride_ge,
            stride_gn,
            shared_gate_ptr,
            stride_sge,
            stride_sgn,
            num_routed,
        )
        up_base, up_rs = _expert_rows(
            expert, up_ptr, stride_ue, stride_un, shared_up_ptr, stride_sue, stride_sun, num_routed
        )
        gate_rows = gate_base + offs_n[:, None] * gate_rs  # [BLOCK_N, 1]
        up_rows = up_base + offs_n[:, None] * up_rs
        gate_s_base, gate_s_rs = _expert_rows(
            expert,
            gate_scale_ptr,
            stride_gse,
            stride_gsn,
            shared_gate_scale_ptr,
            stride_sgse,
            stride_sgsn,
            num_routed,
        )
        up_s_base, up_s_rs = _expert_rows(
            expert,
            up_scale_ptr,
            stride_use,
            stride_usn,
            shared_up_scale_ptr,
            stride_suse,
            stride_susn,
            num_routed,
        )
        gate_s_rows, gate_s = _first_scales(
            gate_s_base, gate_s_rs, offs_n, hidden, n_ok, stride_gsk, FORMAT, SCALE_BN, SCALE_BK, BLOCK_K,
            K_TILED, AHEAD and GATED,
        )  # fmt: skip
        up_s_rows, up_s = _first_scales(
            up_s_base, up_s_rs, offs_n, hidden, n_ok, stride_usk, FORMAT, SCALE_BN, SCALE_BK, BLOCK_K,
            K_TILED, AHEAD,
        )  # fmt: skip
        if ROWS == 1:  # the groups apart (``row_times_tile``)
            gate = tl.zeros([BLOCK_N, BLOCK_K // GROUP], tl.float32)
            up = tl.zeros([BLOCK_N, BLOCK_K // GROUP], tl.float32)
        else:
            gate = tl.zeros([ROWS, BLOCK_N], tl.float32)
            up = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            if ROWS == 1:  # the block's one pair, its row real (module docstring: ONE-ROW)
                x_row = x_rows + token[:, None] * stride_xt  # [1, 1]
                if GATED:
                    gate = _add_row_product(
                        gate, x_row, gate_rows, gate_s_base, gate_s_rs, offs_n, k0, hidden, n_ok,
                        stride_gsk, FORMAT, SCALE_BN, SCALE_BK, BLOCK_K, GROUP,
                    )  # fmt: skip
                up = _add_row_product(
                    up, x_row, up_rows, up_s_base, up_s_rs, offs_n, k0, hidden, n_ok, stride_usk,
                    FORMAT, SCALE_BN, SCALE_BK, BLOCK_K, GROUP,
                )  # fmt: skip
            else:
                k = k0 + offs_k
                x = tl.load(
                    x_rows + token[:, None] * stride_xt + k[None, :],
                    mask=row_ok[:, None] & (k < hidden)[None, :],
                    other=0.0,
                )  # [BLOCK_M, BLOCK_K]
                if GATED:
                    gate, gate_s = _add_product(
                        gate, gate_s, x, gate_rows, gate_s_rows, k0, hidden, n_ok, stride_gsk, FORMAT,
                        SCALE_BK, BLOCK_K, PRECISION, K_TILED, AHEAD,
                    )  # fmt: skip
                up, up_s = _add_product(
                    up, up_s, x, up_rows, up_s_rows, k0, hidden, n_ok, stride_usk, FORMAT, SCALE_BK,
                    BLOCK_K, PRECISION, K_TILED, AHEAD,
                )  # fmt: skip
        if ROWS == 1:
            gate, up = row_sums(gate), row_sums(up)  # [1, BLOCK_N]
        # the rows' input norm, applied to the products: RMSNorm(s) @ W.T = r * (s * w) @ W.T
        if ROW_SCALE:
            r = tl.load(row_scale_ptr + token, mask=row_ok, other=0.0)[:, None]  # [ROWS, 1]
            gate *= r
            up *= r
        act = _activation(gate, up, limit, ACT, GATED, CLAMP)  # [ROWS, BLOCK_N] float32
        tl.store(
            act_ptr + rows[:, None] * stride_act + offs_n[None, :],
            act.to(act_ptr.dtype.element_ty),
            mask=row_ok[:, None] & n_ok[None, :],
        )


@triton.jit(do_not_specialize=["pairs"])
def expert_down_kernel(
    act_ptr,  # [max_blocks * BLOCK_M, inter]
    w_ptr,  # [routed, hidden, inter]
    shared_w_ptr,  # [shared, hidden, inter]
    weights_ptr,  # [tokens, WEIGHTED_SLOTS] float32 routing weights (row stride stride_weights)
    partial_ptr,  # [pairs, hidden] float32, written
    scale_ptr,  # quantized stacks (FORMAT != "none"): the down projections' scales [routed, ., .]
    shared_scale_ptr,  # and the shared experts' [shared, ., .] (the routed ones' column stride)
    sorted_pairs_ptr,
    block_expert_ptr,
    ids_ptr,
    stride_ids,
    pairs,
    num_routed,
    inter,
    hidden,
    stride_act,
    stride_we,
    stride_wn,
    stride_swe,
    stride_swn,
    stride_weights,
    stride_partial,
    stride_se,
    stride_sn,
    stride_sk,
    stride_sse,
    stride_ssn,
    WEIGHTED_SLOTS: tl.constexpr,  # the slots the weights give: top_k, or all (the shared ones too)
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,  # as ``expert_gate_up_kernel``'s
    PAIRS_APART: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_TILED: tl.constexpr,  # the intermediate size a multiple of BLOCK_K
    PRECISION: tl.constexpr,
    FORMAT: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    # INT4 stacks whose K step lies in one group: each step's scales loaded a step ahead (SCALES AHEAD)
    AHEAD: tl.constexpr = FORMAT == "int4_group" and ROWS > 1 and SCALE_BK >= BLOCK_K
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    expert, rows, pair, row_ok = _block_rows(
        sorted_pairs_ptr, block_expert_ptr, ids_ptr, stride_ids, pairs, num_routed, TOP_K, SLOTS,
        BLOCK_M, ROWS, PAIRS_APART,
    )  # fmt: skip
    if expert >= 0:
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] hidden columns
        n_ok = offs_n < hidden
        offs_k = tl.arange(0, BLOCK_K)
        w_base, w_rs = _expert_rows(
            expert, w_ptr, stride_we, stride_wn, shared_w_ptr, stride_swe, stride_swn, num_routed
        )
        w_rows = w_base + offs_n[:, None] * w_rs  # [BLOCK_N, 1]
        s_base, s_rs = _expert_rows(
            expert,
            scale_ptr,
            stride_se,
            stride_sn,
            shared_scale_ptr,
            stride_sse,
            stride_ssn,
            num_routed,
        )
        s_rows, scale = _first_scales(
            s_base, s_rs, offs_n, inter, n_ok, stride_sk, FORMAT, SCALE_BN, SCALE_BK, BLOCK_K, K_TILED,
            AHEAD,
        )  # fmt: skip
        if ROWS == 1:  # the groups apart (``row_times_tile``)
            acc = tl.zeros([BLOCK_N, BLOCK_K // GROUP], tl.float32)
        else:
            acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            if ROWS == 1:  # (module docstring: ONE-ROW)
                acc = _add_row_product(
                    acc, act_ptr + rows[:, None] * stride_act, w_rows, s_base, s_rs, offs_n, k0, inter,
                    n_ok, stride_sk, FORMAT, SCALE_BN, SCALE_BK, BLOCK_K, GROUP,
                )  # fmt: skip
            else:
                k = k0 + offs_k
                a = tl.load(
                    act_ptr + rows[:, None] * stride_act + k[None, :],
                    mask=row_ok[:, None] & (k < inter)[None, :],
                    other=0.0,
                )  # [BLOCK_M, BLOCK_K]
                acc, scale = _add_product(
                    acc, scale, a, w_rows, s_rows, k0, inter, n_ok, stride_sk, FORMAT, SCALE_BK, BLOCK_K,
                    PRECISION, K_TILED, AHEAD,
                )  # fmt: skip
        if ROWS == 1:
            acc = row_sums(acc)  # [1, BLOCK_N]
        token, slot = pair // SLOTS, pair % SLOTS
        weight = tl.load(
            weights_ptr + token * stride_weights + slot,
            mask=row_ok & (slot < WEIGHTED_SLOTS),
            other=1.0,
        ).to(tl.float32)  # [ROWS]: 1 for a shared slot the weights do not give
        tl.store(
            partial_ptr + pair[:, None] * stride_partial + offs_n[None, :],
            acc * weight[:, None],
            mask=row_ok[:, None] & n_ok[None, :],
        )


@triton.jit(do_not_specialize=["tokens"])  # (the call's count: engine/warm_up.py)
def expert_combine_kernel(
    partial_ptr,  # [tokens * SLOTS, hidden] float32
    out_ptr,  # [tokens, hidden], written: the sum, or (READY) the new stream
    shared_out_ptr,  # [tokens, hidden] (APART), written: the shared slots' sum, out's row stride
    ids_ptr,  # [tokens, TOP_K] (SKIPS): -1 where a routed slot was another rank's expert
    stream_ptr,  # [tokens, hidden] (READY): the residual stream the sum is added to, out's row stride
    addend_ptr,  # [tokens, hidden] (ADDEND): another output added to the sum first, out's row stride
    norm_w_ptr,  # [hidden] (READY): the next RMSNorm's weight
    normed_ptr,  # [tokens, hidden] (READY), written: new stream * (norm_offset + weight), out's row stride
    sq_ptr,  # [programs along hidden, tokens] float32 (READY), written: each program's sum of squares
    tokens,
    hidden,
    norm_offset,
    stride_partial,
    stride_out,
    stride_ids,
    SLOTS: tl.constexpr,
    TOP_K: tl.constexpr,
    SKIPS: tl.constexpr,
    APART: tl.constexpr,  # the shared slots summed into shared_out_ptr, not with the routed ones
    READY: tl.constexpr,  # the sum added to the stream, made ready for the next norm (``NormedRows``)
    ADDEND: tl.constexpr,  # (READY) addend_ptr's row added to the sum before the stream
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (layers/pdl.py)
):
    """A token's SLOTS rows summed in slot order: routed slots, then shared ones (deterministic); APART: the
    routed slots' sum and the shared slots' sum, each written. SKIPS: a routed slot whose id is -1 adds zeros
    (its row was never written: ``grouped_experts``' skipped_slots). READY: the sum, rounded to the stream's
    dtype as the block's output is, added to the stream (the norm kernel's residual add: float32, rounded),
    and the new stream made ready for the next norm (layers/normed_rows.py ``NormedRows``); ADDEND: another
    output of the block (a shared MLP run beside the experts) added to the rounded sum first, rounded again."""
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = offs < hidden
    rows = partial_ptr + token * SLOTS * stride_partial + offs
    acc = tl.zeros([BLOCK_H], tl.float32)
    shared_acc = tl.zeros([BLOCK_H], tl.float32)
    for slot in tl.static_range(SLOTS):
        placed = ok
        if SKIPS and slot < TOP_K:
            placed = ok & (tl.load(ids_ptr + token * stride_ids + slot) >= 0)
        row = tl.load(rows + slot * stride_partial, mask=placed, other=0.0)
        if APART and slot >= TOP_K:
            shared_acc += row
        else:
            acc += row
    out = acc.to(out_ptr.dtype.element_ty)
    at = token * stride_out + offs
    if ADDEND:  # (a tensor add of the two outputs: float32, rounded)
        extra = tl.load(addend_ptr + at, mask=ok, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + extra).to(out_ptr.dtype.element_ty)
    if READY:
        s = tl.load(stream_ptr + at, mask=ok, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + s).to(out_ptr.dtype.element_ty)
        s = out.to(tl.float32)  # (the stream as stored)
        w = tl.load(norm_w_ptr + offs, mask=ok, other=0.0).to(tl.float32) + norm_offset
        tl.store(normed_ptr + at, (s * w).to(normed_ptr.dtype.element_ty), mask=ok)
        tl.store(sq_ptr + tl.program_id(1) * tokens + token, tl.sum(s * s, axis=0))
    tl.store(out_ptr + at, out, mask=ok)
    if APART:
        tl.store(
            shared_out_ptr + at,
            shared_acc.to(shared_out_ptr.dtype.element_ty),
            mask=ok,
        )
