"""y [M, N] = x [M, K] @ W.T for a weight W [N, K] kept quantized in memory: one Triton kernel for the three
published formats (quant/dequantize.py defines their math), few rows and many.

The weight is read once, in its stored bytes, and dequantized in registers (quant/weight_tiles.py
``weight_tile``) into x's dtype, then multiplied on the tensor cores with float32 accumulation:
- "fp8_block": fp8 [N, K] times scale_inv [ceil(N/bn), ceil(K/bk)] (DeepSeek-V3's ``weight_dequant``
  multiplies); a K step of BK columns either lies in one scale column (BK divides bk: each row of the
  tile takes one scale) or spans several (BK a multiple of bk: each row's scales broadcast over their
  columns, ``block_scales``);
- "fp8_tensor": fp8 [N, K] times one scale (ModelOpt), applied to the float32 accumulator at the end;
- "int4_group": int32 [N, K/8] words of eight nibbles, lowest first, each stored + 8 (compressed-tensors
  pack-quantized), times scale [N, K/group]; on a GPU, for x and the scales in one half-precision dtype, each
  word turned into its eight values by a few PTX instructions on value pairs (``int4_tile_by_ptx``).
``weight_tile`` is also how the grouped-expert kernels (layers/moe_kernels.py) read quantized expert
stacks, with "none" for plain half-precision weights.

Few rows (decode and verify, M <= ``FEW_ROWS``): a program owns BN output columns of all M rows (one
row tile of 16, 32 or 64) and streams its weight rows along K; where the column blocks alone cannot
fill the GPU (a narrow N, e.g. DeepSeek's kv_a 576 or q_a 1536 columns), K is split among programs
(``few_row_tiles``), each writing a float32 partial, and the last program of a column block to finish (a
counter in global memory, layers/zeroed_scratch.py: zero between launches, made by the first eager call,
which also compiles the kernel) sums the partials in split order: one launch, the same bits every time.
The tiles and the split depend on N and K only (and the row tile on M's bucket), not on the data: the
launch is fixed for a captured CUDA graph and nothing is allocated but the output and the partials.
Which tiles serve best is measured (benchmarks/scripts/quant_matmul_settings.py).
Many rows (prefill): the same kernel with 64 x 128 or 128 x 128 output tiles and no split.

ONE-ROW: a single row (decode at batch 1) of an fp8 weight of at most ``ONE_ROW_MAX_K`` columns takes a row
tile of one (``one_row_tiles``, ``row_times_tile``): each weight value converted to float32 and multiplied by x
on the CUDA cores, with no tl.dot and no software pipeline (whose stages pay over many K steps: Llama-8B's
down_proj, 14336 columns, took 25.7 us this way against 21.3 in the 16-row tiles, where Qwen3-Next's in_proj_qkvz
took 12.5 against 13.7 and DeepSeek-V2-Lite's q 6.2 against 8.4; benchmarks/scripts/one_row_products.py on an
H200, gpu_2026-12-04 call 2). The 16-row tile, tl.dot's fewest rows, converts each value into x's dtype (with its scale), stages it
through shared memory and feeds mma.sync with 15 rows of zeros: about 200 instructions a thread a K step of
a 32 x 128 fp8 tile (sm_90 PTX, gpu_2026-12-03f), so it read an fp8 weight no faster than a bf16 one of
twice its bytes (DeepSeek-V2-Lite's o 2048 x 2048: 6.7 us against a floor of 0.87; gpu_2026-12-01g call 1).
An INT4 weight of at most ``ONE_ROW_MAX_INT4_K`` columns takes the one-row tile too, each nibble turned into
float32 in place with no conversion instruction (``_int4_row_part``). Row streams (``one_row_streams``, shipped): a
one-row fp8 product takes a few whole weight rows a program, K unsplit, every load of a step in flight.

INT4 K steps: where K is a whole number of them (``K_TILED``, the launch's), the PTX path masks its words and
scales by rows alone, so they load as vectors that the software pipeline streams; masked along K, each thread's
bf16 scales came as 2-byte loads outside the pipeline, each K step waiting on them. Where a K step lies in one
group (groups of 128 columns, RedHatAI's and Gemma QAT's w4a16, against Kimi-K2's 32) a row's scales are one 2-byte
value a step, which the pipeline does not stream whatever the masks (Triton's cp.async takes 4 bytes or more;
compiled for sm_90, the load stayed in the loop, its value used at once): there the loop loads each step's scales one
step ahead (``int4_group_scales``), so the load's latency passes under a step of products. (Smaller groups keep the
pipeline's streaming, several steps ahead.)

A few-row product may finish its tiles as the fused residual stack's projections do (``RowEpilogue``;
layers/fused_projection.py routes its fp8 and INT4 weights here outside batch-invariant mode): each row scaled by
its input norm's factor, relu^2, the residual added, the result made ready for the next norm (the stream times
the norm's scale and one partial sum of squares a column block), or a gated MLP's [gate | up] rows gated by SiLU
or GELU-tanh (a program's columns half gate rows, half the up rows of the same outputs). The program that stores
a tile does it (with K split, the last to arrive, on the splits' sum), so the epilogue costs no launch and reads
nothing twice.

Batch-invariant mode (attention/context.py ``batch_invariant``): every M takes one row's tiles (16-row tiles,
the split of N and K alone), so a row's sums over K run in the same order whatever the batch; a split launch
takes at most ``_INVARIANT_ROWS`` rows (more rows: one launch each such chunk), which bounds its float32
partials and its arrival counters.

On Hopper the kernel launches with programmatic dependent launch (layers/pdl.py): a program starts while the
kernel before it drains, asks for the first ``_PREFETCH_BYTES`` of each of its weight rows' share of K to be
brought into L2 (the weight is no earlier kernel's output), then waits for its input. A small few-row launch
is all latency: DeepSeek-V2-Lite's kv_a (576 x 2048 in fp8) took 5.5 us launched plainly against a floor of
0.25 (benchmarks/scripts/fp8_dequant_variants.py on an H200, gpu_2026-12-01g call 1, one call's share of a
graph of 8). Converting the weight by bit moves, scaling the accumulator instead of each weight value, or
multiplying fp8 x fp8 (w8a8) was no faster there. With the dependent launch and 256 bytes prefetched (call 3),
kv_a took 4.7 us, o (2048 x 2048) 6.2 against 6.7 and Llama-8B's down_proj 21.4 against 22.3, while
Qwen3-Next's in_proj_qkvz and Step-3.5's q_proj (25M values) took 13.7 against 13.0 and V2-Lite's q 8.3
against 7.6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from outpace.attention.context import batch_invariant
from outpace.layers.fused_kernels import gelu_tanh, row_rstd
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options, prefetch_l2
from outpace.layers.quant.weight_tiles import (
    int4_group_scales,
    int4_tile,
    row_sums,
    row_times_tile,
    scale_rows,
    weight_tile,
)
from outpace.layers.sm_count import num_sms
from outpace.layers.zeroed_scratch import zeroed_scratch

FORMATS = ("fp8_block", "fp8_tensor", "int4_group")
FEW_ROWS = 64  # up to this many rows: the weight-streaming launch (module docstring)
_MAX_TILES = 1 << 16  # output tiles a split-K launch may have (the counters' length)
# K is split until about this many programs per SM stream (the grouped experts, 1024 programs of 32 x 128
# fp8 tiles, read 3.2 TB/s on an H200 where 224 unsplit programs of DeepSeek's o read 1.8), each split
# walking at least _MIN_SPLIT_STEPS steps of K (the float32 partials stay small beside the weight)
_PROGRAMS_PER_SM = 8
_MIN_SPLIT_STEPS = 4
_INVARIANT_ROWS = 256  # rows a split launch takes at most (batch-invariant mode: module docstring)
# bytes of each weight row a program asks into L2 before waiting on its input (module docstring): 2 lines of 128
# bytes (256 fp8 columns, 512 INT4 ones): of 0 / 256 / 512 / 1024, the fastest or within 0.1 us of it at every
# shape and row count timed (gpu_2026-12-01g call 3: benchmarks/scripts/fp8_dequant_variants.py --prefetch-bytes)
_PREFETCH_BYTES = 256
_LINE = 128
# One row (decode at batch 1) on the CUDA cores (module docstring: ONE-ROW) for fp8 weights of at most ONE_ROW_MAX_K
# columns outside batch-invariant mode: (BN, BK, warps, stages, programs an SM and K steps a split at least: the K
# split); off (False), one row takes the 16-row tiles. benchmarks/scripts/one_row_products.py sweeps them.
one_row_cuda_cores = True
one_row_tiles = (16, 512, 2, 1, 8, 1)
ONE_ROW_MAX_K = 4096
# ... and, when set, for an fp8 weight of at least one K step whose column blocks of these tiles alone give at least
# 1.5 programs an SM (4 where K takes more than one step), K not split: (BN, BK, warps, stages). Alone, one call's
# share of a graph of 8 calls (benchmarks/scripts/fp8_row_conversion.py, gpu_2026-12-04d calls 3 and 4, which agreed
# within 0.1 us), us against ``one_row_tiles``: Step-3.5's q_proj at tensor parallelism 2 (6144 x 4096) 10.8 / 13.7,
# Qwen3-Next's in_proj_qkvz (12352 x 2048) 11.5 / 12.2, DeepSeek-V2-Lite's q (3072 x 2048) 5.5 / 6.2 and o (2048 x
# 2048) 5.0 / 5.6; where K had to be split to fill the GPU they lost (Qwen3-Next's out_proj 2048 x 4096, split in 2:
# 8.0 / 7.2). In the decode step at batch 1, 512 cached tokens, block FP8 (decode_settings.py one_row_wide_*_fp8, each
# setting's better of two passes; gpu_2026-12-04e calls 2 and 3), step ms shipped tiles / these: the Qwen3-Next slice
# 0.670 / 0.646, the Step-3.5 slice 1.293 / 1.251, DeepSeek-V2-Lite 1.817 / 1.781. None turns them off.
ONE_ROW_WIDE_TILES = (8, 2048, 8, 1)
one_row_wide_tiles: tuple[int, int, int, int] | None = ONE_ROW_WIDE_TILES
# ... unless ``one_row_streams`` is set (shipped): then every one-row fp8 product of at most ONE_ROW_MAX_K columns takes
# "row streams" (``_row_stream_tiles``): a program reads a few whole weight rows, BK columns a step, K never split, 8
# warps; BK the columns rounded up to a power of two (at most 4096), the rows a program as many as make 16 KB a step
# (2 to 8). The shape of a plain CUDA kernel that reads each row's whole K from one block with all its loads in flight
# (benchmarks/scripts/cuda_gemv_probe.py). Alone, us a call in a graph of 8 on an H100 (gpu_2026-12-06 call 39), the
# shipped rule before / row streams: DeepSeek-V2-Lite's kv_a 576 x 2048 4.84 / 4.22, o 2048 x 2048 5.44 / 5.40,
# Qwen3-30B-A3B's o_proj 2048 x 4096 7.93 / 7.11, Step-3.5's q_proj 6144 x 4096 12.79 / 14.55. In the decode step at
# batch 1, 512 cached tokens, block FP8 (decode_settings.py row_streams_*, call 40, the better of two passes that agreed
# in sign; the bf16 twin described below switched with them), ms before / row streams: DeepSeek-V2-Lite 2.028 / 2.019,
# the Qwen3-Next slice 0.723 / 0.716, the Step-3.5 slice 1.516 / 1.504.
# Two rows a program over 2048-column steps, each program's whole first step prefetched, read kv_a in 2.62 us alone
# but took the steps to 2.039, 0.786 (call 40, second sweep). One row of a plain bf16 weight in these tiles (in place of
# layers/fused_rows_kernel.py's 16-row tiles for products up to 16M values) was faster alone (kv_a 3.58 / 5.05) but
# slowed every bf16 decode step it was tried in: DeepSeek-V2-Lite 2.491 -> 2.516, Qwen3-30B-A3B 3.380 -> 3.411,
# Gemma-3-12B 9.238 -> 9.277, Llama-8B 5.436 -> 5.661 (its o_proj readying the MLP's norm in 512 parts), so it is not
# kept.
row_streams = {
    "fp8_block": (16384, 4096),
    "fp8_tensor": (16384, 4096),
}  # format: (bytes a step, most columns)
one_row_streams = True
stream_prefetch_bytes = _PREFETCH_BYTES  # of each weight row, what a row-stream program prefetches
_STREAM_PARTS = 256  # column blocks a row-stream launch has at most where 8 rows a program allow it
# ... and for INT4 weights (half a byte a column: ``_int4_row_part``) of at most this many columns: one row's products
# on the CUDA cores against the 16-row tiles (benchmarks/scripts/int4_tiles.py --one-row, gpu_2026-12-04b call 5),
# us: Kimi-K2's expert gate/up 4096 x 7168 20.0 / 25.6, down 7168 x 2048 14.6 / 16.9, DeepSeek-V3's o 7168 x 16384
# 55.8 / 60.2 (the shipped one-row tiles; the fastest of 7 within 1.3 us of them but at the down's 13.7)
ONE_ROW_MAX_INT4_K = 16384
_ONE_ROW_GROUP = (
    128  # columns a one-row step sums as one, unscaled formats (block FP8: a scale column)
)


@triton.jit(do_not_specialize=["M", "num_sq_parts"])
def _quant_matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] fp8 or [N, K / 8] int32
    s_ptr,  # the scale (module docstring)
    out_ptr,  # [M, N] x's dtype, written
    partial_ptr,  # [splits, M, N] float32 (SPLIT_K)
    counter_ptr,  # [>= tiles] int32, zero between launches (SPLIT_K)
    sq_in_ptr,  # [num_sq_parts, M] float32 (ROW_NORM): the input rows' partial sums of squares
    res_ptr,  # [M, N] (RESIDUAL)
    next_norm_ptr,  # [N] (NEXT_NORM): the next RMSNorm's weight
    normed_ptr,  # [M, N] contiguous, written (NEXT_NORM)
    sq_out_ptr,  # [column blocks, M] float32, written (NEXT_NORM)
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_om,
    stride_rm,
    splits,  # programs a column block's K is split among
    k_per_split,  # columns of one split, a multiple of BK
    num_sq_parts,
    eps,
    next_offset,
    FORMAT: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,  # BM 1: columns ``row_times_tile`` scales and sums as one
    K_TILED: tl.constexpr,  # K a multiple of BK (``weight_tile``)
    SPLIT_K: tl.constexpr,  # splits > 1
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (module docstring)
    PREFETCH_LINES: tl.constexpr,  # lines of each weight row prefetched (a power of two, or 0), with PDL
    LINE: tl.constexpr,  # bytes a line
    ROW_NORM: tl.constexpr,  # x is s * w_norm: each row's result times its RMSNorm factor (``row_rstd``)
    RELU2: tl.constexpr,
    RESIDUAL: tl.constexpr,
    NEXT_NORM: tl.constexpr,
    SWIGLU: tl.constexpr,  # the weight is [gate | up]: out [M, N / 2] = silu(gate) * up (``RowEpilogue.swiglu``)
    GELU: tl.constexpr,  # with SWIGLU: gelu_tanh(gate) * up (``RowEpilogue.gelu``)
    BLOCK_P: tl.constexpr,  # num_sq_parts padded to a power of two (ROW_NORM)
):
    """Program (row tile, column block, split): rows [r * BM, ...) x columns [c * BN, ...) over the
    split's columns of K; row tiles on the grid's fast axis, so the programs sharing a weight tile run
    together and read it from L2. The tile's epilogue (``RowEpilogue``) runs on its whole product. With
    SWIGLU a program's columns are BN / 2 gate rows and the up rows of the same outputs."""
    row_tile, col_block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_tile * BM + tl.arange(0, BM)  # [BM]
    if SWIGLU:  # gate rows j, then up rows N / 2 + j, for the outputs j of this block
        outs = col_block * (BN // 2) + tl.arange(0, BN) % (BN // 2)  # [BN]
        cols = outs + (tl.arange(0, BN) >= BN // 2) * (N // 2)
        n_ok = outs < N // 2
    else:
        cols = col_block * BN + tl.arange(0, BN)  # [BN]
        n_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn  # [BN, 1]
    s_rows = scale_rows(s_ptr, cols, stride_sn, FORMAT, SCALE_BN)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BM, 1]
    if BM == 1:  # the groups apart (``row_times_tile``)
        acc = tl.zeros((BN, BK // GROUP), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    k_start = split * k_per_split
    # the weight is no earlier kernel's output: ask for the split's first lines, then wait
    if PREFETCH_LINES > 0:
        if FORMAT == "int4_group":  # int32 words of 8 nibbles: half a byte a column
            first, row_bytes, stride_bytes = k_start // 2, K // 2, stride_wn * 4
        else:
            first, row_bytes, stride_bytes = k_start, K, stride_wn
        lines = (
            first + tl.arange(0, PREFETCH_LINES) * LINE
        )  # [PREFETCH_LINES] byte offsets in a row
        lines = tl.where(lines < row_bytes, lines, first)  # never past a row's end
        starts = tl.where(n_ok, cols, 0).to(tl.int64) * stride_bytes  # [BN]: each row's first byte
        prefetch_l2(w_ptr.to(tl.pointer_type(tl.int8)) + starts[:, None] + lines[None, :])
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    # a K step in one INT4 group: its scales loaded a step ahead (module docstring: INT4 K steps)
    SCALES_AHEAD: tl.constexpr = FORMAT == "int4_group" and BM > 1 and SCALE_BK >= BK
    if SCALES_AHEAD:  # the first step's
        scale_next = int4_group_scales(s_rows, k_start, K, n_ok, stride_sk, SCALE_BK, BK, K_TILED)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BK):
        if BM == 1:  # (module docstring: ONE-ROW)
            acc = row_times_tile(
                acc,
                x_rows,
                w_rows,
                s_rows,
                k0,
                K,
                n_ok,
                stride_sk,
                FORMAT,
                SCALE_BK,
                BK // GROUP,
                GROUP,
            )
        else:
            ks = k0 + tl.arange(0, BK)
            x = tl.load(
                x_rows + ks[None, :], mask=(rows < M)[:, None] & (ks < K)[None, :], other=0.0
            )
            if SCALES_AHEAD:  # this step's scales loaded a step ago, the next step's now
                scale = scale_next
                scale_next = int4_group_scales(
                    s_rows, k0 + BK, K, n_ok, stride_sk, SCALE_BK, BK, False
                )  # (masked along K: past the last step it reads nothing)
                w = int4_tile(
                    w_rows, scale, k0, K, n_ok, SCALE_BK, BK, x_ptr.dtype.element_ty, K_TILED
                )
            else:
                w = weight_tile(
                    w_rows, s_rows, k0, K, n_ok, stride_sk, FORMAT, SCALE_BK, BK,
                    x_ptr.dtype.element_ty, K_TILED,
                )  # [BN, BK]  # fmt: skip
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)  # [BM, BN]
    if BM == 1:
        acc = row_sums(acc)  # [1, BN]
    if FORMAT == "fp8_tensor":
        acc *= tl.load(s_ptr).to(tl.float32)
    out_mask = (rows < M)[:, None] & n_ok[None, :]
    if SPLIT_K:  # the last of the tile's splits to arrive goes on with their sum
        total, last = sum_splits(acc, partial_ptr, counter_ptr, rows, cols, out_mask, M, N, splits)
    else:
        total, last = acc, True
    if last:
        if ROW_NORM:
            total *= row_rstd(sq_in_ptr, rows, rows < M, M, num_sq_parts, K, eps, BLOCK_P)
        if RELU2:  # of the product rounded to out's dtype, as the projection and then the activation round it
            total = tl.maximum(total.to(out_ptr.dtype.element_ty).to(tl.float32), 0.0)
            total = total * total
        if RESIDUAL:
            res_ptrs = res_ptr + rows.to(tl.int64)[:, None] * stride_rm + cols[None, :]
            total += tl.load(res_ptrs, mask=out_mask, other=0.0).to(tl.float32)
        if SWIGLU:
            _store_swiglu(total, out_ptr, rows, col_block, M, N // 2, stride_om, BM, BN // 2, GELU)
        else:
            out = total.to(out_ptr.dtype.element_ty)
            out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
            tl.store(out_ptrs, out, mask=out_mask)
        # the stream as stored, made ready for the next norm (layers/normed_rows.py NormedRows)
        if NEXT_NORM:
            s = tl.where(out_mask, out.to(tl.float32), 0.0)
            w_next = (
                tl.load(next_norm_ptr + cols, mask=n_ok, other=0.0).to(tl.float32) + next_offset
            )
            tl.store(
                normed_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :],
                (s * w_next[None, :]).to(normed_ptr.dtype.element_ty),
                mask=out_mask,
            )
            tl.store(sq_out_ptr + col_block * M + rows, tl.sum(s * s, axis=1), mask=rows < M)


@triton.jit
def _store_swiglu(
    total,  # [BM, 2 * H] float32: the tile's gate products, then its up products
    out_ptr,  # [M, half], written
    rows,  # [BM]
    col_block,
    M,
    half,  # the outputs (the weight's rows / 2)
    stride_om,
    BM: tl.constexpr,
    H: tl.constexpr,
    GELU: tl.constexpr,  # the gate's activation GELU-tanh, not SiLU
):
    """act(gate) * up of the tile's outputs, rounded as the product's store and a gating launch after it round
    them (gate and up to out's dtype, act to it, the product to it): for SiLU the bits of layers/fused_kernels.py's
    ``_silu_and_mul_kernel``; GELU-tanh is that file's ``gelu_tanh``, the fused rows' formula."""
    gate, up = tl.split(tl.permute(tl.reshape(total, (BM, 2, H)), (0, 2, 1)))  # [BM, H] each
    dtype = out_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)
    if GELU:
        act = gelu_tanh(g).to(dtype).to(tl.float32)
    else:
        act = tl.div_rn(g, 1.0 + tl.exp(-g)).to(dtype).to(tl.float32)
    outs = col_block * H + tl.arange(0, H)  # [H]
    tl.store(
        out_ptr + rows.to(tl.int64)[:, None] * stride_om + outs[None, :],
        (act * up.to(dtype).to(tl.float32)).to(dtype),
        mask=(rows < M)[:, None] & (outs < half)[None, :],
    )


