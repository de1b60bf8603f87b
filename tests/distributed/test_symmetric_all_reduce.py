"""distributed/symmetric_all_reduce.py: which messages take the symmetric-memory path and that
collectives.all_reduce sends them there (CPU); on two GPUs, its sums against NCCL's, in and out of a
captured graph (tests/gpu/test_gpu_symmetric_all_reduce.py)."""

from __future__ import annotations

import pytest
import torch

from outpace.distributed import collectives
from outpace.distributed.group import RankGroup
from outpace.distributed.symmetric_all_reduce import MAX_BYTES, SymmetricAllReduce


def test_decoding_sized_float_messages_take_the_symmetric_path():
    symmetric = SymmetricAllReduce(0, {}, "cpu")
    assert symmetric.takes(torch.zeros(1, 4096, dtype=torch.bfloat16))
    assert symmetric.takes(torch.zeros(32, 2048, dtype=torch.float32))
    assert not symmetric.takes(torch.zeros(64, 7168, dtype=torch.bfloat16))  # prefill-sized: NCCL
    assert not symmetric.takes(torch.zeros(1, 4096, dtype=torch.float16))  # no fp16 kernel
    assert symmetric.takes(torch.zeros(1, 3, dtype=torch.float32))  # any size up to MAX_BYTES
    assert not symmetric.takes(torch.zeros(MAX_BYTES // 4 + 1, dtype=torch.float32))
    assert not symmetric.takes(torch.zeros(8, 64, dtype=torch.float32).t())  # not contiguous


class _Recorder:
    def __init__(self, takes: bool) -> None:
        self.taken, self.calls = takes, []

    def takes(self, x):
        return self.taken

    def all_reduce_(self, x):
        self.calls.append(x)
        return x.mul_(2)


def test_all_reduce_sends_what_the_symmetric_path_takes_there(monkeypatch):
    nccl = []
    monkeypatch.setattr(collectives.dist, "all_reduce", lambda x, group: nccl.append(x))
    taken = _Recorder(True)
    x = torch.ones(4, 8)
    assert collectives.all_reduce(x, RankGroup(0, 2, symmetric=taken)) is x
    assert taken.calls == [x] and not nccl and torch.equal(x, torch.full((4, 8), 2.0))
    refused = _Recorder(False)
    collectives.all_reduce(x, RankGroup(0, 2, symmetric=refused))
    assert not refused.calls and nccl == [x]
    collectives.all_reduce(x, RankGroup(0, 1, symmetric=taken))  # one rank: nothing to reduce
    assert len(taken.calls) == 1 and len(nccl) == 1


def test_a_failed_set_up_leaves_the_group_on_nccl_saying_why(tmp_path):
    """Every rank's set-up failed (here: symmetric memory on a CPU): None, and a warning naming the rank
    and the error."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.warns(UserWarning, match="rank 0: RuntimeError"):
            made = SymmetricAllReduce.for_group(
                dist.group.WORLD, dist.group.WORLD, torch.device("cpu")
            )
        assert made is None
    finally:
        dist.destroy_process_group()
