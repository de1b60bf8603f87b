"""Linear projections: replicated, or sharded over the tensor-parallel group the model is built in
(outpace/distributed/group.py), Megatron-style as vLLM and SGLang shard them:
- column-parallel (``column_parallel``: q/k/v, gate/up): each rank holds some output rows of the weight
  (and of the bias) and returns its part of the output, [..., out / size]; no communication;
- row-parallel (``row_parallel``: o, down): each rank holds some input columns, reads its part of the
  input (what a column-parallel layer returned) and the partial products are summed over the ranks with
  one all-reduce; the bias is added once, after it. Built with ``reduce=False`` it returns the partial
  product (the bias on rank 0 only, as vLLM's RowParallelLinear adds it) for a caller that sums several
  such outputs with one all-reduce of its own (the experts of a mixture: layers/moe.py).
With one rank both are the plain projection, computed as before.

Batch-invariant mode (a setting of the forward context: attention/context.py, from
EngineConfig.batch_invariant): a row's result does not depend on how many rows share the call, so a
verify forward and a decode step produce the same bits. On CUDA every projection goes through
``batch_invariant_linear``; elsewhere each row is projected alone (``project_rows_alone``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from outpace.attention.context import batch_invariant
from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import SINGLE, RankGroup, build_group
from outpace.distributed.sharding import Shard, mark_shard, split_evenly


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., in] -> [..., out]. On CUDA: the batch-invariant kernel in that mode; for few rows
    (bf16/fp16 decode and small verify batches) the fused projections' plain kernel, which streams the
    weights once over one program an SM (layers/fused_projection.py ``project_rows``: one few-row kernel on
    the normal path, within 10% of the batch-invariant mode's skinny kernel either way at the families'
    shapes, benchmarks/results/gpu_2026-11-29f call 1); F.linear otherwise."""
    if batch_invariant():
        if not x.is_cuda:
            return project_rows_alone(x, weight, bias)
        from outpace.layers.batch_invariant import batch_invariant_linear

        return batch_invariant_linear(x, weight, bias)
    if x.is_cuda and bias is None:
        from outpace.layers.fused_projection import fused_rows_apply, project_rows

        if fused_rows_apply(x, weight):
            return project_rows(x, weight)
    return F.linear(x, weight, bias)


def project_rows_alone(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., in] -> [..., out], each row as a matrix-vector product of its own: the CPU's batch-invariant
    projection. A CPU BLAS picks its GEMM kernel by the row count, and a row can round differently among 3
    rows than among 12 (MKL on an AVX-512 machine: tests/layers/test_batch_invariant.py)."""
    rows = x.reshape(-1, x.shape[-1])  # [M, in]
    if rows.shape[0] == 0:
        return F.linear(x, weight, bias)
    return torch.stack([F.linear(row, weight, bias) for row in rows.unbind()]).reshape(
        *x.shape[:-1], -1
    )


class Linear(nn.Linear):
    """x [..., in_features] -> [..., out_features], with in/out_features this rank's: a row-parallel layer
    (``reduces``) sums its partial products over ``group``."""

    group: RankGroup = SINGLE
    reduces: bool = False  # row-parallel: sums its partial products over the group
    partial: bool = False  # row-parallel whose caller sums them: the bias on rank 0 only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return parallel_output(self, x, lambda rows, bias: project(rows, self.weight, bias))


def parallel_output(
    layer: nn.Module,
    x: torch.Tensor,
    product: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """``layer``'s output for x [..., in] given its ``product(x, bias)``: a row-parallel layer (``reduces``)
    sums its partial products over its group and adds the bias once after; a partial one (``partial``) adds
    the bias on rank 0 only (module docstring). Also the quantized projections' (layers/quant/linear.py)."""
    if not layer.reduces:
        return product(x, None if layer.partial and layer.group.rank else layer.bias)
    out = all_reduce(product(x, None), layer.group)
    return out if layer.bias is None else out + layer.bias


def linear(in_features: int, out_features: int, bias: bool = False) -> Linear:
    """A replicated projection: every rank holds the whole weight."""
    return Linear(in_features, out_features, bias=bias)


def column_parallel(
    in_features: int,
    out_features: int,
    bias: bool = False,
    rows: tuple[int, int] | None = None,
    what: str = "output features",
) -> Linear:
    """A projection whose output rows split over the group being built: this rank holds ``rows`` = (first,
    count) of the ``out_features`` (default: an even split, ``what`` naming them when they do not
    divide), of the weight and the bias."""
    group = build_group()
    if group.size == 1:
        return linear(in_features, out_features, bias)
    first, count = rows or (
        group.rank * split_evenly(out_features, group.size, what),
        out_features // group.size,
    )
    layer = Linear(in_features, count, bias=bias)
    layer.group = group
    mark_shard(layer.weight, Shard(0, first, count, out_features))
    if bias:
        mark_shard(layer.bias, Shard(0, first, count, out_features))
    return layer


def row_parallel(
    in_features: int,
    out_features: int,
    bias: bool = False,
    what: str = "input features",
    reduce: bool = True,
) -> Linear:
    """A projection whose input columns split evenly over the group being built (``what`` names them in
    the error when they do not divide); the outputs are all-reduced, or with ``reduce=False`` left for the
    caller to sum (module docstring)."""
    group = build_group()
    if group.size == 1:
        return linear(in_features, out_features, bias)
    count = split_evenly(in_features, group.size, what)
    layer = Linear(count, out_features, bias=bias)
    layer.group, layer.reduces, layer.partial = group, reduce, not reduce
    mark_shard(layer.weight, Shard(1, group.rank * count, count, in_features))
    return layer


def is_sharded(module: nn.Module) -> bool:
    """Whether a layer (a projection, the embedding, the head) holds only this rank's part of its weight,
    so a kernel that reads the weight directly would compute with a shard."""
    group = getattr(module, "group", None)
    return group is not None and group.size > 1
