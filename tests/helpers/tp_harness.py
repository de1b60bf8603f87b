"""Run engine scenarios in a spawned group of CPU processes (gloo), the way torchrun runs them: every
process joins one default process group; rank 0 runs each scenario through the public API
(``LLM(..., tensor_parallel_size=N)``) while the other ranks follow it (distributed/launch.py
``join_group`` + ``follow``). Rank 0's results come back as a dict name -> result. A probe (a
top-level function ``probe(rank, world)``) runs on every rank first, its rank-0 value recorded under
its name."""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.multiprocessing as mp

from outpace.checkpoint import load_checkpoint
from outpace.distributed.group import RankGroup, building_in
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model
from outpace.sampling_params import SamplingParams


@dataclass
class Scenario:
    name: str
    model: str
    prompts: list
    params: SamplingParams
    engine: dict = field(
        default_factory=dict
    )  # EngineConfig fields (tensor_parallel_size: the group's)
    error: str | None = None  # every rank expects an exception whose text holds this


def run_group(
    world: int, scenarios: list[Scenario], workdir: Path, timeout_s: float = 600, probes=()
) -> dict:
    """Run ``probes`` then ``scenarios`` in ``world`` spawned processes; fails (killing them) past
    ``timeout_s``."""
    out = workdir / f"results-{world}.json"
    ctx = mp.start_processes(
        _rank_main,
        args=(world, str(workdir / f"rendezvous-{world}"), scenarios, str(out), list(probes)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world}-process group ran past {timeout_s} s (a hang?)")
    finally:
        for p in ctx.processes:  # our own children, by handle
            if p.is_alive():
                p.kill()
    return json.loads(out.read_text())


def _rank_main(
    rank: int, world: int, rendezvous: str, scenarios: list[Scenario], out: str, probes: list
) -> None:
    import threading

    import torch.distributed as dist
    from tqdm import tqdm

    from outpace import LLM
    from outpace.config import EngineConfig
    from outpace.distributed.launch import follow, join_group
    from outpace.distributed.process_exit import leave_process

    # progress bars take a thread lock: tqdm's default, a multiprocessing semaphore, would leak at ``leave_process``
    tqdm.set_lock(threading.RLock())
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    results = {probe.__name__: probe(rank, world) for probe in probes}
    for s in scenarios:
        engine = {"tensor_parallel_size": world, **s.engine}
        start = time.perf_counter()
        try:
            if rank == 0:
                with LLM(s.model, **engine) as llm:
                    outs = llm.generate(s.prompts, s.params)
                    results[s.name] = {
                        "tokens": [o.token_ids for o in outs],
                        "preemptions": sum(o.metrics.num_preemptions for o in outs),
                        "verifies": sum(o.spec_metrics.num_verifies for o in outs),
                        "accepted": sum(o.spec_metrics.num_accepted_drafts for o in outs),
                        "free_blocks": llm.engine.pool.num_free,
                    }
            else:
                config = EngineConfig(model=s.model, **engine)
                follow(config, join_group(config).group)
        except Exception as e:
            if s.error is None or s.error not in str(e):
                raise
            results[s.name] = {"error": f"{type(e).__name__}: {e}"}
        results.setdefault(s.name, {})["seconds"] = time.perf_counter() - start
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()  # no rank tears its groups down while another still talks over them
    dist.destroy_process_group()
    # as outpace's own ranks leave (distributed/process_exit.py): the interpreter's teardown after this point has
    # aborted a finished rank on gloo under load ("terminate called without an active exception", SIGABRT: rank 1
    # of test_quantized_tp.py's per-tensor FP8 group, 2026-12-06), failing a test whose group had done its work
    leave_process(0)


def build_rank(path: str, rank: int, size: int):
    """This rank's shard of the model at ``path``, loaded (no collectives run: nothing is computed)."""
    with building_in(RankGroup(rank, size)):
        model = build_model(ModelConfig.from_pretrained(path), torch.float32)
    load_checkpoint(model, path, progress=False)
    return model
