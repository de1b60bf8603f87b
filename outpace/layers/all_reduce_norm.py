"""A row-parallel block's all-reduce, the residual add after it and the next RMSNorm in one kernel.

Under tensor parallelism a block that ends in a row-parallel projection (attention's o_proj, a MoE's down
projections) leaves partial sums on every rank; the engine all-reduces them, adds the residual stream and
normalises it for the next block: two launches, the all-reduce and the norm (layers/fused_kernels.py's
``_rms_norm_kernel`` with its residual). Here one program a token row sends its row to the peers and sums
theirs as the push all-reduce does (distributed/push_all_reduce_kernel.py ``pushed_sum``), then adds the
residual and normalises the row (``rms_normed``). vLLM and SGLang fuse the same three steps (flashinfer's
all-reduce fusion, "allreduce + residual + RMSNorm").

The bits are those of the two launches: the sum rounded to the partials' dtype (what the all-reduce leaves),
then the residual add and the norm exactly as ``_rms_norm_kernel`` computes them. ``all_reduce_add_rms_norm``
takes what the symmetric path takes (distributed/symmetric_all_reduce.py) with a residual of the partials'
dtype and shape and an ``RMSNorm`` or ``Float32RMSNorm``; else the caller runs the two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.distributed.group import RankGroup
from outpace.distributed.push_all_reduce_kernel import end_call, push_arguments, pushed_sum
from outpace.layers.fused_kernels import rms_normed, row_warps
from outpace.layers.norm import Float32RMSNorm, RMSNorm

_MAX_BLOCK = 16384  # the widest row a program takes whole


@triton.jit
def _all_reduce_add_norm_kernel(
    x_ptr,  # [rows, dim] this rank's partial sums
    res_ptr,  # [rows, dim] the residual stream
    w_ptr,  # [dim] the norm's weight
    out_ptr,  # [rows, dim] the norm of the new stream, written
    res_out_ptr,  # [rows, dim] the new stream, written
    buffers_ptr,  # the push all-reduce's (``pushed_sum``)
    epoch_ptr,
    arrivals_ptr,
    dim,
    slot,
    eps,
    offset,
    BITS_TY: tl.constexpr,
    EMPTY: tl.constexpr,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    WEIGHT_IN_FLOAT32: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row r: s = round(sum over ranks of x[r]) + res[r] (rounded, stored to res_out), out[r] = RMSNorm(s)
    (layers/fused_kernels.py ``_rms_norm_kernel``'s arithmetic)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    offs = tl.program_id(0) * dim + cols  # [BLOCK] the row's elements
    total = pushed_sum(
        x_ptr, offs, mask, buffers_ptr, epoch_ptr, slot, BITS_TY, EMPTY, RANK, WORLD, BLOCK
    )
    reduced = total.to(x_ptr.dtype.element_ty)  # what the all-reduce leaves
    res = tl.load(res_ptr + offs, mask=mask, other=0.0)
    s = (reduced.to(tl.float32) + res.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
    tl.store(res_out_ptr + offs, s, mask=mask)
    normed = rms_normed(s, w_ptr, cols, mask, dim, eps, offset, HAS_WEIGHT, WEIGHT_IN_FLOAT32)
    tl.store(out_ptr + offs, normed.to(out_ptr.dtype.element_ty), mask=mask)
    end_call(epoch_ptr, arrivals_ptr)


def all_reduce_add_rms_norm(
    partial: torch.Tensor, stream: torch.Tensor, norm: torch.nn.Module, group: RankGroup
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """partial [n, dim] summed over ``group``, + stream [n, dim], and ``norm`` of it: (normed, new stream), as
    ``norm(all_reduce(partial), stream)`` gives them, in one launch; None where the kernel does not serve the
    call (module docstring: the caller then runs the two launches)."""
    symmetric = group.symmetric if group.size > 1 else None
    if (
        symmetric is None
        or not symmetric.takes(partial)
        or type(norm) not in (RMSNorm, Float32RMSNorm)
        or stream.dtype != partial.dtype
        or stream.shape != partial.shape
        or not stream.is_contiguous()
        or partial.dim() != 2
        or triton.next_power_of_2(partial.shape[1]) > _MAX_BLOCK
    ):
        return None
    rows, dim = partial.shape
    in_float32 = isinstance(norm, Float32RMSNorm)
    weight = norm.weight
    out_dtype = partial.dtype if in_float32 else torch.promote_types(weight.dtype, partial.dtype)
    out = torch.empty(rows, dim, dtype=out_dtype, device=partial.device)
    added = torch.empty_like(stream)
    (buffers, epoch, arrivals, slot), constants = push_arguments(symmetric, partial.dtype)
    block = triton.next_power_of_2(dim)
    _all_reduce_add_norm_kernel[(rows,)](
        partial,
        stream,
        partial if weight is None else weight,
        out,
        added,
        buffers,
        epoch,
        arrivals,
        dim,
        slot,
        norm.eps,
        norm.offset if in_float32 else 0.0,
        **constants,
        HAS_WEIGHT=weight is not None,
        WEIGHT_IN_FLOAT32=in_float32,
        BLOCK=block,
        num_warps=row_warps(block),
        enable_fp_fusion=False,
    )
    return out, added
