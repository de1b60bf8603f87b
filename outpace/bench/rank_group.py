"""The process group a multi-GPU bench runs in: one process per rank, spawned once (as torchrun starts
them) and kept across every engine the bench builds, so a tensor-parallel engine costs its build, not a
group start-up.

Rank 0 runs the bench (``main(group)``). For each tensor-parallel engine it tells the other ranks, over a
gloo control group, to build the same engine and follow it (distributed/launch.py ``join_group`` +
``follow``: the torchrun path); for a collective timing, to take part in it. A rank that finished a
command writes a marker file, so rank 0 can tell a follower that came back from one stuck in a broken
engine: the group is then given up (``healthy`` False: no more tensor-parallel work), and the parent
stops the stuck rank when rank 0 is done. A follower that built its engine also writes the engine's
start-up figures (``engine_facts``: weight bytes, KV blocks, memory plan, device memory free), which rank
0 reads with ``BenchGroup.follower_facts`` while the engine runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import pickle
import resource
import statistics
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from outpace import LLM
from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import IDLE_TIMEOUT, RankGroup, symmetric_path
from outpace.distributed.process_exit import leave_process

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)  # a hung collective fails within this


class BenchGroup:
    """Rank 0's handle on the group: engines of any tensor-parallel size, and commands for every rank."""

    def __init__(self, world: int, device: str, control, markers: Path) -> None:
        self.world, self.device, self.control, self.markers = world, device, control, markers
        self.commands = 0
        self.healthy = True

    def llm(self, model: str, cpu_graphs: bool = False, **engine) -> LLM:
        """``LLM(model, **engine)``: with ``tensor_parallel_size`` > 1 the other ranks build their shard and
        follow it. ``cpu_graphs``: on the CPU every rank's engine takes the captured-step path too
        (``capture_graphs`` after the build, as a GPU engine at start-up; the replays run eagerly), so that
        the graph bookkeeping runs in CPU tests. Raises RuntimeError when the group was given up."""
        if engine.get("tensor_parallel_size", 1) > 1:
            self._command("follow", model, (engine, cpu_graphs))
        llm = LLM(model, **engine)
        _capture_on_cpu(llm.engine, cpu_graphs)
        return llm

    def run(self, fn: Callable, *args):
        """``fn(*args)`` on every rank at once (a module-level function, for collectives); rank 0's value."""
        self._command("call", fn, args)
        return fn(*args)

    def follower_facts(self, timeout_s: float = 60.0) -> list[dict]:
        """``engine_facts`` of every other rank's engine of the last ``llm`` command, rank by rank (waiting up
        to ``timeout_s`` for a rank still finishing its build); [] with one rank."""
        paths = [self.markers / f"facts-{r}-{self.commands}.json" for r in range(1, self.world)]
        deadline = time.monotonic() + timeout_s
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline:
                missing = [p.name for p in paths if not p.exists()]
                raise RuntimeError(
                    f"no start-up figures from the other ranks after {timeout_s:.0f} s: {missing}"
                )
            time.sleep(0.05)
        return [json.loads(p.read_text()) for p in paths]

    def settled(self, timeout_s: float = 30.0) -> bool:
        """Whether every other rank finished the last command within ``timeout_s`` (after an engine closed);
        if not, the group is given up."""
        if self.world == 1 or not self.healthy or self.commands == 0:
            return self.healthy
        deadline = time.monotonic() + timeout_s
        wanted = [self.markers / f"done-{r}-{self.commands}" for r in range(1, self.world)]
        while not all(p.exists() for p in wanted):
            if time.monotonic() > deadline:
                self.healthy = False
                break
            time.sleep(0.05)
        return self.healthy

    def _command(self, *message) -> None:
        if not self.healthy:
            raise RuntimeError("the rank group was given up after an earlier failure")
        if self.world > 1:
            self.settled()
            if not self.healthy:
                raise RuntimeError("a rank did not come back from the previous command")
            self.commands += 1
            dist.broadcast_object_list([message], src=0, group=self.control)

    def finish(self) -> None:
        """Tell the other ranks to exit (when they can still hear it)."""
        if self.world > 1 and self.settled():
            dist.broadcast_object_list([None], src=0, group=self.control)


