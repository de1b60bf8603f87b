"""FP8 linear products on the GPU: y [M, N] = x [M, K] @ W.T with W kept in fp8 (quant/dequantize.py has the
math of both formats).

- Block FP8 (DeepSeek-V3/R1, Kimi-K2, Qwen3-FP8, Step-3.5-Flash-FP8): ``weight`` float8_e4m3fn [N, K] and
  ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] (fp32, bf16 in some Qwen files; ue8m0 checkpoints only
  round these to powers of two). In batch-invariant mode the fused few-row projections' plain kernel serves
  every row count over an ``Fp8Weight`` (layers/fused_projection.py ``fused_rows_apply``: a row's bits do
  not depend on M; elsewhere it is the slower of the two at few rows). Otherwise, up to
  ``SCALED_MM_FROM_ROWS`` rows the weight-streaming Triton kernel (quant_matmul_kernel.py) serves every row
  count; from there on, where torch's block-scaled GEMM takes the
  shape (N and K multiples of 128), activations are quantized per token in groups of 128 (DeepSeek-V3
  inference/kernel.py ``act_quant``: scale = amax / 448, x / scale in fp8) and torch multiplies on the FP8
  tensor cores; other shapes stay on the Triton kernel.
- Per-tensor FP8 (NVIDIA ModelOpt): ``weight`` fp8 [N, K] and one ``weight_scale``; the fused projections in
  batch-invariant mode as block FP8's, the Triton kernel otherwise (the activation's ``input_scale`` only
  matters to a GEMM that quantizes activations).

torch's block-scaled layouts (pytorch aten/src/ATen/native/cuda/ScaledBlas.cpp,
``_scaled_block1x128_block128x128`` and ``_check_deepseek_scale_stride``): A [M, K] fp8 row-major with
fp32 scales [M, K/128] of strides (1, M) (the group index outer); B [K, N] column-major, i.e. the weight
[N, K] transposed, with fp32 scales [K/128, N/128] that are the checkpoint's [N/128, K/128] row-major tensor
transposed; K/128 and N/128 are floor divisions there, so K and N must be multiples of 128. The issue's
measurement: M padded to a multiple of 4 (the scales' 16-byte rows), and at M <= 16 it reads weights at only
1.8-2.5 TB/s on an H200, hence the Triton kernel for few rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from outpace.layers.fused_projection import fused_rows_apply, project_rows
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.quant_matmul_kernel import quant_matmul

FP8_DTYPE = torch.float8_e4m3fn
# rows from which block FP8 goes through torch's GEMM (the lead tunes it): on an H200 (torch 2.11, CUDA graph,
# L2 flushed) at 64 rows it took 61 us for DeepSeek's o (7168 x 16384) against the Triton kernel's 113, 99 us
# for the dense gate_up against 206; at 32 rows the two were even on the expert shapes, and up to 16 rows
# the Triton kernel won (q_a at 8 rows: 13 us against 20)
SCALED_MM_FROM_ROWS = 33
ACT_GROUP = 128  # activation columns sharing one scale (1 x 128)
_FP8_MAX = tl.constexpr(448.0)
_EPS = tl.constexpr(
    1e-10
)  # the smallest absmax of a group (a zero group gets a tiny scale, not 0 / 0)
_HAS_SCALED_MM = hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")


@triton.jit
def _act_quant_kernel(
    x_ptr,  # [M, K]
    q_ptr,  # [M_pad, K] fp8, written
    s_ptr,  # [K / 128, M_pad] float32, written (torch's [M_pad, K / 128] of strides (1, M_pad))
    M,
    M_pad,
    K,
    stride_xm,
    GROUP: tl.constexpr,
):
    """Program (row, group): scale = absmax / 448 of the row's GROUP columns, q = x / scale in fp8; the
    padding rows get zeros."""
    row, group = tl.program_id(0), tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=(cols < K) & (row < M), other=0.0).to(
        tl.float32
    )
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), _EPS) / _FP8_MAX
    tl.store(q_ptr + row * K + cols, (x / scale).to(q_ptr.dtype.element_ty), mask=cols < K)
    tl.store(s_ptr + group * M_pad + row, scale)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M_pad, K], float32 scales [M_pad, K/128] of strides (1, M_pad)), M_pad = M
    rounded up to a multiple of 4, the padding rows zero: torch's BlockWise1x128 operand."""
    m, k = x.shape
    m_pad = -(-m // 4) * 4
    q = torch.empty(m_pad, k, dtype=FP8_DTYPE, device=x.device)
    scales = torch.empty(math.ceil(k / ACT_GROUP), m_pad, dtype=torch.float32, device=x.device)
    _act_quant_kernel[(m_pad, scales.shape[0])](
        x, q, scales, m, m_pad, k, x.stride(0), GROUP=ACT_GROUP
    )
    return q, scales.t()


def _scaled_mm_applies(x: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> bool:
    return (
        _HAS_SCALED_MM
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.shape[0] >= SCALED_MM_FROM_ROWS
        and tuple(block) == (128, 128)
        and n % 128 == 0
        and k % 128 == 0
    )


def _padded_weight_scales(scale_inv: torch.Tensor) -> torch.Tensor:
    """scale_inv [N/128, K/128] -> float32 [N/128, L4], L4 = K/128 rounded up to a multiple of 4 (zeros
    after): torch's BlockWise128x128 operand takes the K blocks padded so (its scaled-mm tests pad them the
    same way; on the H200 an unpadded [22, 16] operand was refused as not 24 x 16)."""
    blocks = scale_inv.shape[1]
    return F.pad(scale_inv.float(), (0, -blocks % 4))


def _check_fp8(weight: torch.Tensor, x: torch.Tensor) -> None:
    if weight.dtype != FP8_DTYPE or weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError(
            f"an fp8 weight is a float8_e4m3fn [N, K] matrix with contiguous rows, got {weight.dtype} "
            f"of shape {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {weight.shape[1]}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or float32, got {x.dtype}")


def fp8_block_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = (128, 128),
) -> torch.Tensor:
    """x [..., K] @ (weight [N, K] fp8 times scale_inv [ceil(N/bn), ceil(K/bk)] per block).T -> [..., N] in
    x's dtype (module docstring). ``block`` (bn, bk): bk a power of two >= 64."""
    _check_fp8(weight, x)
    n, k = weight.shape
    block_n, block_k = block
    expected = (math.ceil(n / block_n), math.ceil(k / block_k))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(
            f"weight_scale_inv of shape {tuple(scale_inv.shape)} does not cover a weight of [{n}, {k}] "
            f"in {block_n}x{block_k} blocks (expected {list(expected)})"
        )
    if block_k < 64 or block_k & (block_k - 1):
        raise ValueError(
            f"the fp8 kernels take blocks of a power of two >= 64 columns, not {block_k}"
        )
    rows = x.reshape(-1, k)
    fused = Fp8Weight(weight, scale_inv, tuple(block))
    if fused_rows_apply(rows, fused):
        out = project_rows(rows, fused)
    elif _scaled_mm_applies(rows, n, k, block):
        q, q_scales = quantize_activations(rows)
        out = F.scaled_mm(
            q,
            weight.t(),
            q_scales,
            F.ScalingType.BlockWise1x128,
            _padded_weight_scales(scale_inv).t(),
            F.ScalingType.BlockWise128x128,
            output_dtype=x.dtype,
        )[: rows.shape[0]]
    else:
        out = quant_matmul(rows, weight, scale_inv, "fp8_block", block)
    return out.reshape(*x.shape[:-1], n)


def fp8_tensor_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ (weight [N, K] fp8 times the scalar ``scale``).T -> [..., N] in x's dtype."""
    _check_fp8(weight, x)
    if scale.numel() != 1:
        raise ValueError(
            f"a per-tensor weight_scale has one element, got shape {tuple(scale.shape)}"
        )
    rows = x.reshape(-1, weight.shape[1])
    fused = Fp8Weight.per_tensor(weight, scale)
    if fused_rows_apply(rows, fused):
        out = project_rows(rows, fused)
    else:
        out = quant_matmul(rows, weight, scale, "fp8_tensor", (1, 1))
    return out.reshape(*x.shape[:-1], weight.shape[0])