@triton.jit
def sum_splits(
    acc,  # [BM, BN] float32: this program's product over its split of K
    partial_ptr,
    counter_ptr,
    rows,  # [BM]
    cols,  # [BN]
    out_mask,  # [BM, BN] the tile's real elements
    M,
    N,
    splits,
):
    """With K split (``_quant_matmul_kernel``, module docstring): the program's float32 partial stored, and for
    the last of the tile's splits to arrive (``last``) their sum in split order -> (sum, last)."""
    tile_offs = rows.to(tl.int64)[:, None] * N + cols[None, :]  # [BM, BN] in one [M, N] slice
    tl.store(partial_ptr + tl.program_id(2) * M * N + tile_offs, acc, mask=out_mask)
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    # every thread's partial before the count (one thread takes it for the program: the barrier makes
    # the release cumulative over the other threads' stores, as in deltanet_step_kernel.py's splits);
    # acq_rel at gpu scope: the last to arrive acquires every split's partial
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == splits - 1
    total = tl.zeros(acc.shape, dtype=tl.float32)
    if last:  # the last of the tile's splits: sum them in split order
        for s in range(splits):
            total += tl.load(
                partial_ptr + s * M * N + tile_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
            )
        tl.atomic_xchg(counter_ptr + tile, 0)  # zero again for the next launch
    return total, last


