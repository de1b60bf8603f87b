"""A decoder layer's few-row projections with their element-wise neighbours folded in (decode and
small verify batches on the GPU, where every projection is one pass over its weights).

At M <= 16 rows a projection is bound by reading its weights, and the small kernels around it (the
RMSNorm in front, the residual add, SiLU*mul, RoPE, the KV-cache write after it) cost their launch
and a round trip of the activations each. Here one kernel does a projection and its neighbours:

- ``project_rows``         x @ W.T                         (a projection with no neighbour to fold in)
- ``project_add``          residual + x @ W.T              (o_proj, down_proj: the residual stream)
- ``project_add_normed``   the same, and the new stream made ready for the RMSNorm after it
- ``norm_project_qkv``     [q | k | v] = RMSNorm(s) @ W_qkv.T; the per-head q/k RMSNorms of Qwen3-style
                           layers when given; RoPE on q and k; k and v stored straight into the paged
                           KV cache at the tokens' slots; returns q (with q_size 0: a k/v-only write).
                           With per-head norms on heads too wide for one program an SM (head_dim 256 or
                           512: Gemma, Qwen3-Next), a plain projection then ``qkv_heads_kernel`` per head
- ``norm_project_qkv_gate`` the same over [q | k | v | gate] (Step-3.5's head-wise gate) or with each q
                           head's gate head beside it (Qwen3-Next): the gate's rows ride in the plain
                           projection's launch, their products returned beside q
- ``norm_project_swiglu``  silu(g) * u, [g | u] = RMSNorm(s) @ W_gate_up.T (``project_swiglu``: of x, no norm)
- ``norm_project``         RMSNorm(s) @ W.T                (the LM head after the final norm; optionally
                           soft-capped, Gemma's final_logit_softcapping)
- ``project_normed`` + ``add_normed`` (layers/normed_rows.py): a "sandwich" norm (Gemma: RMSNorm on a
                           projection's output before the residual add), the new stream made ready for the
                           norm after it

Norm variants: an RMSNorm's scale is ``offset + w`` (offset 1.0: Gemma 3's (1 + w) norms; 0.0 by default),
always applied in float32; the per-head q/k norms take an offset too, and v may be normalised without a
weight (Gemma 4's v norm). The gate activation of [gate | up] is SiLU or GELU-tanh (Gemma).

RMSNorm folds into the product because its scale is one number per row (layers/normed_rows.py
``NormedRows``: the stream readied by the kernel that wrote it). The kernel itself is
layers/fused_rows_kernel.py (how a program's rows and outputs are laid out, the pairs of RoPE and SwiGLU), and
the per-head kernel of wide heads layers/qkv_heads_kernel.py.

Rows: tiles of 16 (``MAX_ROWS``). The normal path takes few rows (one tile);
batch-invariant mode takes any number (``fused_rows_apply``), as layers/batch_invariant.py's skinny kernel
does: every tile is its own [16, BK] x [BK, BN] ``tl.dot`` walking K in one order, the sums of squares of
a row are reduced in the order of the programs that wrote them, and the tiles, the outputs a program and
the warps are chosen from N, K and the epilogue alone (``_launch_grid``), never from M; so a row's bits
depend on its own input row only, whether it is decoded alone or verified among 64.

Weights stored in fp8 (``Fp8Weight``) or INT4 (``Int4Weight``, Gemma 4 QAT's projections): outside batch-invariant
mode the plain and SwiGLU entries hand them to the split-K quantized product (layers/quant/quant_matmul_kernel.py),
which reads fp8 faster at few rows than these kernels' stream (and INT4, which they do not read) and finishes its
tiles with the same epilogue (the input norm's factor, relu^2, the residual, the next norm readied, SiLU's or
GELU-tanh's gating): ``quantized_rows_apply``. That puts quantized models on the fused residual stack
(DeepSeek-V2-Lite's block-FP8 layers ran eagerly before, each block norm a launch of its own:
benchmarks/results/gpu_2026-12-01i). In batch-invariant mode INT4 weights stay off it (layers/fused_decoder.py
``fused_weight``).

On Hopper GPUs the kernels launch with programmatic dependent launch (layers/pdl.py).
With TRITON_INTERPRET=1 the kernels also run on CPU tensors (float32), which is how the tests check
them without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from outpace.attention.context import batch_invariant
from outpace.layers.activation import FUSED_ACTIVATIONS, GELU_TANH
from outpace.layers.fused_rows_kernel import (
    ACT_GELU_TANH,
    ACT_SILU,
    PLAIN,
    QKV,
    SWIGLU,
    fused_rows_kernel,
)
from outpace.layers.normed_rows import NormedRows
from outpace.layers.pdl import pdl_available, pdl_launch_options
from outpace.layers.qkv_heads_kernel import qkv_heads_kernel
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.int4_weight import Int4Weight
from outpace.layers.quant.quant_matmul_kernel import RowEpilogue, column_blocks, quant_matmul
from outpace.layers.skinny_gemm import MAX_ROWS
from outpace.layers.sm_count import num_sms
from outpace.layers.zeroed_scratch import zeroed_scratch

_PREFETCH_K = 512  # weight columns each program prefetches into L2 before waiting on its inputs (~2 us of reads)
# Software pipeline stages of the weight stream (``python -m outpace.bench.profile 8b`` sweeps them inside the
# captured 8B forward): more bytes in flight stream faster, but q/k/v leaves room for the attention programs
# that follow it to start beside it.
paired_stages = 5  # the LM head: 160 KB of shared memory
qkv_stages = 4  # 120 KB
plain_stages = 6  # o_proj, down_proj: 120 KB
# A plain projection's outputs a program up to which they stream as one sub-tile (each sub-tile is a new software
# pipeline over K: the H200's in-step times, benchmarks/scripts/projection_tiles.py, gpu_2026-11-29f call 3: Qwen3-Next's
# in_proj_qkvz, 94 outputs a program, 15.3 us as one 128-wide sub-tile against 19.1 as three of 32; DeepSeek-V3's
# o_proj, 55 outputs, 55.7 us against 65.3), with fewer stages than 32-wide ones (64 KB a stage at 128 x 256).
plain_sub_tile = 128
wide_sub_tile_stages = 4
# A plain projection whose sub-tiles are 16 outputs wide (at most 16 outputs an SM: Qwen3-Next's out_proj,
# DeepSeek-V2-Lite's o_proj and dense down_proj) keeps too few weight bytes in flight at BK 256 (8 KB a stage):
# BK 512 over 5 stages (80 KB) took 11.4 -> 8.7, 7.0 -> 5.8 and 26.6 -> 18.4 us at batch 1 on the H200
# (benchmarks/scripts/projection_tiles.py, gpu_2026-11-30c call 1; the same at batch 8); wider sub-tiles were
# fastest at the defaults.
narrow_block_k = 512
narrow_stages = 5
# SwiGLU (gate/up: two weight tiles a K step): outputs a sub-tile at most, the K step and the stages. Each
# sub-tile reads the x tile again and starts a new pipeline over K. One sub-tile of 128 at BK 128 over 4 stages
# took the captured decode step of the Llama-3.1-8B shape 4.065 -> 4.006 ms at b1@512 and 4.314 -> 4.215 at
# b8@512, Qwen3.5's 4.324 -> 4.292 and 4.972 -> 4.893, against sub-tiles of 32 at BK 256 over 5 stages
# (benchmarks/scripts/decode_settings.py swiglu_llama / swiglu_qwen35, gpu_2026-12-02 call 19).
swiglu_sub_tile = 128
swiglu_block_k = 128
swiglu_stages = 4  # 64 KB of weights a stage
# fp8 weights (``Fp8Weight``): stages in up to this much shared memory, at most this many (``_fp8_stages``;
# benchmarks/scripts/fp8_projection_settings.py sweeps them)
fp8_stage_bytes = 160 * 1024
fp8_max_stages = 8


def _quantized_product(weight) -> bool:
    """Whether the fused kernels leave this weight to the quantized product: an fp8 or INT4 weight outside
    batch-invariant mode (``fused_rows_apply`` says why; the fused kernels never read INT4)."""
    return isinstance(weight, (Fp8Weight, Int4Weight)) and not batch_invariant()


def quantized_rows_apply(x: torch.Tensor, weight) -> bool:
    """Whether the entry points of a plain or SwiGLU epilogue (``project_rows``, ``project_add``,
    ``project_add_normed``, ``norm_project``, ``project_swiglu``, ``norm_project_swiglu``) serve x [M, K] @
    weight.T for an fp8 weight the fused kernels leave to the quantized product (``_quantized_product``): the
    rows the fused kernels take, a weight of unit column stride whose scales cover a power of two columns (a K
    step of the product then spans whole scale blocks or lies in one). The product finishes its tiles with the
    entry's epilogue (``_quantized_launch``)."""
    return (
        _quantized_product(weight)
        and _served_rows(x)
        and weight.weight.stride(1) == 1
        and weight.scale_block[1] & (weight.scale_block[1] - 1) == 0
    )


