"""The collectives sharded layers and the lockstep engine use; each is the identity for one rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from outpace.distributed.group import RankGroup

# NOTE: torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns there); the GPU
# machine's torch 2.11 has only the old name.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_reduce(x: torch.Tensor, group: RankGroup) -> torch.Tensor:
    """Sum of ``x`` over the group's ranks, in place (every rank gets the same sum): a decoding-sized
    message over the group's symmetric memory where it has some (distributed/symmetric_all_reduce.py),
    else NCCL's (gloo's on CPUs)."""
    if group.size > 1:
        if group.symmetric is not None and group.symmetric.takes(x):
            group.symmetric.all_reduce_(x)
        else:
            dist.all_reduce(x, group=group.device_group)
    return x


def all_gather_last_dim(x: torch.Tensor, group: RankGroup) -> torch.Tensor:
    """[..., shard] on each rank -> [..., size * shard], rank r's shard at columns r * shard ..."""
    if group.size == 1:
        return x
    shard = x.shape[-1]
    rows = x.reshape(-1, shard).contiguous()  # [n, shard]
    gathered = torch.empty(group.size * rows.shape[0], shard, dtype=x.dtype, device=x.device)
    _all_gather_into(gathered, rows, group=group.device_group)  # [size * n, shard]
    out = gathered.view(group.size, rows.shape[0], shard).permute(1, 0, 2)  # [n, size, shard]
    return out.reshape(*x.shape[:-1], group.size * shard)


def broadcast_from_driver(obj, group: RankGroup):
    """Rank 0's ``obj`` on every rank (other ranks' argument is ignored), over the CPU group."""
    if group.size == 1:
        return obj
    box = [obj if group.is_driver else None]
    dist.broadcast_object_list(box, src=0, group=group.cpu_group)
    return box[0]