@dataclass(frozen=True)
class RowEpilogue:
    """What ``_quant_matmul_kernel`` does to an output tile's whole product before it stores it: the pieces of
    the fused residual stack (layers/normed_rows.py ``NormedRows``) for a weight read quantized.

    row_norm: (sq_parts [P, M] float32, eps): x is a residual stream times its RMSNorm's weight, and each row's
      product is scaled by the norm's factor from those partial sums of the stream's squares;
    relu2: relu(.)^2 of the product rounded to the output's dtype (Nemotron-H's up_proj);
    residual: [M, N] (unit column stride) added;
    next_norm: (weight [N], offset, normed [M, N], sq_parts [column blocks, M] float32), both outputs
      contiguous and written: the result made ready for the RMSNorm of scale offset + weight that reads it
      next, one part of its sums of squares a column block (``column_blocks``);
    swiglu: the weight [2 * I, K] is gate rows then up rows, and the output [M, I] is silu(gate) * up (with the
      input norm's factor at most), as the product then layers/fused_kernels.py's SwiGLU launch round it;
    gelu: with swiglu, the gate's activation is GELU-tanh (Gemma's GeGLU: layers/fused_kernels.py ``gelu_tanh``)."""

    row_norm: tuple[torch.Tensor, float] | None = None
    relu2: bool = False
    residual: torch.Tensor | None = None
    next_norm: tuple[torch.Tensor, float, torch.Tensor, torch.Tensor] | None = None
    swiglu: bool = False
    gelu: bool = False