def _quantized_launch(
    x: torch.Tensor,
    weight: Fp8Weight | Int4Weight,
    out: torch.Tensor,
    epilogue: int,
    half: int,
    norm: tuple[torch.Tensor, float] | None,
    residual: torch.Tensor | None,
    next_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    next_offset: float,
    act: str,
    relu2: bool,
) -> torch.Tensor:
    """``_launch`` for an fp8 or INT4 weight on the normal path (``quantized_rows_apply``): the split-K quantized
    product (layers/quant/quant_matmul_kernel.py), which reads fp8 faster at few rows than the fused kernels' stream,
    with the input norm's factor, relu^2, the residual add, the next norm's readying or the gating of the
    [gate | up] products (SiLU or GELU-tanh) done in its store (``RowEpilogue``)."""

    def product(into: torch.Tensor, **finish) -> torch.Tensor:
        return _finished_product(x, weight, RowEpilogue(row_norm=norm, **finish), into)

    if epilogue == SWIGLU.value:  # (``_launch`` took SiLU or GELU-tanh: FUSED_ACTIVATIONS)
        return product(out, swiglu=True, gelu=act in GELU_TANH)
    ready = None if next_norm is None else (next_norm[0], next_offset, next_norm[1], next_norm[2])
    return product(out, relu2=relu2, residual=residual, next_norm=ready)


