"""How an engine's rank 0 tears its ranks down (distributed/launch.py ``Ranks.close``), without processes:
on NCCL destroying the group is a collective that the started ranks also make before they exit, so rank 0
destroys it before waiting for them (the other order hung on two H200s); where a started rank is already
gone, the group is aborted instead; and every rank frees its CUDA graphs first, since a graph that captured
NCCL collectives keeps the group from being destroyed (pytorch/pytorch#115388: the EP GPU test hung so on
four H200s after the order above was fixed). gloo's destroy is local, so the CPU engines cannot show the
hang. Before destroying the group, an orderly close waits for every rank at a host-group barrier
(``Ranks.leave_together``): a gloo rank 0 that destroyed it while another rank still read from it aborted at
exit; a barrier that fails (a rank gone) does not stop the close."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from outpace.distributed.group import RankGroup
from outpace.distributed.launch import Ranks
from outpace.engine.engine import close_ranks


class FakeProcess:
    def __init__(self, calls: list, exitcode: int | None) -> None:
        self.calls, self.exitcode = calls, exitcode

    def join(self, timeout: float | None = None) -> None:
        self.calls.append("join")
        self.exitcode = 0 if self.exitcode is None else self.exitcode

    def terminate(self) -> None:
        self.calls.append("terminate")


@pytest.fixture
def calls(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: calls.append("destroy"))
    monkeypatch.setattr(dist, "monitored_barrier", lambda *a, **k: calls.append("leave together"))
    monkeypatch.setattr(
        dist.distributed_c10d, "_abort_process_group", lambda *a: calls.append("abort")
    )
    return calls


def test_the_group_is_destroyed_before_the_ranks_are_awaited(calls):
    ranks = Ranks(processes={1: FakeProcess(calls, None)}, owns_group=True)
    ranks.close(timeout_s=0.1)
    assert calls == ["destroy", "join"]
    ranks.close()  # idempotent
    assert calls == ["destroy", "join"]


def test_a_group_with_a_dead_rank_is_aborted(calls):
    ranks = Ranks(processes={1: FakeProcess(calls, -9)}, owns_group=True)
    ranks.close(timeout_s=0.1)
    assert calls == ["abort", "join"]


def test_a_rank_that_did_not_create_the_group_leaves_it(calls):
    Ranks(owns_group=False).close()
    assert calls == []


class FakeLockstep:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def stop(self) -> None:
        self.calls.append("stop")


def test_an_engine_frees_its_graphs_after_telling_the_ranks_and_before_destroying_the_group(calls):
    ranks = Ranks(RankGroup(0, 2), processes={1: FakeProcess(calls, None)}, owns_group=True)
    close_ranks(FakeLockstep(calls), ranks, lambda: calls.append("release graphs"))
    assert calls == ["stop", "release graphs", "leave together", "destroy", "join"]
    follower = Ranks(RankGroup(1, 2))  # a started rank: the group is destroyed by its process after
    close_ranks(None, follower, lambda: calls.append("follower's graphs"))
    assert calls[5:] == ["follower's graphs", "leave together"]


def test_a_barrier_that_fails_does_not_stop_the_close(calls, monkeypatch, capsys):
    def gone(*args, **kwargs):
        raise RuntimeError("rank 1 failed to pass monitoredBarrier")

    monkeypatch.setattr(dist, "monitored_barrier", gone)
    ranks = Ranks(RankGroup(0, 2), processes={1: FakeProcess(calls, None)}, owns_group=True)
    close_ranks(FakeLockstep(calls), ranks, lambda: calls.append("release graphs"))
    assert calls == ["stop", "release graphs", "destroy", "join"]
    assert "closing without the others: rank 1 failed" in capsys.readouterr().err


def test_one_rank_keeps_its_graphs_at_close(calls):
    close_ranks(None, Ranks(), lambda: calls.append("release graphs"))
    assert calls == []