@dataclass(frozen=True)
class QuantTiles:
    """A launch of ``_quant_matmul_kernel`` (module docstring). A few-row tile of 16 or 32 rows is under
    wgmma's M of 64: it multiplies with mma.sync, the dequantized weight in registers
    (tests/layers/test_quant_matmul_sm90_compile.py reads it in the PTX)."""

    block_m: int
    block_n: int
    block_k: int
    splits: int
    k_per_split: int
    num_warps: int
    num_stages: int
    prefetch_bytes: int = _PREFETCH_BYTES  # of each weight row at most, with dependent launch

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (triton.cdiv(m, self.block_m), triton.cdiv(n, self.block_n), self.splits)


def plan(
    m: int,
    n: int,
    k: int,
    fmt: str,
    scale_block_k: int,
    device: torch.device,
    next_norm: bool = False,
) -> QuantTiles:
    """Tiles for an [m, k] x [n, k] product in ``fmt`` whose scales cover ``scale_block_k`` columns (``next_norm``:
    whose epilogue readies a next norm). Few rows: fp8 32 columns a program (64 from 16384 columns) and 128 columns a
    K step (16-byte loads of a row), INT4 64 columns a program and 128 a step (or the group); K split as
    ``few_row_tiles`` says. Up to 16 rows of an fp8 weight of ``_WIDE_FP8_WEIGHT`` values or more: 64 columns a
    program, 256 a K step, 3 stages, 4 programs an SM (``_wide_fp8_tiles``). One row: row streams
    (``one_row_streams``) or the one-row tiles (ONE-ROW)."""
    int4 = fmt == "int4_group"
    if batch_invariant():  # one row's tiles whatever M (module docstring, batch-invariant mode)
        m = 1
    elif m == 1 and one_row_cuda_cores and k <= one_row_max_k(fmt):
        if one_row_streams and not int4:
            return _row_stream_tiles(n, k, fmt, next_norm)
        wide = _one_row_wide_tiles(n, k, fmt, device)
        if wide is not None:
            return wide
        bn, bk, warps, stages, per_sm, min_steps = one_row_tiles
        return few_row_tiles(
            1, n, k, device, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
            programs_per_sm=per_sm, min_split_steps=min_steps, one_row=True,
        )  # fmt: skip
    if m > FEW_ROWS:
        block_m = 128 if m >= 128 else 64
        block_k = max(64, scale_block_k) if int4 else 64
        return QuantTiles(block_m, 128, block_k, 1, k, num_warps=8, num_stages=3)
    if not int4 and m <= 16 and n * k >= _WIDE_FP8_WEIGHT:
        return _wide_fp8_tiles(m, n, k, device)
    if int4:
        # 64 columns a program, 128-column K steps (64 bytes of a row): of 6 tiles (benchmarks/scripts/int4_tiles.py,
        # gpu_2026-12-04b call 3; group 32, bf16 scales), us at one row against 32 x 256 before: Kimi-K2's expert
        # gate/up 4096 x 7168 25.9 / 32.5, down 7168 x 2048 16.9 / 22.4, DeepSeek-V3's o 7168 x 16384 60.5 / 83.9
        # (1.09 TB/s of packed bytes); 512-column steps and 8 warps slower
        return few_row_tiles(
            m, n, k, device, block_n=64, block_k=max(128, scale_block_k), num_warps=4,
            num_stages=4 if m <= 32 else 3,
        )  # fmt: skip
    return few_row_tiles(
        m,
        n,
        k,
        device,
        block_n=64 if n >= 16384 else 32,
        block_k=128,
        num_warps=4,
        num_stages=4 if m <= 32 else 3,
    )


