"""The Triton kernels of layers/sandwich_norms.py (its docstring says what they compute) and their launchers:
one program per row, float32 math with the torch path's roundings, no floating-point contraction; grids
from shapes only (capturable in a CUDA graph). With TRITON_INTERPRET=1 they also run on CPU tensors."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.layers.fused_kernels import row_warps
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.normed_rows import NormedRows


@triton.jit
def _normed(x, w_ptr, cols, mask, dim, eps, offset):
    """x [BLOCK] float32 -> its RMSNorm times (offset + w) in float32 (``rms_norm_f32``)."""
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    return x * rstd * (offset + tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32))


@triton.jit
def _after_attention_kernel(
    h_ptr,  # [n, dim]
    attn_ptr,  # [n, dim]
    w_post_ptr,
    w_pre_ptr,
    w_pre2_ptr,
    h_out_ptr,  # [n, dim], written: h + post(attn)
    pre_ptr,  # [n, dim], written: pre(h_out)
    pre2_ptr,  # [n, dim], written with TWO: pre2(h_out)
    dim,
    stride_h,
    stride_attn,
    eps_post,
    eps_pre,
    eps_pre2,
    offset,
    TWO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    dtype = h_out_ptr.dtype.element_ty
    attn = tl.load(attn_ptr + row * stride_attn + cols, mask=mask, other=0.0).to(tl.float32)
    post = _normed(attn, w_post_ptr, cols, mask, dim, eps_post, offset).to(dtype)
    h = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0)
    s = (h.to(tl.float32) + post.to(tl.float32)).to(dtype)
    tl.store(h_out_ptr + row * dim + cols, s, mask=mask)
    sf = s.to(tl.float32)
    pre = _normed(sf, w_pre_ptr, cols, mask, dim, eps_pre, offset)
    tl.store(pre_ptr + row * dim + cols, pre.to(dtype), mask=mask)
    if TWO:
        pre2 = _normed(sf, w_pre2_ptr, cols, mask, dim, eps_pre2, offset)
        tl.store(pre2_ptr + row * dim + cols, pre2.to(dtype), mask=mask)


@triton.jit
def _after_mlp_kernel(
    h_ptr,  # [n, dim]
    mlp_ptr,  # [n, dim]
    routed_ptr,  # [n, dim] (read with MOE)
    w1_ptr,
    w2_ptr,
    w_post_ptr,
    scale_ptr,  # [1] (read with SCALE)
    w_next_ptr,  # [dim] (read with NEXT): the next norm's weight
    out_ptr,  # [n, dim], written
    normed_ptr,  # [n, dim], written with NEXT: out * (next_offset + w_next)
    sq_ptr,  # [1, n] float32, written with NEXT: sum(out^2)
    dim,
    stride_h,
    stride_mlp,
    stride_routed,
    eps1,
    eps2,
    eps_post,
    offset,
    next_offset,
    MOE: tl.constexpr,
    SCALE: tl.constexpr,
    NEXT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """NEXT: the output also made ready for the next layer's input norm (layers/normed_rows.py
    ``NormedRows``, as its ``normed_rows`` writes them)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    dtype = out_ptr.dtype.element_ty
    m = tl.load(mlp_ptr + row * stride_mlp + cols, mask=mask, other=0.0).to(tl.float32)
    if MOE:
        r = tl.load(routed_ptr + row * stride_routed + cols, mask=mask, other=0.0).to(tl.float32)
        n1 = _normed(m, w1_ptr, cols, mask, dim, eps1, offset).to(dtype).to(tl.float32)
        n2 = _normed(r, w2_ptr, cols, mask, dim, eps2, offset).to(dtype).to(tl.float32)
        m = (n1 + n2).to(dtype).to(tl.float32)
    post = _normed(m, w_post_ptr, cols, mask, dim, eps_post, offset).to(dtype).to(tl.float32)
    h = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    s = (h + post).to(dtype)
    if SCALE:
        s = (s.to(tl.float32) * tl.load(scale_ptr).to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * dim + cols, s, mask=mask)
    if NEXT:
        sf = s.to(tl.float32)  # (the stream as stored)
        w = tl.load(w_next_ptr + cols, mask=mask, other=0.0).to(tl.float32) + next_offset
        tl.store(normed_ptr + row * dim + cols, (sf * w).to(dtype), mask=mask)
        tl.store(sq_ptr + row, tl.sum(sf * sf, axis=0))


def _same_offset(*norms: Float32RMSNorm) -> float:
    offsets = {n.offset for n in norms}
    if len(offsets) != 1 or any(n.weight is None for n in norms):
        raise ValueError("the sandwich kernels take weighted Float32RMSNorms of one offset")
    return offsets.pop()


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def after_attention_triton(
    h: torch.Tensor,
    attn: torch.Tensor,
    post: Float32RMSNorm,
    pre: Float32RMSNorm,
    pre2: Float32RMSNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """layers/sandwich_norms.py ``after_attention`` in one launch."""
    norms = (post, pre) if pre2 is None else (post, pre, pre2)
    offset = _same_offset(*norms)
    h, attn = _rows(h), _rows(attn)
    n, dim = h.shape
    h_out, pre_out = torch.empty_like(h), torch.empty_like(h)
    pre2_out = None if pre2 is None else torch.empty_like(h)
    block = triton.next_power_of_2(dim)
    _after_attention_kernel[(n,)](
        h, attn, post.weight, pre.weight, (pre2 or pre).weight,
        h_out, pre_out, h_out if pre2_out is None else pre2_out,
        dim, h.stride(0), attn.stride(0), post.eps, pre.eps, (pre2 or pre).eps, offset,
        TWO=pre2 is not None, BLOCK=block, num_warps=row_warps(block),
        enable_fp_fusion=False,
    )  # fmt: skip
    return h_out, pre_out, pre2_out


def after_mlp_triton(
    h: torch.Tensor,
    mlp: torch.Tensor,
    post: Float32RMSNorm,
    scale: torch.Tensor | None = None,
    routed: torch.Tensor | None = None,
    post1: Float32RMSNorm | None = None,
    post2: Float32RMSNorm | None = None,
    next_norm: Float32RMSNorm | None = None,
) -> torch.Tensor | NormedRows:
    """layers/sandwich_norms.py ``after_mlp`` in one launch."""
    moe = routed is not None
    offset = _same_offset(post, post1, post2) if moe else _same_offset(post)
    h, mlp = _rows(h), _rows(mlp)
    routed = _rows(routed) if moe else mlp
    n, dim = h.shape
    out = torch.empty_like(h)
    normed, sq = out, out
    if next_norm is not None:
        normed, sq = torch.empty_like(h), torch.empty(1, n, dtype=torch.float32, device=h.device)
    block = triton.next_power_of_2(dim)
    w1, w2 = (post1.weight, post2.weight) if moe else (post.weight, post.weight)
    eps1, eps2 = (post1.eps, post2.eps) if moe else (0.0, 0.0)
    w_next, next_offset = (
        (post.weight, 0.0) if next_norm is None else (next_norm.weight, next_norm.offset)
    )
    _after_mlp_kernel[(n,)](
        h, mlp, routed, w1, w2, post.weight, h if scale is None else scale, w_next, out, normed, sq,
        dim, h.stride(0), mlp.stride(0), routed.stride(0), eps1, eps2, post.eps, offset, next_offset,
        MOE=moe, SCALE=scale is not None, NEXT=next_norm is not None, BLOCK=block,
        num_warps=row_warps(block), enable_fp_fusion=False,
    )  # fmt: skip
    return out if next_norm is None else NormedRows(out, normed, sq)
