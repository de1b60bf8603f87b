"""Rank 0's step broadcast (distributed/collectives.py ``broadcast_from_driver``), in two spawned CPU processes
(gloo): an object reaches the other rank whole, and a rank 0 whose peer does not take its step stops after the
group's timeout with a ``CollectiveTimeout`` naming ``--dist-timeout``, which the engine reads as a collective's
failure (distributed/launch.py ``collective_failed``), instead of waiting for it for good."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from outpace.distributed.collectives import CollectiveTimeout, broadcast_from_driver
from outpace.distributed.group import RankGroup
from outpace.distributed.launch import collective_failed
from outpace.distributed.lockstep import StepMessage

MESSAGE = StepMessage(ops=[("add", bytes(range(256)) * 3), ("abort", "req-7")], schedule=[("a", 5)])
TIMEOUT_S = 1.0


def _rank(rank: int, rendezvous: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1))
    group = RankGroup(
        rank, 2, dist.group.WORLD, cpu_group, timeout=datetime.timedelta(seconds=TIMEOUT_S)
    )
    received = broadcast_from_driver(MESSAGE if rank == 0 else None, group)
    if rank == 1:  # rank 0's second step is never taken: rank 1 waits until rank 0 has given up
        Path(out + ".received").write_text(json.dumps(received == MESSAGE))
        while not Path(out).exists():
            time.sleep(0.05)
        os._exit(0)
    start = time.monotonic()
    try:
        broadcast_from_driver(MESSAGE, group)
        result = {"raised": None}
    except Exception as e:  # noqa: BLE001 - reported to the test
        result = {"raised": type(e).__name__, "message": str(e), "collective": collective_failed(e)}
    result["seconds"] = time.monotonic() - start
    Path(out).write_text(json.dumps(result))
    os._exit(0)  # (as a rank leaves: distributed/process_exit.py)


def test_rank_zero_gives_up_on_a_step_no_rank_takes(tmp_path):
    out = str(tmp_path / "result.json")
    context = mp.start_processes(
        _rank, args=(str(tmp_path / "rendezvous"), out), nprocs=2, join=False, start_method="spawn"
    )
    try:
        deadline = time.monotonic() + 120
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the two ranks ran past 120 s"
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
    assert json.loads(Path(out + ".received").read_text()) is True  # the first step arrived whole
    result = json.loads(Path(out).read_text())
    assert result["raised"] == CollectiveTimeout.__name__, result
    assert "--dist-timeout" in result["message"] and "1 s" in result["message"]
    assert result["collective"] is True
    assert TIMEOUT_S <= result["seconds"] < 30 * TIMEOUT_S
