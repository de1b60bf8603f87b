"""``bench multi``'s parts on whole models and layer slices built with random weights on each GPU
(bench/multi_gpu.py's docstring): ``qwen3next80b`` and ``step35flash`` (issue 46 item 3), ``ep`` (issue 46
item 2). Each model's items (``seed_items``): the collectives of one step alone, plain decode against the
floor of the bytes each GPU reads, rank 0's kernel timeline, and its MTP layer under ORACLE acceptance.
Functions of rank 0's ``Run``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from outpace.bench.family_shapes import with_mtp
from outpace.bench.gpu import time_decode
from outpace.bench.multi_gpu_measures import quantized_layout
from outpace.bench.multi_gpu_tp_speed import add_oracle_rows, all_reduces, random_engine
from outpace.bench.rank_group import engine_facts
from outpace.config import SpeculativeConfig

if TYPE_CHECKING:
    from outpace.bench.multi_gpu import Run

SEED_NAME = "qwen3-next-80b"
SEED_WEIGHTS = (
    "random bf16 weights built on each GPU, each rank its own shard (load_format='dummy'); as a checkpoint "
    "the model is about 160 GB, more than the device machine's 128 GiB disk holds"
)

STEP_NAME = "step-3.5-flash-fp8"
STEP_WEIGHTS = (
    "random block-FP8 weights built on each GPU, each rank its own shard (load_format='dummy'); as a "
    "checkpoint the model is about 200 GB (stepfun-ai/Step-3.5-Flash-FP8), more than the device machine's "
    "disk holds beside its other files"
)


def qwen3next80b(run: Run) -> None:
    """bench/multi_gpu.py's ``qwen3next80b``."""
    plan, world = run.plan, run.group.world
    config = plan.seed_model
    section = run.result.setdefault(
        "qwen3next80b",
        _seed_section(
            run,
            f"Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (bench/family_shapes.py), "
            f"{config['num_hidden_layers']} layers",
            SEED_WEIGHTS,
        ),
    )
    seed_items(run, "qwen3next80b", f"TP = {world}", SEED_NAME, config, section, plan.seed_item_s)


def step35flash(run: Run) -> None:
    """bench/multi_gpu.py's ``step35flash``: the collectives, plain decode and MTP at EP = TP = world."""
    plan, world = run.plan, run.group.world
    config = plan.step35flash_model
    block = config["quantization_config"]["weight_block_size"]
    section = run.result.setdefault(
        "step35flash",
        _seed_section(
            run,
            f"stepfun-ai/Step-3.5-Flash's config.json (bench/family_shapes.py STEP3P5_FLASH), "
            f"{config['num_hidden_layers']} layers, with stepfun-ai/Step-3.5-Flash-FP8's block-FP8 "
            f"quantization_config ({block[0]} x {block[1]} blocks)",
            STEP_WEIGHTS,
            ep=world,
        ),
    )
    seed_items(
        run, "step35flash", f"EP = TP = {world}", STEP_NAME, config, section,
        plan.step35flash_item_s, expert_parallel_size=world,
    )  # fmt: skip


def ep(run: Run) -> None:
    """bench/multi_gpu.py's ``ep``: each shape's collectives, plain decode and MTP at EP = TP = world."""
    plan, world = run.plan, run.group.world
    part = run.result.setdefault("ep", {"ep": world, "tp": world, "shapes": {}})
    for name, config in plan.ep_models.items():
        section = part["shapes"].setdefault(
            name,
            _seed_section(
                run,
                f"{name} (bench/family_shapes.py), {config['num_hidden_layers']} layers",
                SEED_WEIGHTS.split(";")[0],
                ep=world,
            ),
        )
        seed_items(
            run, f"ep: {name}", f"EP = {world}", name, config, section, plan.ep_item_s,
            expert_parallel_size=world,
        )  # fmt: skip


def _seed_section(run: Run, model: str, weights: str, **parallel) -> dict:
    """The rows of a model measured by ``seed_items``."""
    return {
        "model": model,
        "weights": weights,
        "tp": run.group.world,
        **parallel,
        "context": run.plan.context,
        "all_reduce": [],
        "engines": [],
        "decode": [],
        "oracle": [],
    }