def _row_stream_tiles(n: int, k: int, fmt: str, next_norm: bool) -> QuantTiles:
    """One row's product of an [n, k] weight in row streams (``one_row_streams``): whole weight rows a program, K
    unsplit. At least 2 rows a program (SwiGLU: a gate and an up row); readying a next norm, at least n /
    ``_STREAM_PARTS`` up to 8: its partial sums of squares, one a program, are what the kernel after it loads whole
    (``row_rstd``)."""
    step_bytes, most_k = row_streams[fmt]
    block_k = min(triton.next_power_of_2(k), most_k)
    rows = step_bytes // block_k  # (a byte a value)
    least = triton.next_power_of_2(triton.cdiv(n, _STREAM_PARTS)) if next_norm else 2
    rows = min(8, max(rows, 2, least))
    k_per_split = triton.cdiv(k, block_k) * block_k
    return QuantTiles(1, rows, block_k, 1, k_per_split, 8, 1, prefetch_bytes=stream_prefetch_bytes)


def _one_row_wide_tiles(n: int, k: int, fmt: str, device: torch.device) -> QuantTiles | None:
    """``one_row_wide_tiles`` for one row of an [n, k] fp8 weight where they apply (their comment), else None."""
    if one_row_wide_tiles is None or fmt == "int4_group":
        return None
    bn, bk, warps, stages = one_row_wide_tiles
    programs, sms = triton.cdiv(n, bn), num_sms(device)
    if k < bk or 2 * programs < 3 * sms or (k > bk and programs < 4 * sms):
        return None
    return QuantTiles(1, bn, bk, 1, triton.cdiv(k, bk) * bk, warps, stages)


