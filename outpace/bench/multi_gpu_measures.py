"""What ``bench multi`` measures inside a rank (bench/multi_gpu.py's parts call them): greedy tokens against a
reference and τ, an engine's KV bytes per token, what a model holds quantized, the replays of the captured
decode steps, which calls launched the NCCL kernels, and the CPU's copy bandwidth."""

from __future__ import annotations

import time
from collections import Counter

import torch

from outpace.bench.gpu import time_decode
from outpace.speculative.metrics import SpecMetrics


def compare(reference: list[list[int]], outs) -> dict:
    """Greedy tokens against a reference: equal, the match rate position by position (bench/e2e.py), the
    first (prompt, position) that differs."""
    from outpace.bench.e2e import _match

    tokens = [o.token_ids for o in outs]
    first = next(
        (
            [i, j]
            for i, (r, t) in enumerate(zip(reference, tokens))
            for j in range(max(len(r), len(t)))
            if j >= min(len(r), len(t)) or r[j] != t[j]
        ),
        None,
    )
    return {
        "equal": tokens == reference,
        "match_rate": _match(outs, reference),
        "first_mismatch": first,
    }


def tau(outs) -> float | None:
    spec = SpecMetrics.total(o.spec_metrics for o in outs)
    return spec.acceptance_length if spec.num_verifies else None


def kv_bytes_per_token(llm) -> int:
    """KV bytes one token takes on this rank (its shard of the heads), over every layer."""
    return sum(
        t[0, 0].numel() * t.element_size() for pair in llm.engine.runner.kv_caches for t in pair
    )


def quantized_layout(model) -> dict:
    """What rank 0's model holds quantized: its quantized projections and expert stacks, their bytes as stored
    against every parameter's and buffer's (layers/quant/loading.py ``quantized_bytes``), and the names of
    the projections left in high precision (``nn.Linear`` modules, by their last name)."""
    from torch import nn

    from outpace.layers.quant.experts import QuantizedStackedWeight
    from outpace.layers.quant.linear import QuantizedLinear
    from outpace.layers.quant.loading import quantized_bytes

    quantized, total = quantized_bytes(model)
    modules = list(model.modules())
    return {
        "projections": sum(isinstance(m, QuantizedLinear) for m in modules),
        "expert_stacks": sum(isinstance(m, QuantizedStackedWeight) for m in modules),
        "quantized_bytes": quantized,
        "total_bytes": total,
        "high_precision_linears": sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, m in model.named_modules()
                if isinstance(m, nn.Linear)
            }
        ),
    }


def decode_replays(llm, batch: int, context: int, steps: int) -> dict:
    """bench/gpu.py ``time_decode`` at ``batch`` with each engine step's replays of the captured decode
    steps counted by bucket (engine/cuda_graphs.py ``CapturedCall.replays``). Over its ``steps`` timed
    steps (its last engine steps), each should replay the batch's bucket once. With run-ahead a step
    launches the next step's graph; in steady state that is one replay per step all the same."""
    from outpace.engine.cuda_graphs import bucket_for

    engine = llm.engine
    graphs = engine.runner.decode_step.graphs

    def replays() -> Counter:
        by_bucket = Counter()
        for key, graph in graphs.items():
            by_bucket[key.bucket] += graph.replays
        return by_bucket

    per_step: list[Counter] = []
    step = engine.step

    def counted():
        before = replays()
        out = step()
        per_step.append(replays() - before)
        return out

    engine.step = counted  # (this engine's steps only, for this call)
    try:
        row = time_decode(llm, batch, context, steps)
    finally:
        del engine.step
    timed, bucket = per_step[-steps:], bucket_for(engine.runner.graph_buckets, batch)
    total = sum(timed, Counter())
    return {
        "batch": batch,
        "bucket": bucket,
        "graphs_captured": len(graphs),
        "decode_steps": steps,
        "replays_by_bucket": {str(b): n for b, n in sorted(total.items())},
        # each step launches one decode step (its own, or with run-ahead the next one): those not replayed
        # from a graph ran eagerly
        "eager_steps": max(0, steps - sum(total.values())),
        "one_replay_per_step": all(c == Counter({bucket: 1}) for c in timed),
        "step_ms": row["step_ms"],
        "tokens_per_s": row["tokens_per_s"],
    }


def nccl_launches(llm, batch: int, context: int, steps: int) -> dict:
    """torch.profiler (CPU and CUDA) over ``steps`` decode steps of bench/gpu.py ``time_decode`` at ``batch``
    (after its prefill and warm-up steps): the NCCL kernels that ran by the host call that launched each
    (``kernels_by_launch``). NCCL kernels launched by a graph launch ran inside a captured step."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    decode_only = 0
    step = engine.step

    def profiled():
        nonlocal decode_only
        scheduler = engine.scheduler
        if not scheduler.waiting and all(r.num_output_tokens > 0 for r in scheduler.running):
            decode_only += 1
            if decode_only == 4:  # the first timed step, after time_decode's three warm-up steps
                prof.start()
        return step()

    engine.step = profiled  # (this engine's steps only, for this call)
    try:
        time_decode(llm, batch, context, steps)
        torch.cuda.synchronize()
    finally:
        del engine.step
        if decode_only >= 4:
            prof.stop()
    return {"batch": batch, "profiled_steps": steps, **kernels_by_launch(prof.events(), "nccl")}


def kernels_by_launch(events, name_part: str) -> dict:
    """The GPU kernels among profiler ``events`` (torch.profiler FunctionEvents) whose name holds
    ``name_part`` (case-insensitive), counted by the host runtime call that launched each (the one with the
    kernel's correlation id: a graph launch, another launch, or not in the trace), and the verdict: None
    when no such kernel could be matched to its launch, else whether every matched one came from a graph
    launch."""
    cuda = torch.autograd.DeviceType.CUDA
    launch_of = {
        e.id: e.name
        for e in events
        if e.device_type != cuda and e.name.startswith(("cuda", "cu")) and "Launch" in e.name
    }
    kernels = [e for e in events if e.device_type == cuda and name_part in e.name.lower()]
    by_launch = Counter(launch_of.get(e.id, "not in the trace") for e in kernels)
    matched = {name: n for name, n in by_launch.items() if name != "not in the trace"}
    return {
        "kernels": name_part,
        "count": len(kernels),
        "by_launch": dict(by_launch),
        "graph_launches": sum("GraphLaunch" in name for name in launch_of.values()),
        "outside_graphs": sum(n for name, n in matched.items() if "GraphLaunch" not in name),
        "all_in_graphs": all("GraphLaunch" in name for name in matched) if matched else None,
    }


def cpu_copy_bandwidth(num_bytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes/s (read plus written) of a CPU tensor copy, median: the CPU stand-in for bench/gpu.py's."""
    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * num_bytes / sorted(times)[repeats // 2]