def seed_items(
    run: Run, label: str, parallel: str, name: str, config: dict, section: dict, seconds: float,
    **engine,
) -> None:  # fmt: skip
    """``label``'s items for the model of ``config`` on the world's ranks (``engine``: EngineConfig fields
    on top): the all-reduces of one step alone, plain decode, its MTP layer under ORACLE acceptance
    (``seed_oracle``)."""
    if run.group.world > 1:
        run.item(
            f"{label}: all-reduces",
            10.0,
            lambda: all_reduces(run, name, config, section["all_reduce"]),
        )
    run.item(
        f"{label}: plain {parallel}",
        seconds,
        lambda: _seed_decode(run, name, config, section, **engine),
    )
    if run.plan.seed_oracle:
        run.item(
            f"{label}: MTP ORACLE {parallel}",
            seconds,
            lambda: _seed_mtp(run, name, with_mtp(config), section, **engine),
        )


def _seed_engine(
    run: Run, name: str, config: dict, spec: SpeculativeConfig, section: dict, what: str, **engine
):
    """The model of ``config`` at TP = world with random weights built on each GPU (``engine``: EngineConfig
    fields on top); its build seconds and every rank's start-up figures recorded as ``what``."""
    plan, world = run.plan, run.group.world
    model, kwargs = random_engine(
        run,
        run.workdir / f"{name}-{what}",
        config,
        world,
        spec,
        max_num_batched_tokens=2048,  # (bench/families.py's prefill chunks for the MoE shapes)
        cuda_graph_sizes=plan.batches,
        **engine,
    )
    t0 = time.monotonic()
    llm = run.group.llm(model, **kwargs)
    try:
        ranks = [engine_facts(llm.engine)] + (run.group.follower_facts() if world > 1 else [])
        run.add(
            section["engines"],
            {
                "engine": what,
                "build_s": time.monotonic() - t0,
                "ranks": ranks,
                "quantized": quantized_layout(llm.engine.model),
            },
        )
    except BaseException:
        llm.close()
        raise
    return llm


def _seed_decode(run: Run, name: str, config: dict, section: dict, **engine) -> None:
    """Plain decode at each batch against the floor of the bytes each GPU reads (bench/families.py
    ``step_budget`` of rank 0's shard, ``step_bytes``) over the copy bandwidth, plus the all-reduces."""
    from outpace.bench.families import distinct_experts, step_budget, step_bytes

    plan, world = run.plan, run.group.world
    bandwidth = run.result["copy_bandwidth_bytes_per_s"]
    reduces = {r["batch"]: r["seconds"] for r in section["all_reduce"]}
    with _seed_engine(run, name, config, SpeculativeConfig(), section, "plain", **engine) as llm:
        budget = step_budget(llm, config)
        for batch in plan.batches:
            row = time_decode(llm, batch, plan.context, plan.decode_steps)
            floor_bytes = step_bytes(budget, batch, plan.context)
            read_s = floor_bytes / bandwidth
            reduce_s = reduces.get(batch, float("nan")) if world > 1 else 0.0
            floor = batch / (read_s + reduce_s)
            row.update(
                shape=name,
                tp=world,
                ep=budget.expert_ranks,
                floor_bytes_per_gpu=floor_bytes,
                expected_distinct_experts=distinct_experts(budget.num_experts, budget.top_k, batch),
                read_seconds=read_s,
                all_reduce_seconds=reduce_s,
                floor_tokens_per_s=floor,
                fraction_of_floor=row["tokens_per_s"] / floor,
            )
            run.add(section["decode"], row)
        if plan.device.startswith("cuda"):
            for batch in plan.timeline_batches:
                _timeline(run, llm, name, batch, section)


def _timeline(run: Run, llm, name: str, batch: int, section: dict) -> None:
    """Rank 0's kernels of one decode step of ``llm`` at ``batch`` into OUT/timeline_<name>@<batch>.txt,
    their count and span into the section's ``timelines``."""
    from outpace.bench.profile import decode_step_timeline

    lines = [name, *decode_step_timeline(llm, batch, run.plan.context)]
    path = run.path.parent / f"timeline_{name}@{batch}.txt"
    path.write_text("\n".join(lines) + "\n")
    kernels, span = len(lines) - 3, float(lines[-1].split()[1])
    run.add(
        section.setdefault("timelines", []),
        {"batch": batch, "kernels": kernels, "span_us": span, "file": path.name},
    )


def _seed_mtp(run: Run, name: str, config: dict, section: dict, **engine) -> None:
    """Its MTP layer drafting up to ``oracle_steps`` tokens under ORACLE acceptance (random weights
    accept nothing): the captured step's cost with 0..k drafts, per batch."""
    spec = SpeculativeConfig("mtp", num_steps=run.plan.oracle_steps, adaptive=True)
    with _seed_engine(run, name, config, spec, section, "mtp", **engine) as llm:
        add_oracle_rows(run, llm, name, run.group.world, section["oracle"], "mtp")
