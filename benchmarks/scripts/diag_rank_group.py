"""Whether two ranks of this machine form a process group: NCCL for tensors (file:// rendezvous, as
bench/rank_group.py starts its ranks) and gloo for host objects, each step timed and printed by each
rank, under a hard limit. Run: python benchmarks/scripts/diag_rank_group.py [cpu|cuda] (the network environment
variables as the caller sets them: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, device: str, rendezvous: str) -> None:
    t0 = time.monotonic()

    def say(what: str) -> None:
        print(f"rank {rank} {time.monotonic() - t0:6.2f} s: {what}", flush=True)

    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    say("default group initialised")
    control = dist.new_group(backend="gloo", timeout=timeout)
    say("gloo group created")
    box = [f"hello from {rank}"]
    dist.broadcast_object_list(box, src=0, group=control)
    say(f"gloo broadcast: {box[0]}")
    x = torch.ones(4, device=device) * (rank + 1)
    dist.all_reduce(x)
    if on_gpu:
        torch.cuda.synchronize()
    say(f"all-reduce on {device}: {x.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as e:
        address = f"unresolved ({e})"
    print(
        f"hostname {name} -> {address}; GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            rank_main, args=(2, device, f"{tmp}/rendezvous"), nprocs=2, start_method="spawn"
        )
    print("both ranks finished", flush=True)