# From this many weight values (16.8M: a 4096 x 4096 projection) an fp8 product of up to 16 rows takes
# ``_wide_fp8_tiles``. benchmarks/scripts/quant_matmul_settings.py on an H200 (gpu_2026-11-30g call 2), block
# FP8, us at one row (8 and 16 alike), the default tiles against these: Step-3.5 q_proj 6144 x 4096 15.9 / 13.1,
# o_proj 4096 x 6144 15.4 / 13.3, Qwen3-Next in_proj_qkvz 12288 x 2048 14.5 / 13.0, Llama-8B down_proj
# 4096 x 14336 26.7 / 22.6, gate_up 28672 x 4096 42.0 / 38.6; below it the default tiles were the fastest
# (DeepSeek-V2-Lite o 2048 x 2048 6.7 / 7.8, kv_a 576 x 2048 5.5 / 7.3). The transposed product (the
# weight as wgmma's register A operand, removed since) was slower at every shape (q_proj 16.7-27.0).
_WIDE_FP8_WEIGHT = 1 << 24


def _wide_fp8_tiles(m: int, n: int, k: int, device: torch.device) -> QuantTiles:
    """The few-row tiles of a large fp8 weight (``_WIDE_FP8_WEIGHT``): two 128-column scale blocks a K step."""
    return few_row_tiles(
        m, n, k, device, block_n=64, block_k=256, num_warps=4, num_stages=3, programs_per_sm=4
    )


