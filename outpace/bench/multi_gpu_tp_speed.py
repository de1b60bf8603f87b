"""``bench multi``'s ``tp_speed`` part (bench/multi_gpu.py's docstring), and what the other timed parts take
from it: the all-reduces of one step measured alone (``all_reduces``), a random engine of a shape
(``random_engine``) and the captured step costs under ORACLE acceptance (``add_oracle_rows``). Each is a
function of rank 0's ``Run``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from outpace import SamplingParams
from outpace.bench.gpu import engine_8b, time_decode, weight_bytes_read
from outpace.bench.multi_gpu_measures import compare, kv_bytes_per_token, tau
from outpace.bench.multi_gpu_plan import fits_one_device, widened_zoo, zoo_prompts
from outpace.bench.oracle import ORACLE_LABEL
from outpace.config import SpeculativeConfig

if TYPE_CHECKING:
    from outpace.bench.multi_gpu import Run


def tp_speed(run: Run) -> None:
    plan, world = run.plan, run.group.world
    run.result.setdefault(
        "tp_speed",
        {"context": plan.context, "decode": [], "all_reduce": [], "eagle3": [], "oracle": []},
    )
    if run.widening is not None:
        run.widening.join()
        if run.widening_error:
            run.result["errors"]["widening the zoo"] = run.widening_error
    sizes = sorted({1, world})
    for name, shape in plan.shapes.items():
        if world > 1:
            run.item(
                f"tp_speed: all-reduces {name}",
                10.0,
                lambda name=name, shape=shape: all_reduces(run, name, shape),
            )
        for tp in sizes:
            fits, why = fits_one_device(shape, plan.device, tp)
            if not fits:
                run.result["not_run"].append(f"tp_speed: {name} at TP = {tp} does not fit: {why}")
                continue
            run.item(
                f"tp_speed: {name} plain TP = {tp}",
                plan.item_seconds(shape),
                lambda name=name, shape=shape, tp=tp: _decode(run, name, shape, tp),
            )
    run.item(
        "tp_speed: EAGLE3 on the widened zoo",
        3 * plan.item_seconds(plan.shapes[plan.widened_shape]),
        lambda: _eagle3_widened(run),
    )
    for name, shape in plan.shapes.items():
        if name == plan.widened_shape or not fits_one_device(shape, plan.device, world)[0]:
            continue
        run.item(
            f"tp_speed: EAGLE3 oracle {name} TP = {world}",
            1.5 * plan.item_seconds(shape),
            lambda name=name, shape=shape: _eagle3_oracle(run, name, shape),
        )


def all_reduces(run: Run, name: str, shape: dict, rows: list | None = None) -> None:
    """The all-reduces of one decode step (two per layer of [batch, hidden] bf16: the mixer's and the
    MLP's partial sums) measured alone, per batch, into ``rows`` (tp_speed's by default)."""
    from outpace.bench.rank_group import time_all_reduces

    count = 2 * shape["num_hidden_layers"]
    for batch in run.plan.batches:
        timed = run.group.run(time_all_reduces, count, batch, shape["hidden_size"], run.plan.device)
        run.add(
            run.result["tp_speed"]["all_reduce"] if rows is None else rows,
            {
                "shape": name,
                "batch": batch,
                "all_reduces": count,
                "hidden": shape["hidden_size"],
                "dtype": "bfloat16",
                **timed,
            },
        )


def random_engine(
    run: Run, workdir: Path, shape: dict, tp: int, spec: SpeculativeConfig | None, **engine
) -> tuple[str, dict]:
    """bench/gpu.py ``engine_8b`` for ``shape`` at TP = ``tp`` on the plan's device, with KV blocks for the
    plan's largest batch at its context; ``engine``: EngineConfig fields on top."""
    plan = run.plan
    return engine_8b(
        workdir,
        spec,
        plan.context,
        max(plan.batches),
        config=shape,
        device=plan.device,
        tensor_parallel_size=tp,
        **engine,
    )


def _decode(run: Run, name: str, shape: dict, tp: int) -> None:
    plan = run.plan
    bandwidth = run.result["copy_bandwidth_bytes_per_s"]
    reduces = {
        r["batch"]: r["seconds"] for r in run.result["tp_speed"]["all_reduce"] if r["shape"] == name
    }
    model, kwargs = random_engine(run, run.workdir / name, shape, tp, None)
    with run.group.llm(model, **kwargs) as llm:
        weights, kv = weight_bytes_read(llm.engine.model), kv_bytes_per_token(llm)
        for batch in plan.batches:
            row = time_decode(llm, batch, plan.context, plan.decode_steps)
            read_s = (weights + batch * plan.context * kv) / bandwidth
            reduce_s = reduces.get(batch, float("nan")) if tp > 1 else 0.0
            floor = batch / (read_s + reduce_s)
            row.update(
                shape=name,
                tp=tp,
                weight_bytes_per_gpu=weights,
                kv_bytes_per_token_per_gpu=kv,
                read_seconds=read_s,
                all_reduce_seconds=reduce_s,
                floor_tokens_per_s=floor,
                fraction_of_floor=row["tokens_per_s"] / floor,
            )
            run.add(run.result["tp_speed"]["decode"], row)


