"""The collectives sharded layers and the lockstep engine use; each is the identity for one rank."""

from __future__ import annotations

import pickle

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


class CollectiveTimeout(dist.DistError):
    """The other ranks did not take part in a collective within the group's timeout (one died without its
    connection closing, or hangs)."""


def broadcast_from_driver(obj, group: RankGroup):
    """Rank 0's ``obj`` on every rank (other ranks' argument is ignored), pickled over the CPU group.

    Rank 0 waits at most ``group.timeout`` for the others to take it, then raises ``CollectiveTimeout``: a
    gloo send completes only once its receiver has posted the receive, and a rank 0 whose peer had been
    killed was once seen held here for good, its connection's loss unnoticed (a server under CI's load,
    tests/distributed/test_expert_parallel_nodes.py). The others wait for rank 0 as long as it idles (the
    CPU group's timeout: group.py)."""
    if group.size == 1:
        return obj
    if not group.is_driver:
        size = torch.empty(1, dtype=torch.int64)
        dist.broadcast(size, src=0, group=group.cpu_group)
        payload = torch.empty(int(size), dtype=torch.uint8)  # [bytes]
        dist.broadcast(payload, src=0, group=group.cpu_group)
        return pickle.loads(payload.numpy().tobytes())
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)  # [bytes]
    for tensor in (torch.tensor([payload.numel()], dtype=torch.int64), payload):
        work = dist.broadcast(tensor, src=0, group=group.cpu_group, async_op=True)
        try:
            work.wait(timeout=group.timeout)
        except RuntimeError as e:
            if work.is_completed():  # the backend's own failure (a peer's connection closed)
                raise
            raise CollectiveTimeout(
                f"rank 0's step was not taken by the other ranks within "
                f"{group.timeout.total_seconds():g} s (--dist-timeout): {e}"
            ) from e
    return obj
