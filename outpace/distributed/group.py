"""The tensor-parallel group a model is built in: this process's rank, the group's size, and the
torch.distributed process groups its collectives run over.

Two process groups, as vLLM's GroupCoordinator keeps a device group beside a CPU group
(vllm/distributed/parallel_state.py) and SGLang its ``tp_cpu_group``: tensors travel over the
device group (NCCL on GPUs, gloo on CPUs), host objects (requests, the adaptive draft choice) over a
gloo group, so broadcasting a Python object never stages it through GPU memory.

Layers learn their group when they are built: ``building_in(group)`` around a model's construction
(like ``torch.device(...)`` around it), ``build_group()`` inside a constructor. Each sharded layer
keeps the group it was built in; outside any ``building_in`` block the group is ``SINGLE`` (rank 0
of 1), the degenerate case in which every layer is the plain unsharded one.

Expert parallelism (``EngineConfig.expert_parallel_size``): the ranks of one group play up to two parts,
which the group records (``tensor_parallel``, ``expert_parallel``):
- tensor and expert parallel (EP = TP, vLLM's ``--enable-expert-parallel`` without data parallelism):
  attention and dense layers split as under TP, the routed experts placed whole on the same ranks;
- expert parallel only (TP = 1, EP = N): attention and dense layers whole on every rank (the activations
  replicated), only the routed experts split; ``build_group()`` is then ``SINGLE`` and
  ``build_expert_group()`` the group;
- tensor parallel only (the default): every expert's rows split (layers/moe.py), no expert group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from outpace.distributed.symmetric_all_reduce import SymmetricAllReduce


@dataclass(frozen=True)
class RankGroup:
    rank: int
    size: int
    device_group: object = None  # torch ProcessGroup for tensors (None when size is 1)
    cpu_group: object = None  # torch ProcessGroup (gloo) for host objects
    tensor_parallel: bool = (
        True  # attention and dense layers split over the group (module docstring)
    )
    expert_parallel: bool = False  # the routed experts placed whole on its ranks
    # the small all-reduces' symmetric-memory path (distributed/symmetric_all_reduce.py), None: NCCL only
    symmetric: object = None
    # how long a collective waits for a rank that hangs (init_rank_group's ``timeout_s``)
    timeout: datetime.timedelta = datetime.timedelta(seconds=300)

    @property
    def is_driver(self) -> bool:
        """Rank 0: the rank that takes requests and returns outputs."""
        return self.rank == 0


SINGLE = RankGroup(0, 1)
IDLE_TIMEOUT = datetime.timedelta(days=7)
_building: RankGroup = SINGLE


@contextlib.contextmanager
def building_in(group: RankGroup) -> Iterator[RankGroup]:
    """Layers constructed inside are sharded over ``group`` (as its parts say: module docstring)."""
    global _building
    previous, _building = _building, group
    try:
        yield group
    finally:
        _building = previous


def build_group() -> RankGroup:
    """The tensor-parallel group of the model being built (``SINGLE`` outside ``building_in``, and where
    the group is expert parallel only)."""
    return _building if _building.tensor_parallel or _building.size == 1 else SINGLE


def build_expert_group() -> RankGroup | None:
    """The group whose ranks the routed experts being built are placed on, whole; None where every expert
    is on every rank (its rows split over ``build_group()``)."""
    return _building if _building.expert_parallel and _building.size > 1 else None


def with_parts(group: RankGroup, tensor_parallel_size: int, expert_parallel_size: int) -> RankGroup:
    """``group`` playing the parts that an engine's sizes give it (config.py ``EngineConfig`` checked
    that each is 1 or the group's size)."""
    return dataclasses.replace(
        group,
        tensor_parallel=tensor_parallel_size == group.size,
        expert_parallel=expert_parallel_size == group.size > 1,
    )


def init_rank_group(
    world_size: int, rank: int, device: str, init_method: str = "env://", timeout_s: float = 60.0
) -> RankGroup:
    """Join (or create) the default process group and return this rank's ``RankGroup``.

    ``device`` "cpu": gloo for tensors; "cuda...": NCCL (this process's GPU is its local rank, LOCAL_RANK
    under torchrun, else its rank); host objects always over a gloo group of their own.
    ``timeout_s`` bounds every tensor collective: a rank that dies or hangs makes the others fail
    within it (gloo fails at once when a peer's connection closes) instead of hanging."""
    timeout = datetime.timedelta(seconds=timeout_s)
    on_gpu = device.startswith("cuda")
    if on_gpu:
        import os

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if on_gpu else "gloo",
            init_method=init_method,
            world_size=world_size,
            rank=rank,
            timeout=timeout,
        )
    if dist.get_world_size() != world_size:
        raise ValueError(
            f"the engine's {world_size} ranks (the larger of tensor_parallel_size and "
            f"expert_parallel_size) do not match the process group's world size "
            f"{dist.get_world_size()} (torchrun's --nnodes x --nproc-per-node must equal it)"
        )
    # NOTE: ranks > 0 wait on the CPU group for rank 0's next step however long the engine idles (a
    # server between requests), so its timeout is long; a rank that dies usually fails it at once, gloo
    # noticing the closed connection, and rank 0 bounds its own side by ``timeout``
    # (collectives.py ``broadcast_from_driver``).
    cpu_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return RankGroup(
        dist.get_rank(),
        world_size,
        dist.group.WORLD,
        cpu_group,
        symmetric=symmetric_path(cpu_group) if on_gpu else None,
        timeout=timeout,
    )


def symmetric_path(cpu_group) -> SymmetricAllReduce | None:
    """The default NCCL group's symmetric-memory all-reduce on this process's GPU (None for one rank, or
    where it is unavailable: distributed/symmetric_all_reduce.py); every rank calls this at once."""
    if dist.get_world_size() == 1:
        return None
    device = torch.device("cuda", torch.cuda.current_device())
    return SymmetricAllReduce.for_group(dist.group.WORLD, cpu_group, device)