_reduce_groups: dict[str, RankGroup] = {}


def _reduce_group(device: str) -> RankGroup:
    """The default group as an engine's ranks hold it (distributed/group.py ``init_rank_group``): on GPUs with
    its symmetric-memory path, so that a step's all-reduces are timed as the engine runs them. Made once per
    process, by every rank at once."""
    if device not in _reduce_groups:
        symmetric = None
        if device.startswith("cuda"):
            symmetric = symmetric_path(dist.new_group(backend="gloo"))
        _reduce_groups[device] = RankGroup(
            dist.get_rank(), dist.get_world_size(), dist.group.WORLD, symmetric=symmetric
        )
    return _reduce_groups[device]


def time_all_reduces(count: int, rows: int, hidden: int, device: str, repeats: int = 10) -> dict:
    """Seconds of ``count`` in-place all-reduces of a [rows, hidden] bf16 tensor over the default group, as
    a decode step runs them (distributed/collectives.py ``all_reduce``) (every rank calls this at once): on a GPU one CUDA graph of the ``count`` calls
    (as they sit inside the engine's captured step), the median replay; eagerly (the median loop) on the
    CPU, or where the capture fails."""
    from outpace.engine.cuda_graphs import CapturedCall

    group = _reduce_group(device)
    x = torch.zeros(rows, hidden, dtype=torch.bfloat16, device=device)
    all_reduce(x, group)  # the communicator exists before the capture

    def loop() -> None:
        for _ in range(count):
            all_reduce(x, group)

    if device.startswith("cuda"):
        from outpace.bench.deepseek_shape import _time_replays

        try:
            return {
                "seconds": _time_replays(CapturedCall(loop, torch.device(device)), repeats),
                "timed": "captured",
            }
        except RuntimeError as e:
            print(f"bench: all-reduces not captured ({e}); timing them eagerly")
    times = []
    for _ in range(repeats + 2):
        _sync(device)
        t0 = time.perf_counter()
        loop()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times[2:]), "timed": "eager"}