def _eagle3_widened(run: Run) -> None:
    """Plain decoding and EAGLE3 (adaptive, as bench e2e runs it; ``eagle3_adaptive`` False: fixed chains) on the
    widened zoo at TP = world (one GPU: TP = 1), steady tokens/s over the held-out prompts; an adaptive EAGLE3
    engine's step costs give oracle rows too."""
    from outpace.bench.e2e import _run

    plan, tp = run.plan, run.group.world
    target, draft = widened_zoo(plan, run.workdir)
    prompts = zoo_prompts(max(plan.batches))
    counts = {b: plan.batch1_prompts if b == 1 else b for b in plan.batches}
    greedy = SamplingParams(temperature=0.0, max_tokens=plan.speed_tokens, ignore_eos=True)
    methods = {
        "none": SpeculativeConfig(),
        "eagle3": SpeculativeConfig(
            "eagle3", draft, num_steps=plan.eagle3_steps, adaptive=plan.eagle3_adaptive
        ),
    }
    plain_tokens, rows = {}, run.result["tp_speed"]["eagle3"]
    label = f"{plan.widened_shape} (widened zoo)" if plan.widen_to else "zoo"
    engine = dict(
        dtype="bfloat16",
        max_num_seqs=max(plan.batches),
        num_kv_blocks=max(plan.batches) * (plan.context // 16 + 16) + 64,
    )
    for method, spec in methods.items():
        with run.engine(target, tp, speculative=spec, **engine) as llm:
            for batch in plan.batches:
                _run(
                    llm, prompts, batch, greedy.replace(max_tokens=4), counts[batch]
                )  # warm-up: prefill shapes
                _run(llm, prompts, batch, greedy, batch)  # and this batch's steps
                outs, seconds, steady = _run(llm, prompts, batch, greedy, counts[batch])
                row = {
                    "shape": label,
                    "tp": tp,
                    "method": method,
                    "batch": batch,
                    "steady_tokens_per_s": steady,
                    "tokens_per_s": sum(len(o.token_ids) for o in outs) / seconds,
                    "tau": tau(outs),
                }
                if method == "none":
                    plain_tokens[batch] = [o.token_ids for o in outs]
                else:
                    row["match_plain_greedy"] = compare(plain_tokens[batch], outs)["match_rate"]
                    base = next(
                        r
                        for r in rows
                        if r["method"] == "none" and r["batch"] == batch and r["tp"] == tp
                    )
                    row["speedup"] = steady / base["steady_tokens_per_s"]
                run.add(rows, row)
            if method == "eagle3" and plan.eagle3_adaptive:
                add_oracle_rows(run, llm, label, tp)
    if not plan.eagle3_adaptive:  # the oracle rows read adaptive speculation's step costs
        adaptive = dataclasses.replace(methods["eagle3"], adaptive=True)
        with run.engine(target, tp, speculative=adaptive, **engine) as llm:
            add_oracle_rows(run, llm, label, tp)


def _eagle3_oracle(run: Run, name: str, shape: dict) -> None:
    from outpace.bench.random_checkpoint import random_eagle3_draft

    plan, tp = run.plan, run.group.world
    draft = random_eagle3_draft(run.workdir / f"{name}-eagle3", shape, device=plan.device)
    spec = SpeculativeConfig("eagle3", str(draft), num_steps=plan.oracle_steps, adaptive=True)
    model, kwargs = random_engine(run, run.workdir / name, shape, tp, spec)
    with run.group.llm(model, **kwargs) as llm:
        add_oracle_rows(run, llm, name, tp)


def add_oracle_rows(
    run: Run, llm, name: str, tp: int, rows: list | None = None, method: str = "eagle3"
) -> None:
    """Per batch: the captured step's cost with 0..k drafts (adaptive speculation's start-up profile on a
    GPU; on the CPU, measured by running steps), the oracle speed-ups they give and the tokens/s of the
    best k at each assumed acceptance (batch x expected tokens / its step), into ``rows`` (tp_speed's
    by default)."""
    from outpace.bench.oracle import captured_step_costs, oracle_rows

    for batch in run.plan.batches:
        costs = captured_step_costs(llm, batch, run.plan.context)
        for row in oracle_rows(costs, batch):
            run.add(
                run.result["tp_speed"]["oracle"] if rows is None else rows,
                {
                    "shape": name,
                    "tp": tp,
                    "batch": batch,
                    "method": method,
                    **row,
                    "step_ms": {k: 1e3 * c for k, c in sorted(costs.items())},
                    "label": ORACLE_LABEL,
                },
            )
