"""The decode step's all-reduces on the GPUs of one machine, four ways: NCCL (``dist.all_reduce``), torch's
symmetric-memory one-shot and two-shot all-reduces (``torch.ops.symm_mem``: each rank reads its peers'
buffers over NVLink, no multicast), and the push all-reduce distributed/collectives.py runs
(distributed/push_all_reduce_kernel.py: each rank writes into its peers' buffers, no barrier), each as 90 calls of
[rows, 4096] bf16 captured in one CUDA graph (Step-3.5-Flash's 45 layers, two a layer), rows 1, 8, 32.
Also checks that every way gives every rank the same sum as NCCL's. Prints microseconds per call; writes
OUT/all_reduce_timings.json.
``PYTHONPATH=. python3 benchmarks/scripts/all_reduce_timings.py OUT [GPUS]`` (NVLink multicast off, as the
device notes ask: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from outpace.distributed.symmetric_all_reduce import SymmetricAllReduce

CALLS, HIDDEN, ROWS = 90, 4096, (1, 8, 32)


def graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (10 * CALLS)


def rank_main(rank: int, world: int, out: str) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    group = dist.group.WORLD.group_name
    push_path = SymmetricAllReduce.for_group(
        dist.group.WORLD, dist.new_group(backend="gloo"), torch.device("cuda", rank)
    )
    buffer = symm_mem.empty(max(ROWS) * HIDDEN, dtype=torch.bfloat16, device="cuda")
    symm_mem.rendezvous(buffer, group)
    rows_out = []
    for rows in ROWS:
        g = torch.Generator("cuda").manual_seed(rank * 100 + rows)
        x = torch.randn(rows, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
        staged = buffer[: rows * HIDDEN]
        nccl_out = x.clone()
        dist.all_reduce(nccl_out)
        one_out = torch.empty_like(x)

        def one_shot():
            staged.copy_(x.view(-1))
            torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", group, one_out.view(-1))

        def two_shot():
            staged.copy_(x.view(-1))
            torch.ops.symm_mem.two_shot_all_reduce_(staged, "sum", group)

        work = x.clone()
        push_out = x.clone()

        def push():
            push_path.all_reduce_(push_out)

        push()
        torch.cuda.synchronize()
        same_push = torch.equal(push_out, nccl_out)

        def nccl():
            dist.all_reduce(work)

        one_shot()
        torch.cuda.synchronize()
        same_one = torch.equal(one_out, nccl_out)
        two_shot()
        torch.cuda.synchronize()
        same_two = torch.equal(staged.view(rows, HIDDEN), nccl_out)
        row = {
            "rows": rows,
            "nccl_us": graph_us(nccl),
            "one_shot_us": graph_us(one_shot),
            "two_shot_us": graph_us(two_shot),
            "push_us": graph_us(push),
            "push_equals_nccl": same_push,
            "one_shot_equals_nccl": same_one,
            "two_shot_equals_nccl": same_two,
        }
        rows_out.append(row)
        if rank == 0:
            print(
                f"[{rows:2d}, {HIDDEN}] bf16 x {CALLS}: NCCL {row['nccl_us']:6.2f} us  one-shot "
                f"{row['one_shot_us']:6.2f} us (equal: {same_one})  two-shot {row['two_shot_us']:6.2f} us "
                f"(equal: {same_two})  push {row['push_us']:6.2f} us (equal: {same_push})",
                flush=True,
            )
    if rank == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "all_reduce_timings.json").write_text(
            json.dumps({"world": world, "rows": rows_out}, indent=1)
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[2]) if len(sys.argv) > 2 else torch.cuda.device_count()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    mp.spawn(rank_main, args=(world, sys.argv[1]), nprocs=world)