def few_row_tiles(
    m: int,
    n: int,
    k: int,
    device: torch.device,
    *,
    block_n: int,
    block_k: int,
    num_warps: int,
    num_stages: int,
    programs_per_sm: int = _PROGRAMS_PER_SM,
    min_split_steps: int = _MIN_SPLIT_STEPS,
    one_row: bool = False,
) -> QuantTiles:
    """A few-row launch (m <= ``FEW_ROWS``) of these tiles: a row tile of 16, 32 or 64 rows (m's bucket), or
    with ``one_row`` (m 1) a tile of one row on the CUDA cores (module docstring: ONE-ROW),
    K split until about ``programs_per_sm`` programs an SM stream, each walking at least
    ``min_split_steps`` steps of K. ``plan``'s choice, and the settings a sweep tries
    (benchmarks/scripts/quant_matmul_settings.py)."""
    block_m = 1 if one_row else (16 if m <= 16 else (32 if m <= 32 else 64))
    k_steps = triton.cdiv(k, block_k)
    col_blocks = triton.cdiv(n, block_n)
    wanted = max(1, (programs_per_sm * num_sms(device)) // col_blocks)
    steps_per_split = triton.cdiv(k_steps, max(1, min(k_steps // min_split_steps, wanted)))
    return QuantTiles(
        block_m,
        block_n,
        block_k,
        triton.cdiv(k_steps, steps_per_split),
        steps_per_split * block_k,
        num_warps,
        num_stages,
    )


def quant_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    fmt: str,
    scale_block: tuple[int, int],
    tiles: QuantTiles | None = None,
    epilogue: RowEpilogue | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (bf16, fp16; float32 on the CPU) @ W.T -> [M, N] in x's dtype ([M, N / 2] with
    ``epilogue.swiglu``; into ``out``, rows of any stride, when given), W the weight ``weight`` with ``scale``
    in format ``fmt`` (module docstring),
    ``scale_block`` the (rows, columns) one scale covers: (bn, bk) for fp8_block, (1, group) for int4_group,
    unused for fp8_tensor; the output tiles finished by ``epilogue`` when given (at most ``FEW_ROWS`` rows).
    The callers (fp8_linear_kernel.py, int4_linear_kernel.py, layers/fused_projection.py) check the shapes."""
    if fmt not in FORMATS:
        raise ValueError(f"quantized weights come as {', '.join(FORMATS)}, not {fmt!r}")
    m, k = x.shape
    n = weight.shape[0]
    if epilogue is not None and m > FEW_ROWS:
        raise ValueError(
            f"an epilogue finishes a few-row product (at most {FEW_ROWS} rows), not {m}"
        )
    swiglu = epilogue is not None and epilogue.swiglu
    if epilogue is not None and epilogue.gelu and not swiglu:
        raise ValueError("a GELU epilogue gates [gate | up] rows: it comes with swiglu")
    if swiglu and (n % 2 or epilogue.relu2 or epilogue.residual is not None or epilogue.next_norm):
        raise ValueError(
            f"a SwiGLU epilogue gates an even number of rows ({n}: gate, then up), with the input norm at"
            " most"
        )
    if out is None:
        out = torch.empty(m, n // 2 if swiglu else n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    x = x if x.stride(1) == 1 else x.contiguous()
    readies = epilogue is not None and epilogue.next_norm is not None
    t = tiles or plan(m, n, k, fmt, scale_block[1], x.device, next_norm=readies)
    if (
        fmt != "fp8_tensor"
        and t.block_k % scale_block[1]
        and (fmt == "int4_group" or scale_block[1] % t.block_k)
    ):
        raise ValueError(
            f"a K step of {t.block_k} columns over scales of {scale_block[1]} (weight_tile: a multiple"
            " of the scale's columns, or for fp8_block a divisor)"
        )
    if (
        t.splits > 1 and m > _INVARIANT_ROWS
    ):  # (planned so in batch-invariant mode only: module docstring)
        for r in range(0, m, _INVARIANT_ROWS):
            _launch(
                x[r : r + _INVARIANT_ROWS],
                weight,
                scale,
                fmt,
                scale_block,
                t,
                out[r : r + _INVARIANT_ROWS],
                RowEpilogue(),  # (no epilogue past FEW_ROWS)
            )
    else:
        _launch(x, weight, scale, fmt, scale_block, t, out, epilogue or RowEpilogue())
    return out


def column_blocks(
    m: int, n: int, k: int, fmt: str, scale_block_k: int, device: torch.device
) -> int:
    """The output column blocks of ``quant_matmul``'s launch over [m, k] x [n, k] (``plan``'s tiles): the parts of
    the sums of squares a ``RowEpilogue.next_norm`` writes."""
    return triton.cdiv(n, plan(m, n, k, fmt, scale_block_k, device, next_norm=True).block_n)


def one_row_max_k(fmt: str) -> int:
    """The most columns of a ``fmt`` weight whose one-row products run on the CUDA cores (ONE-ROW)."""
    return ONE_ROW_MAX_INT4_K if fmt == "int4_group" else ONE_ROW_MAX_K


def row_group(block_k: int, fmt: str, scale_block_k: int) -> int:
    """Columns a one-row K step of ``block_k`` sums as one (``row_times_tile``): a block-FP8 scale column's, an
    INT4 group's, else ``_ONE_ROW_GROUP``."""
    return min(block_k, scale_block_k if fmt in ("fp8_block", "int4_group") else _ONE_ROW_GROUP)


def prefetch_lines(row_bytes: int, most: int = _PREFETCH_BYTES) -> int:
    """Lines of ``_LINE`` bytes a program prefetches of each weight row whose split spans ``row_bytes`` (module
    docstring): ``most`` bytes of them at most, rounded up to a power of two; 0 for none."""
    wanted = min(row_bytes, most)
    return triton.next_power_of_2(triton.cdiv(wanted, _LINE)) if wanted > 0 else 0


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    fmt: str,
    scale_block: tuple[int, int],
    t: QuantTiles,
    out: torch.Tensor,
    epilogue: RowEpilogue,
) -> None:
    """One launch of ``_quant_matmul_kernel`` over x [M, K] into out [M, N] (rows of any stride)."""
    m, k = x.shape
    n = weight.shape[0]
    grid = t.grid(m, n)
    sq_in, eps = epilogue.row_norm or (out, 0.0)
    res = out if epilogue.residual is None else epilogue.residual
    w_next, next_offset, normed, sq_out = epilogue.next_norm or (out, 0.0, out, out)
    if epilogue.residual is not None and res.stride(1) != 1:
        raise ValueError(
            f"the residual an epilogue adds has unit column stride, not {res.stride(1)}"
        )
    if epilogue.next_norm is not None and (sq_out.shape[0] != grid[1] or normed.stride() != (n, 1)):
        raise ValueError(
            f"a next norm's outputs: contiguous normed rows and sums of squares for {grid[1]} column blocks"
            f" (got {sq_out.shape[0]})"
        )
    if t.splits > 1:
        if grid[0] * grid[1] > _MAX_TILES:
            raise ValueError(
                f"a split-K launch of {grid[0] * grid[1]} tiles (at most {_MAX_TILES})"
            )
        partial = torch.empty(t.splits, m, n, dtype=torch.float32, device=x.device)
        counters = zeroed_scratch(  # [_MAX_TILES] one an output tile, the launch's first ones
            "layers/quant/quant_matmul_kernel.py: the split-K arrival counters",
            x.device,
            _MAX_TILES,
            torch.int32,
        )
    else:
        partial = counters = out  # not read
    scale_2d = scale.reshape(1, 1) if fmt == "fp8_tensor" else scale
    pdl = pdl_available(x.device)
    row_bytes = t.k_per_split // (2 if fmt == "int4_group" else 1)
    _quant_matmul_kernel[grid](
        x,
        weight,
        scale_2d,
        out,
        partial,
        counters,
        sq_in,
        res,
        w_next,
        normed,
        sq_out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        scale_2d.stride(0),
        scale_2d.stride(1),
        out.stride(0),
        res.stride(0),
        t.splits,
        t.k_per_split,
        sq_in.shape[0],
        eps,
        next_offset,
        FORMAT=fmt,
        SCALE_BN=scale_block[0],
        SCALE_BK=scale_block[1],
        BM=t.block_m,
        BN=t.block_n,
        BK=t.block_k,
        GROUP=row_group(t.block_k, fmt, scale_block[1]),
        K_TILED=k % t.block_k == 0,
        SPLIT_K=t.splits > 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PDL=pdl,
        PREFETCH_LINES=prefetch_lines(row_bytes, t.prefetch_bytes) if pdl else 0,
        LINE=_LINE,
        ROW_NORM=epilogue.row_norm is not None,
        RELU2=epilogue.relu2,
        RESIDUAL=epilogue.residual is not None,
        NEXT_NORM=epilogue.next_norm is not None,
        SWIGLU=epilogue.swiglu,
        GELU=epilogue.gelu,
        BLOCK_P=triton.next_power_of_2(sq_in.shape[0]) if epilogue.row_norm is not None else 1,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
        **pdl_launch_options(pdl),
    )