def _finished_product(
    x: torch.Tensor,
    weight: Fp8Weight | Int4Weight,
    epilogue: RowEpilogue,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ the quantized weight's real values.T, its tiles finished by ``epilogue``: the quantized product
    (layers/quant/quant_matmul_kernel.py ``quant_matmul``), into ``out`` when given."""
    return quant_matmul(
        x,
        weight.weight,
        weight.scale,
        weight.format,
        weight.scale_block,
        epilogue=epilogue,
        out=out,
    )


def _next_norm_parts(x: torch.Tensor, weight) -> int:
    """The partial sums of squares a projection of x [M, K] with weight [N, K] writes where it readies the next
    norm: a program's sub-tiles each (``_launch_grid``), or the quantized product's column blocks."""
    m, k = x.shape
    n = weight.shape[0]
    if _quantized_product(weight):
        return column_blocks(m, n, k, weight.format, weight.scale_block[1], x.device)
    grid = _launch_grid(n, PLAIN.value, n, x.device)
    return grid.programs * grid.subs


def quantized_qkv_apply(x: torch.Tensor, weight) -> bool:
    """Whether ``norm_project_qkv`` serves x [M, K] @ weight.T for an fp8 weight that the fused kernels do
    not read (``_quantized_product``): the rows the fused kernels take (``_served_rows``), taken by the
    quantized product and the per-head kernel."""
    return _quantized_product(weight) and _served_rows(x)


# Rows the few-row kernels take at most outside batch-invariant mode (more: cuBLAS and the unfused chain). Past one
# tile they lose: the 8B shape's captured decode step at 24 / 32 / 64 rows took 4.78 / 4.90 / 5.05 ms on cuBLAS and
# 6.18 / 6.21 / 11.46 with a program a 16-row tile; in another run 5.03 / 5.00 / 5.15 on cuBLAS and 6.68 / 6.74 /
# 5.85 with a program holding every row (a tile of 32 or 64 rows, its stages in the same shared memory), on the
# H200 (benchmarks/scripts/fused_row_limit.py, benchmarks/results/gpu_2026-12-01j calls 2 and 3).
FEW_ROWS = MAX_ROWS


def _served_rows(x: torch.Tensor) -> bool:
    """Rows the few-row kernels take: half precision on the GPU, autograd off; few of them (M <= ``FEW_ROWS``:
    decode and small verify batches), or any number in batch-invariant mode (module docstring, Rows)."""
    return (
        x.is_cuda
        and x.dim() == 2
        and (x.shape[0] <= FEW_ROWS or batch_invariant())
        and x.dtype in (torch.bfloat16, torch.float16)
        and not torch.is_grad_enabled()
    )


def fused_rows_apply(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernels serve x [M, K] @ weight.T: rows of half precision on the GPU, autograd
    off; few rows (M <= 16: decode and small verify batches, where they beat cuBLAS), or any number in
    batch-invariant mode (a row's bits do not depend on M: module docstring, Rows).

    The mode's bit-identity on the GPU (tests/gpu/test_batch_invariant_gpu.py) failed with this rule until
    ``fused_rows_kernel`` stopped specializing M (its comment says why); it passes on the H200 since
    (benchmarks/results/gpu_2026-11-30, call 5)."""
    if isinstance(weight, Int4Weight):  # (the quantized product reads it: ``quantized_rows_apply``)
        return False
    if isinstance(weight, Fp8Weight):
        # fp8 weights in batch-invariant mode only (a row's bits independent of M): on the normal path the
        # split-K quantized kernel (layers/quant/quant_matmul_kernel.py) reads them faster. One program an SM
        # streaming K steps of 128 one-byte columns keeps too few bytes in flight: at Step-3.5-Flash's q_proj
        # at TP = 2 (6144 x 4096, one token) 28.3 us against 15.0, its shared gate/up 34 us against 5 + 5
        # (benchmarks/scripts/fp8_projection_settings.py, gpu_2026-11-30f call 3).
        fits = (
            batch_invariant()
            and weight.weight.stride(1) == 1
            and _fp8_block_k(weight.block[1]) is not None
        )
    else:
        fits = weight.dtype == x.dtype and weight.is_contiguous()
    return fits and _served_rows(x)


def _fp8_block_k(scale_columns: int) -> int | None:
    """The K step of an fp8 weight whose scales cover ``scale_columns`` columns: 128 (128 bytes of each
    weight row, as bf16's 64 columns), or the scale block where it is narrower; None where no power of two
    of at least 16 divides it."""
    step = 128
    while step >= 16:
        if scale_columns % step == 0:
            return step
        step //= 2
    return None


@dataclass(frozen=True)
class _Grid:
    """How a projection's outputs (columns, or column pairs) spread over the programs: ``outs`` a
    program, computed as ``subs`` sub-tiles of ``chunk`` outputs in a tile ``block_n`` wide."""

    programs: int
    outs: int
    subs: int
    chunk: int
    block_n: int


def _grid(n_out: int, outs: int, max_block: int, whole: int = 1) -> _Grid:
    """About ``outs`` outputs a program, in sub-tiles of at most ``max_block`` outputs that hold whole
    multiples of ``whole`` (a head's pairs, for per-head norms; ``max_block`` >= ``whole``)."""
    outs = triton.cdiv(outs, whole) * whole
    subs = triton.cdiv(outs, max_block // whole * whole)
    chunk = triton.cdiv(outs // whole, subs) * whole
    return _Grid(
        triton.cdiv(n_out, outs),
        outs,
        triton.cdiv(outs, chunk),
        chunk,
        max(16, triton.next_power_of_2(chunk)),
    )


def _is_wide_plain(epilogue: int, weight_rows: int) -> bool:
    """A plain projection as wide as an LM head: tiles of 64 outputs, with the paired pipeline depth."""
    return epilogue == PLAIN.value and weight_rows >= 16384


def _splits_heads(weight_rows: int, head_dim: int, device: torch.device) -> bool:
    """Whether a QKV projection with per-head norms runs as a plain projection and then ``qkv_heads_kernel``:
    where whole heads a sub-tile leave fewer than one program per two SMs. Gemma-3-12B's q/k/v (head_dim
    256) made 32 programs of a head each: 32.4 us a layer at batch 1 on the H200 for 63 MB
    (benchmarks/results/gpu_2026-11-30c, call 1's step timeline); Gemma 4's head_dim 512 layers make 16."""
    whole = _launch_grid(weight_rows // 2, QKV.value, weight_rows, device, head_dim // 2)
    return whole.programs < num_sms(device) // 2


def _stages(epilogue: int, weight_rows: int, block_n: int) -> int:
    """The weight stream's pipeline stages for this projection (the module's stage settings)."""
    if epilogue == PLAIN.value and not _is_wide_plain(epilogue, weight_rows):
        return plain_stages if block_n <= 32 else wide_sub_tile_stages
    if epilogue == SWIGLU.value:
        return swiglu_stages
    return qkv_stages if epilogue == QKV.value else paired_stages


def _fp8_stages(block_n: int, block_k: int, paired: bool) -> int:
    """The weight stream's stages for an fp8 weight: a K step holds a quarter of the weight bytes of a
    half-precision one (BK 128 of one byte against 256 of two), so as many stages as fit
    ``fp8_stage_bytes`` of shared memory (the x tile [16, BK] and one or two weight tiles [BN, BK] a
    stage), at most ``fp8_max_stages``."""
    stage = MAX_ROWS * block_k * 2 + (2 if paired else 1) * block_n * block_k
    return max(2, min(fp8_max_stages, fp8_stage_bytes // stage))


def _max_block(epilogue: int, weight_rows: int) -> int:
    """Outputs a sub-tile at most: 64 for a plain projection as wide as an LM head, ``plain_sub_tile`` for
    another plain one, ``swiglu_sub_tile`` for SwiGLU's pairs, 32 for q/k/v's."""
    if _is_wide_plain(epilogue, weight_rows):
        return 64
    if epilogue == SWIGLU.value:
        return swiglu_sub_tile
    return plain_sub_tile if epilogue == PLAIN.value else 32


def _launch_grid(
    n_out: int,
    epilogue: int,
    weight_rows: int,
    device: torch.device,
    whole_heads: int = 1,
    outs: int | None = None,
    max_block: int | None = None,
) -> _Grid:
    """The grid of a projection with ``n_out`` outputs: by default the outputs spread evenly over one
    program a streaming multiprocessor (``outs`` a program when given: benchmarks).

    A grid of power-of-two tiles leaves SMs idle (q/k/v: 96 programs of 32 pairs on 132 SMs) or ends
    in a partial wave (gate/up: 448 programs, 3.4 an SM). Here every program gets the same number of
    outputs, give or take one, in sub-tiles of at most ``_max_block``. Measured inside the captured 8B
    forward on the H100 (``bench/profile.py``): -0.06 ms a step at context 4096, within noise at 512; q/k/v
    itself was no faster on 128 programs than on 96."""
    max_block = max(max_block or _max_block(epilogue, weight_rows), whole_heads)
    if outs is None:
        outs = max(triton.cdiv(n_out, num_sms(device)), min(16, n_out))
    return _grid(n_out, outs, max_block, whole_heads)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    n_out: int,
    epilogue: int,
    half: int = 1,
    norm: tuple[torch.Tensor, float] | None = None,
    residual: torch.Tensor | None = None,
    next_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    qkv: tuple | None = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    pdl: bool | None = None,
    tiles: tuple[int | None, ...] | None = None,
    next_offset: float = 0.0,
    qk_offset: float = 0.0,
    v_norm: bool = False,
    act: str = "silu",
    softcap: float | None = None,
    relu2: bool = False,
    argmax: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """norm: (sq_parts [P, M], eps) when x is a normed stream; next_norm: (weight [N], normed out [M, N],
    sq_parts out [programs x sub-tiles, M]: ``_launch_grid``), its scale next_offset + weight; qk_norm:
    (q_norm weight, k_norm weight, eps) for QKV, scales qk_offset + weight, ``v_norm``: v normalised too;
    ``act``: SWIGLU's gate activation, "silu" or a GELU-tanh name; ``softcap``: PLAIN's cap; ``relu2``:
    PLAIN's outputs relu(.)^2; ``argmax``: (row_index [M] or None, map or None), PLAIN's ARGMAX into out [M]
    int64 (row r reads x's row row_index[r]).
    ``tiles`` (benchmarks): (outputs a program, BK, warps, stages, outputs a sub-tile at most), None for
    the default of an entry."""
    if v_norm and qk_norm is None:
        raise ValueError("v_norm needs qk_norm (whole heads a sub-tile)")
    if act not in FUSED_ACTIVATIONS:
        raise ValueError(f"no fused gate activation {act!r}")
    k = x.shape[1]
    x = x if x.stride(1) == 1 else x.contiguous()
    row_index, token_map = argmax if argmax is not None else (None, None)
    m = x.shape[0] if row_index is None else row_index.numel()
    if _quantized_product(weight):
        if epilogue == QKV.value or softcap is not None or tiles is not None or argmax:
            raise ValueError(
                "an fp8 weight's quantized product finishes plain and SwiGLU projections only (no q/k/v"
                " heads, soft-cap, argmax or benchmark tiles: norm_project_qkv takes an fp8 weight itself)"
            )
        return _quantized_launch(
            x, weight, out, epilogue, half, norm, residual, next_norm, next_offset, act, relu2
        )
    fp8 = weight if isinstance(weight, Fp8Weight) else None
    weight = fp8.weight if fp8 else weight
    outs, block_k, num_warps, num_stages, max_block = tiles or (None,) * 5
    grid = _launch_grid(
        n_out,
        epilogue,
        weight.shape[0],
        x.device,
        half if qk_norm is not None else 1,
        outs,
        max_block,
    )
    narrow = epilogue == PLAIN.value and grid.block_n == 16
    default_k = swiglu_block_k if epilogue == SWIGLU.value else 256
    block_k, num_warps = block_k or (narrow_block_k if narrow else default_k), num_warps or 4
    num_stages = num_stages or (
        narrow_stages if narrow else _stages(epilogue, weight.shape[0], grid.block_n)
    )
    if tiles is None and qk_norm is not None and half > 32:
        # one head a sub-tile in the shared memory of 32 pairs: of head_dim 128, and of 256 (two 128-row tiles)
        block_k, num_stages = (128, 4) if half <= 64 else (64, 3)
    if tiles is None and x.element_size() == 4:
        block_k //= 2  # float32 (tests): the same shared memory as half precision
    if fp8 is not None:
        fp8_step = _fp8_block_k(fp8.block[1])
        if fp8_step is None or (tiles is not None and block_k and fp8_step % block_k):
            raise ValueError(
                f"no K step of an fp8 weight in scale blocks of {fp8.block[1]} columns"
            )
        if tiles is None or not tiles[1]:
            block_k = min(block_k, fp8_step)
        if tiles is None or not tiles[3]:
            num_stages = _fp8_stages(grid.block_n, block_k, epilogue != PLAIN.value)
    sq_in, eps = norm if norm is not None else (x, 0.0)
    res = residual if residual is not None else x
    w_next, normed_out, sq_out = next_norm if next_norm is not None else (x, x, x)
    if next_norm is not None and sq_out.shape[0] != grid.programs * grid.subs:
        raise ValueError(
            f"sq_parts out has {sq_out.shape[0]} rows for {grid.programs * grid.subs} sub-tiles"
        )
    pos, cos, sin, k_cache, v_cache, slots, q_size, kv_size = (
        qkv if qkv is not None else (x,) * 6 + (0, 0)
    )
    q_norm, k_norm, qk_eps = qk_norm if qk_norm is not None else (x, x, 0.0)
    use_pdl = pdl_available(x.device) if pdl is None else pdl
    row_tiles = max(1, triton.cdiv(m, MAX_ROWS))  # (module docstring: Rows)
    best_val = best_idx = arrivals = x  # (ARGMAX's: not read otherwise)
    if argmax is not None:
        best_val = torch.empty(
            row_tiles * grid.programs * MAX_ROWS, dtype=torch.float32, device=x.device
        )
        best_idx = torch.empty(best_val.shape, dtype=torch.int32, device=x.device)
        arrivals = zeroed_scratch(  # [row tiles] one a row tile
            "layers/fused_projection.py: the head argmax's arrival counters",
            x.device,
            row_tiles,
            torch.int32,
        )
    fused_rows_kernel[(row_tiles, grid.programs)](
        x,
        weight,
        out,
        res,
        sq_in,
        w_next,
        normed_out,
        sq_out,
        pos,
        cos,
        sin,
        k_cache,
        v_cache,
        slots,
        q_norm,
        k_norm,
        fp8.scale if fp8 else x,
        x if row_index is None else row_index,
        best_val,
        best_idx,
        arrivals,
        x if token_map is None else token_map,
        m,
        sq_in.shape[1] if norm is not None else m,
        n_out,
        k,
        x.stride(0),
        weight.stride(0),
        fp8.scale.stride(0) if fp8 else 0,
        fp8.scale.stride(1) if fp8 else 0,
        out.stride(0),
        res.stride(0),
        sq_in.shape[0],
        eps,
        q_size,
        kv_size,
        qk_eps,
        grid.subs,
        next_offset,
        qk_offset,
        1.0 if softcap is None else softcap,
        OUTS=grid.outs,
        CHUNK=grid.chunk,
        SCALE_ROWS=norm is not None,
        RESIDUAL=residual is not None,
        NEXT_NORM=next_norm is not None,
        EPILOGUE=epilogue,
        QK_NORM=qk_norm is not None,
        V_NORM=v_norm,
        ACT=ACT_GELU_TANH if act in GELU_TANH else ACT_SILU,
        SOFTCAP=softcap is not None,
        RELU2=relu2,
        HALF=half,
        BM=MAX_ROWS,
        BN=grid.block_n,
        BK=block_k,
        BLOCK_P=triton.next_power_of_2(sq_in.shape[0]) if norm is not None else 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PDL=use_pdl,
        PREFETCH_K=max(64, min(_PREFETCH_K, triton.next_power_of_2(k))),
        FP8=fp8 is not None,
        SCALE_BN=fp8.block[0] if fp8 else 1,
        SCALE_BK=fp8.block[1] if fp8 else 1,
        GATHER=row_index is not None,
        ARGMAX=argmax is not None,
        MAP=token_map is not None,
        BLOCK_PROGS=triton.next_power_of_2(grid.programs) if argmax is not None else 1,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_launch_options(use_pdl),
    )
    return out


def project_rows(
    x: torch.Tensor, weight: torch.Tensor, pdl: bool | None = None, relu2: bool = False
) -> torch.Tensor:
    """x [M, K] @ weight.T -> [M, N] (relu(.)^2 of it with ``relu2``): a projection with no neighbour to
    fold in (layers/linear.py's few-row path), its outputs spread evenly over one program an SM
    (``_launch_grid``)."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, weight, out, weight.shape[0], PLAIN.value, pdl=pdl, relu2=relu2)


def project_add(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, pdl: bool | None = None
) -> torch.Tensor:
    """x [M, K], residual [M, N] -> residual + x @ weight.T [M, N] (a new tensor)."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, weight, out, weight.shape[0], PLAIN.value, residual=residual, pdl=pdl)


def project_add_normed(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor | None,
    next_norm_weight: torch.Tensor,
    pdl: bool | None = None,
    next_offset: float = 0.0,
) -> NormedRows:
    """``project_add`` (x @ weight.T alone when ``residual`` is None), its result made ready for the
    RMSNorm with scale next_offset + ``next_norm_weight`` [N]."""
    m, n = x.shape[0], weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    normed = torch.empty(m, n, dtype=x.dtype, device=x.device)
    sq = torch.empty(_next_norm_parts(x, weight), m, dtype=torch.float32, device=x.device)
    _launch(
        x,
        weight,
        out,
        n,
        PLAIN.value,
        residual=residual,
        next_norm=(next_norm_weight, normed, sq),
        pdl=pdl,
        next_offset=next_offset,
    )
    return NormedRows(out, normed, sq)


def project_normed(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor,
    offset: float = 0.0,
    pdl: bool | None = None,
) -> NormedRows:
    """x [M, K] @ weight.T, made ready for a sandwich norm with scale offset + norm_weight (``add_normed``)."""
    return project_add_normed(x, weight, None, norm_weight, pdl, offset)


def norm_project(
    rows: NormedRows,
    eps: float,
    weight: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    pdl: bool | None = None,
    tiles: tuple[int | None, ...] | None = None,
    out: torch.Tensor | None = None,
    softcap: float | None = None,
    relu2: bool = False,
) -> torch.Tensor:
    """RMSNorm(rows.stream) @ weight.T [M, N] in ``out_dtype`` (the stream's dtype by default), into
    ``out`` (contiguous rows) when given; soft-capped (cap * tanh(logit / cap)) with ``softcap``; relu(.)^2
    with ``relu2`` (an ungated MLP's first half)."""
    x = rows.normed
    shape, dtype = (x.shape[0], weight.shape[0]), out_dtype or x.dtype
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=x.device)
    elif tuple(out.shape) != shape or out.dtype != dtype or out.stride(1) != 1:
        raise ValueError(
            f"norm_project writes {shape} {dtype}, got out {tuple(out.shape)} {out.dtype} "
            f"with strides {out.stride()}"
        )
    return _launch(
        x,
        weight,
        out,
        weight.shape[0],
        PLAIN.value,
        norm=(rows.sq_parts, eps),
        pdl=pdl,
        tiles=tiles,
        softcap=softcap,
        relu2=relu2,
    )


def head_argmax(
    x: torch.Tensor | NormedRows,
    weight: torch.Tensor,
    eps: float = 0.0,
    rows: torch.Tensor | None = None,
    token_map: torch.Tensor | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """A greedy draft's tokens straight from its head, [R] int64: for each row, the first column of the
    largest of x @ weight.T (RMSNorm(x.stream) @ weight.T for ``NormedRows``, eps its norm's), of x's rows
    ``rows`` [R] (all when None), looked up in ``token_map`` [columns] when given (an EAGLE3 draft's
    vocabulary -> the target's). No logits are written: the projection's programs keep their best columns
    and the last to finish picks among them (``_argmax_across_programs``), so a head, its float copy and an
    argmax's two launches are one. Its products are the projection's: the argmax of the logits
    ``norm_project`` writes, except that a NaN is never chosen (drafts only: a draft token only has to be
    some token)."""
    normed = isinstance(x, NormedRows)
    stream = x.normed if normed else x
    m = stream.shape[0] if rows is None else rows.numel()
    out = torch.empty(m, dtype=torch.int64, device=stream.device)
    if m == 0:
        return out
    return _launch(
        stream,
        weight,
        out,
        weight.shape[0],
        PLAIN.value,
        norm=(x.sq_parts, eps) if normed else None,
        pdl=pdl,
        argmax=(rows, token_map),
    )


def project_swiglu(
    x: torch.Tensor, gate_up: torch.Tensor, act: str = "silu", pdl: bool | None = None
) -> torch.Tensor:
    """gate_up [2 * I, K] (gate rows, then up rows) -> act(g) * u [M, I], where [g | u] = x @ gate_up.T: a
    gated MLP's first half with no norm folded in (layers/decoder.py ``GatedMLP``'s few-row path)."""
    inter = gate_up.shape[0] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    return _launch(x, gate_up, out, inter, SWIGLU.value, half=inter, pdl=pdl, act=act)


def norm_project_swiglu(
    rows: NormedRows | torch.Tensor,
    eps: float,
    gate_up: torch.Tensor,
    pdl: bool | None = None,
    tiles: tuple[int | None, ...] | None = None,
    act: str = "silu",
) -> torch.Tensor:
    """gate_up [2 * I, K] (gate rows, then up rows) -> act(g) * u [M, I], where
    [g | u] = RMSNorm(rows.stream) @ gate_up.T (rows @ gate_up.T for a tensor ``rows`` [M, K] that is already
    normalised: ``eps`` unused); ``act`` SiLU or GELU-tanh (``GELU_TANH``)."""
    x = rows.normed if isinstance(rows, NormedRows) else rows
    norm = (rows.sq_parts, eps) if isinstance(rows, NormedRows) else None
    inter = gate_up.shape[0] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    return _launch(
        x,
        gate_up,
        out,
        inter,
        SWIGLU.value,
        half=inter,
        norm=norm,
        pdl=pdl,
        tiles=tiles,
        act=act,
    )


def norm_project_qkv(
    rows: NormedRows | torch.Tensor,
    eps: float,
    qkv: torch.Tensor,
    head_dim: int,
    q_size: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    pdl: bool | None = None,
    tiles: tuple[int | None, ...] | None = None,
    qk_offset: float = 0.0,
    v_norm: bool = False,
    split_heads: bool | None = None,
    v_from_k: bool = False,
) -> torch.Tensor:
    """qkv [q_size + 2 * kv_size, K] (q rows, k rows, v rows; a tensor, an ``Fp8Weight`` or an ``Int4Weight``);
    positions, slot_mapping [M]; cos, sin [max_positions, rotary_dim // 2] float32 (rotary_dim <= head_dim);
    caches [num_blocks, block_size, kv_heads, head_dim] (contiguous). Computes [q | k | v] = RMSNorm(rows.stream)
    @ qkv.T (rows @ qkv.T for a tensor ``rows`` [M, K] that is already normalised: ``eps`` unused),
    normalises each q and k head when ``qk_norm`` = (q_norm weight, k_norm weight [head_dim], eps) is given
    (head_dim a power of two), rotates the first rotary_dim dimensions of q and k (neox), writes k and v to
    the caches at the slots, and returns q [M, q_size] (q_size 0 and qkv = the k and v rows: writes k and v
    only). The q/k norms' scales are qk_offset + weight (Gemma 3: 1.0); ``v_norm``: each v head is
    normalised too, without a weight (Gemma 4). ``v_from_k``: qkv is [q_size + kv_size, K], q and k rows
    only, and v is k's projection before k's norm and RoPE (Gemma 4's attention_k_eq_v layers).
    Two kernels, the projection and then ``qkv_heads_kernel`` per head, where ``split_heads`` asks for it
    (tests; by default ``_splits_heads``), for ``v_from_k``, for partial rotary, and for an fp8 or INT4 weight
    outside batch-invariant mode: the quantized product (``Fp8Weight.project``: split K at few rows, faster than
    the fused kernels' fp8 stream, ``fused_rows_apply``), the input norm's factor then applied by the heads
    kernel."""
    x = rows.normed if isinstance(rows, NormedRows) else rows
    norm = (rows.sq_parts, eps) if isinstance(rows, NormedRows) else None
    kv_size = (qkv.shape[0] - q_size) // (1 if v_from_k else 2)
    heads = _QkvHeads(
        head_dim, q_size, kv_size, positions, cos, sin, k_cache, v_cache, slot_mapping, v_from_k
    )
    if split_heads is None:
        split_heads = qk_norm is not None and _splits_heads(qkv.shape[0], head_dim, x.device)
    if split_heads or v_from_k or heads.partial or _quantized_product(qkv):
        return _project_then_heads(x, norm, qkv, heads, qk_norm, qk_offset, v_norm, pdl, tiles)[0]
    q = torch.empty(x.shape[0], q_size, dtype=x.dtype, device=x.device)
    return _launch(
        x,
        qkv,
        q,
        qkv.shape[0] // 2,
        QKV.value,
        half=head_dim // 2,
        norm=norm,
        qkv=heads.kernel_args(),
        qk_norm=qk_norm,
        pdl=pdl,
        tiles=tiles,
        qk_offset=qk_offset,
        v_norm=v_norm,
    )


def norm_project_qkv_gate(
    rows: NormedRows | torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    head_dim: int,
    q_size: int,
    gate_size: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    qk_offset: float = 0.0,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm_project_qkv`` over a half-precision weight [q | k | v | gate] whose last ``gate_size`` rows
    are an attention output gate's (Step-3.5's head-wise gate), or with ``interleaved`` [q head 0 | gate
    head 0 | q head 1 | ... | k | v] (Qwen3-Next's q_proj: a gate as wide as q, ``gate_size`` = q_size): the
    gate's rows ride in the plain projection's launch (always the two-kernel path), so the gate costs no
    launch of its own. Returns q [M, q_size] and the gate's products (a view; float32, or x's dtype from an fp8
    weight's quantized product): [M, gate_size], or interleaved [M, heads, head_dim]."""
    if interleaved and gate_size != q_size:
        raise ValueError(f"an interleaved gate is as wide as q ({q_size}), not {gate_size}")
    x = rows.normed if isinstance(rows, NormedRows) else rows
    norm = (rows.sq_parts, eps) if isinstance(rows, NormedRows) else None
    kv_size = (weight.shape[0] - gate_size - q_size) // 2
    heads = _QkvHeads(
        head_dim, q_size, kv_size, positions, cos, sin, k_cache, v_cache, slot_mapping
    )
    q, raw = _project_then_heads(
        x, norm, weight, heads, qk_norm, qk_offset, False, None, None, q_gated=interleaved
    )
    if interleaved:
        return q, raw[:, : 2 * q_size].unflatten(1, (-1, 2, head_dim))[:, :, 1]
    return q, raw[:, q_size + 2 * kv_size :]


@dataclass(frozen=True)
class _QkvHeads:
    """Where ``norm_project_qkv``'s per-head work puts q, k and v: [q | k | v] widths, RoPE's tables, the
    caches and the tokens' slots."""

    head_dim: int
    q_size: int
    kv_size: int
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    v_from_k: bool = False  # no v rows: v is k's projection (``norm_project_qkv``)

    def __post_init__(self) -> None:
        if not (self.k_cache.is_contiguous() and self.v_cache.is_contiguous()):
            raise ValueError("norm_project_qkv writes into contiguous KV caches only")

    @property
    def partial(self) -> bool:
        """Whether RoPE turns only part of each head."""
        return 2 * self.cos.shape[-1] != self.head_dim

    def kernel_args(self) -> tuple:
        """The kernels' arguments from positions to the widths."""
        tables = (self.positions, self.cos, self.sin, self.k_cache, self.v_cache, self.slot_mapping)
        return (*tables, self.q_size, self.kv_size)


def _project_then_heads(
    x: torch.Tensor,
    norm: tuple[torch.Tensor, float] | None,
    weight: torch.Tensor,
    heads: _QkvHeads,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None,
    qk_offset: float,
    v_norm: bool,
    pdl: bool | None,
    tiles: tuple[int | None, ...] | None,
    q_gated: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm_project_qkv``'s two-kernel path: the projection of every row of ``weight`` ([q | k | v], and
    any rows after them; with ``q_gated`` each q head's rows followed by its gate head's) into ``raw`` [M,
    weight rows], then ``qkv_heads_kernel`` over q, k and v's heads. Returns (q, raw). An fp8 weight's
    quantized product leaves the input norm's factor to the heads kernel, unless rows beyond q/k/v's (a gate)
    are returned raw: then its store applies it (``RowEpilogue.row_norm``), to every row."""
    q = torch.empty(x.shape[0], heads.q_size, dtype=x.dtype, device=x.device)
    quantized = _quantized_product(weight)
    gated = q_gated or weight.shape[0] > heads.q_size + 2 * heads.kv_size
    if quantized and gated and norm is not None:  # the norm in the product's store, then the heads
        raw = _finished_product(x, weight, RowEpilogue(norm))  # [M, weight rows] in x's dtype
        norm = None
    elif quantized:  # the quantized product (layers/quant/quant_matmul_kernel.py), then the heads
        raw = weight.project(x)  # [M, weight rows] in x's dtype
    else:
        raw = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
        _launch(x, weight, raw, weight.shape[0], PLAIN.value, norm=norm, pdl=pdl, tiles=tiles)
    row_norm = quantized and norm is not None  # (the plain kernel applied the input norm itself)
    sq_parts = norm[0] if row_norm else raw
    q_norm, k_norm, qk_eps = qk_norm or (raw, raw, 0.0)
    use_pdl = pdl_available(x.device) if pdl is None else pdl
    half, qkv_rows = heads.head_dim // 2, heads.q_size + 2 * heads.kv_size
    qkv_heads_kernel[(max(1, triton.cdiv(x.shape[0], MAX_ROWS)), qkv_rows // heads.head_dim)](
        raw,
        q,
        *heads.kernel_args()[:6],
        q_norm,
        k_norm,
        sq_parts,
        x.shape[0],
        x.shape[1],
        sq_parts.shape[0],
        norm[1] if row_norm else 0.0,
        raw.stride(0),
        q.stride(0),
        heads.q_size,
        heads.kv_size,
        qk_eps,
        qk_offset,
        HALF=half,
        ROT_HALF=heads.cos.shape[-1],
        BM=MAX_ROWS,
        ROW_NORM=row_norm,
        QK_NORM=qk_norm is not None,
        V_NORM=v_norm,
        BLOCK_P=triton.next_power_of_2(sq_parts.shape[0]) if row_norm else 1,
        Q_GATED=q_gated,
        V_FROM_K=heads.v_from_k,
        PDL=use_pdl,
        num_warps=4 if half <= 128 else 8,
        **pdl_launch_options(use_pdl),
    )
    return q, raw
