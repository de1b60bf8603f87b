"""``bench multi``'s ``item1`` part (issue 46 item 1, bench/multi_gpu.py's docstring): the collectives inside
the captured iteration and per-rank memory sizing, then the hybrid targets' TP equality and their drafters
lossless (bench/multi_gpu_correctness.py's checks). Functions of rank 0's ``Run``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outpace.bench.multi_gpu_correctness import lossless_items, random_written, tp_equality_items
from outpace.bench.multi_gpu_measures import decode_replays, nccl_launches
from outpace.bench.multi_gpu_plan import Case, family_drafts
from outpace.bench.multi_gpu_tp_speed import random_engine
from outpace.bench.rank_group import engine_facts
from outpace.config import SpeculativeConfig
from outpace.zoo import zoo_dir

if TYPE_CHECKING:
    from outpace.bench.multi_gpu import Run


def item1(run: Run) -> None:
    """bench/multi_gpu.py's ``item1``: captured collectives and memory sizing, then the hybrids."""
    plan, world = run.plan, run.group.world
    section = run.result.setdefault(
        "item1",
        {
            "tp": world,
            "tokens": plan.tokens,
            "graphs": [],
            "nccl": [],
            "memory": [],
            "tp_equality": [],
            "lossless": [],
        },
    )
    shape = plan.shapes[plan.graphs_shape]
    for tp in sorted({1, world}):
        run.item(
            f"item1: graphs and memory {plan.graphs_shape} TP = {tp}",
            plan.item_seconds(shape),
            lambda tp=tp: _graphs_and_memory(run, plan.graphs_shape, shape, tp, section),
        )
    zoo = zoo_dir()
    cases = [
        Case(name, str(zoo / name), dtypes=plan.hybrid_dtypes)
        for name in plan.hybrid_zoo_targets
        if (zoo / name / "config.json").is_file()
    ]
    random_dir = run.workdir / "random-qwen3-next"
    drafts = family_drafts(plan.hybrid_family_drafters)
    cost = {random_dir.name: plan.item_seconds(plan.hybrid_random)}
    if random_written(run, "item1", random_dir, plan.hybrid_random):
        cases.append(Case(random_dir.name, str(random_dir), dtypes=plan.hybrid_dtypes))
        mtp = SpeculativeConfig("mtp", num_steps=plan.hybrid_mtp_steps)
        drafts.append((random_dir.name, str(random_dir), "mtp", mtp))
    plain = tp_equality_items(run, "item1", section, cases, cost)
    lossless_items(run, "item1", section, drafts, plain, cost)


def _graphs_and_memory(run: Run, name: str, shape: dict, tp: int, section: dict) -> None:
    """The random ``shape`` at TP = ``tp``, its KV pool sized from memory and its decode step captured for
    ``plan.batches``: every rank's start-up figures, then per batch the graph replays of each timed
    decode step; at TP > 1 on a GPU, which calls launched the NCCL kernels of a few decode steps."""
    plan = run.plan
    model, kwargs = random_engine(
        run,
        run.workdir / name,
        shape,
        tp,
        None,
        num_kv_blocks=None,  # sized from each rank's memory (engine/memory.py)
        cuda_graph_sizes=plan.batches,
        # (the CPU sizes from its RAM only when given a share of it)
        **({} if plan.device.startswith("cuda") else {"cpu_memory_utilization": 0.1}),
    )
    with run.group.llm(model, cpu_graphs=True, **kwargs) as llm:
        ranks = [engine_facts(llm.engine)]
        if tp > 1:
            ranks += run.group.follower_facts()
        run.add(section["memory"], {"shape": name, "tp": tp, "ranks": ranks})
        for batch in plan.batches:
            row = decode_replays(llm, batch, plan.context, plan.graph_steps)
            run.add(section["graphs"], {"shape": name, "tp": tp, **row})
        if tp > 1 and plan.device.startswith("cuda"):
            batch = plan.batches[len(plan.batches) // 2]
            row = nccl_launches(llm, batch, plan.context, plan.profile_steps)
            run.add(section["nccl"], {"shape": name, "tp": tp, **row})
