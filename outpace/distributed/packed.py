"""Layers whose rows are several parts packed one after another, each part split over the tensor-parallel group
being built (distributed/sharding.py ``PackedShard``): gated DeltaNet's and Mamba2's input projections and
depthwise convolutions (q, k, v; z, x, B, C, dt), and their per-head vectors (A_log, dt_bias, D, norm weights).
vLLM shards them part by part (``mamba_v2_sharded_weight_loader`` in vllm/model_executor/layers/mamba/
mamba_mixer2.py, used for Qwen3-Next's conv1d in models/qwen3_next.py too), so that each rank's rows of the
parts belong together: its q heads with their k and v heads, its x heads with their groups' B and C.
With one rank every part is whole and these are the plain layers.
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.distributed.group import RankGroup
from outpace.distributed.sharding import PackedShard, Shard, mark_shard, split_evenly
from outpace.layers.linear import Linear, linear

Part = tuple[
    int, int, int
]  # (the part's rows in the checkpoint, this rank's first row within it, its rows)


def even_part(rows: int, group: RankGroup, what: str) -> Part:
    """An even split of ``rows`` (``what`` names them when they do not divide)."""
    count = split_evenly(rows, group.size, what)
    return rows, group.rank * count, count


def rows_of(part: Part, width: int) -> Part:
    """A part of heads (or groups) as the part of their rows, ``width`` each."""
    rows, first, count = part
    return rows * width, first * width, count * width


def _mark(params: list[nn.Parameter | None], parts: list[Part], group: RankGroup) -> None:
    if group.size > 1:
        for p in params:
            if p is not None:
                mark_shard(p, PackedShard(0, tuple(parts)))


def packed_column_parallel(
    in_features: int, parts: list[Part], group: RankGroup, bias: bool = False
) -> Linear:
    """A column-parallel projection whose output rows are ``parts``: [..., in] -> this rank's rows of each part,
    concatenated."""
    layer = linear(in_features, sum(count for _, _, count in parts), bias)
    if group.size > 1:
        layer.group = group
    _mark([layer.weight, layer.bias], parts, group)
    return layer


def packed_depthwise_conv(parts: list[Part], width: int, group: RankGroup, bias: bool) -> nn.Conv1d:
    """A depthwise convolution (the checkpoint's [channels, 1, width] weight) over this rank's channels of each
    part."""
    channels = sum(count for _, _, count in parts)
    conv = nn.Conv1d(channels, channels, width, groups=channels, bias=bias)
    _mark([conv.weight, conv.bias], parts, group)
    return conv


def sharded_vector(part: Part, value: float, group: RankGroup) -> nn.Parameter:
    """A per-head (or per-channel) parameter, this rank's ``part`` of it, initialised to ``value``."""
    rows, first, count = part
    param = nn.Parameter(torch.full((count,), value))
    return mark_shard(param, Shard(0, first, count, rows) if group.size > 1 else None)