def engine_facts(engine) -> dict:
    """A built engine's start-up figures on this rank: the bytes of the target's weights it holds (its shard),
    its KV blocks, the memory plan that chose them (engine/memory.py; None when ``num_kv_blocks`` was given)
    with the blocks this rank's memory held before the ranks agreed on the smallest count,
    the process's peak resident host memory (weights built on the GPU never pass through it) and, on a
    GPU, the device memory free now and in all (bytes)."""
    plan = engine.memory_plan
    facts = {
        "rank": engine.ranks.group.rank,
        "weight_bytes": sum(p.numel() * p.element_size() for p in engine.model.parameters()),
        "kv_blocks": engine.pool.num_blocks,
        "block_size": engine.pool.block_size,
        "memory_plan": dataclasses.asdict(plan) if plan is not None else None,
        "blocks_fitting_this_rank": None
        if plan is None
        else min(
            plan.limit,
            (plan.budget - plan.in_use - plan.workspace - plan.graphs) // plan.block_bytes,
        ),
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # (KiB)
    }
    device = engine.runner.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        facts.update(free_bytes=free, total_bytes=total)
    return facts


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def release_memory() -> None:
    """Collect a closed engine now (reference cycles included) and hand its GPU memory back."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# ---- the processes ------------------------------------------------------------------------------------
def run_in_group(
    world: int, device: str, workdir: Path, main: Callable, args: tuple, deadline_s: float
) -> bool:
    """Spawn ``world`` ranks; rank 0 runs ``main(group, *args)``, the others follow it. Returns whether every
    rank exited cleanly; ranks still running ``deadline_s`` after the start (or after rank 0 exited) are
    killed, so a hang costs at most that."""
    workdir.mkdir(parents=True, exist_ok=True)
    # absolute: a relative path in the file:// rendezvous URL would be read as its host name
    markers = workdir.resolve() / f"markers-{os.getpid()}-{time.monotonic_ns()}"
    markers.mkdir()
    ctx = mp.start_processes(
        _rank_main,
        args=(world, device, str(markers), main, args),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + deadline_s
    leader, clean = ctx.processes[0], True
    try:
        while any(p.is_alive() for p in ctx.processes):
            if time.monotonic() > deadline:
                print(
                    f"bench: ranks still running past the {deadline_s:.0f} s limit; stopping them"
                )
                clean = False
                break
            if not leader.is_alive():  # rank 0 is done: the others get a little while to leave
                deadline = min(deadline, time.monotonic() + 20)
            time.sleep(0.5)
    finally:
        for p in ctx.processes:  # our own children, by handle
            if p.is_alive():
                p.kill()
                clean = False
            p.join(5)
        for rank, error_file in enumerate(ctx.error_files):
            # NOTE: torch's spawn wrapper writes a rank's uncaught exception to this file, not to stderr
            if os.path.isfile(error_file) and os.path.getsize(error_file):
                with open(error_file, "rb") as f:
                    print(f"bench: rank {rank} failed:\n{pickle.load(f)}", flush=True)
    return clean and all(p.exitcode == 0 for p in ctx.processes)


def _rank_main(
    rank: int, world: int, device: str, markers: str, main: Callable, args: tuple
) -> None:
    # init_rank_group picks a rank's GPU from LOCAL_RANK; torchrun's variables say the group exists
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.setdefault(
        "NCCL_NVLS_ENABLE", "0"
    )  # NVLink multicast off (the device notes ask for it)
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        init_method=f"file://{markers}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    if rank == 0:
        group = BenchGroup(world, device, control, Path(markers) if markers else None)
        try:
            main(group, *args)
        finally:
            group.finish()
        if not group.healthy:
            # a rank is stuck in a broken engine: no teardown with it (the parent stops it)
            leave_process(0)
    else:
        _follow_commands(rank, control, Path(markers))
    dist.destroy_process_group()


def _follow_commands(rank: int, control, markers: Path) -> None:
    done = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=control)
        if box[0] is None:
            return
        kind, what, arg = box[0]
        try:
            if kind == "follow":
                _follow_engine(what, *arg, markers / f"facts-{rank}-{done + 1}.json")
            else:
                what(*arg)
        except Exception:  # rank 0 records its own side of the failure
            print(f"bench rank {rank}: {kind} failed:\n{traceback.format_exc()}")
        release_memory()
        done += 1
        (markers / f"done-{rank}-{done}").touch()


def _capture_on_cpu(engine, cpu_graphs: bool) -> None:
    """``BenchGroup.llm``'s ``cpu_graphs``: a CPU engine captures (eagerly replayed) steps as a GPU one does."""
    if cpu_graphs and engine.runner.device.type == "cpu" and engine.config.cuda_graphs:
        engine.capture_graphs()


def _follow_engine(model: str, engine_args: dict, cpu_graphs: bool, facts: Path) -> None:
    """Build this rank's engine of rank 0's ``BenchGroup.llm(model, cpu_graphs, **engine_args)``
    (distributed/launch.py ``follow``, with its start-up figures written to ``facts`` in between) and run
    rank 0's steps until it closes."""
    from outpace.config import EngineConfig
    from outpace.distributed.launch import join_group
    from outpace.engine.engine import LLMEngine

    config = EngineConfig(model=model, **engine_args)
    engine = LLMEngine(config, progress=False, ranks=join_group(config))
    _capture_on_cpu(engine, cpu_graphs)
    part = facts.with_suffix(".part")
    part.write_text(json.dumps(engine_facts(engine)))
    part.replace(facts)  # (whole or not at all: rank 0 polls for it)
    engine.follow()
