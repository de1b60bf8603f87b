"""Where a steady speculative step's time goes beyond its captured replay: on a widened family of bench e2e
(``outpace.bench.e2e``) at batch 1, one request decoded under torch.profiler for each method, and per engine
step: the wall time, the host's wait for the step's tokens, how many steps a step run ahead served
(engine/run_ahead.py), and the GPU's idle time between kernels over the decode steps, with the largest idle
gaps by the kernels before and after them (a gap after a step's last kernel is the host's, or a copy's).

    PYTHONPATH=. python3 benchmarks/scripts/diag_spec_gaps.py --family qwen35 --methods none mtp --workdir DIR

Bench e2e's steady rate against the adaptive chooser's step cost (the replay's own events) left about 65 us a
step unexplained for Qwen3.5's MTP and under 20 us for plain decoding (benchmarks/results/gpu_2026-12-02
call 8); this finds where. (Call 9 ran a first version, whose GPU busy and idle figures counted the steps'
annotations as GPU work: only its step times, waits and run-ahead counts stand.)"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from outpace.bench.e2e import bench_device, drafters, row_params, target_llm, widened_zoo
from outpace.engine import launch as launch_module
from outpace.zoo import zoo_dir

STEP = "engine_step"  # each engine step's annotation
PHASES = ("prefill_forward", "sample_first", "absorb")  # the prefill step's parts, annotated
LAUNCH, WAIT = (
    ("LaunchKernel",),
    ("Synchronize", "cudaMemcpy"),
)  # runtime calls: launches, host waits


def _short(name: str) -> str:
    return name.replace("void at::native::", "").replace("(anonymous namespace)::", "")[:48]


def gpu_gaps(prof, first: float, last: float) -> tuple[float, float, dict]:
    """(busy us, idle us, {(kernel before, kernel after): [total idle us, count]}) over [first, last]: the
    GPU's kernels and copies (not the steps' annotations, which torch.profiler also puts on the GPU's
    timeline), clipped to the window, so busy + idle is its length."""
    kernels = sorted(
        (max(e.time_range.start, first), min(e.time_range.end, last), _short(e.name))
        for e in prof.events()
        if e.device_type.name == "CUDA"
        and e.name != STEP
        and e.time_range.end > first
        and e.time_range.start < last
    )
    busy = idle = 0.0
    gaps: dict = defaultdict(lambda: [0.0, 0])
    end, before = first, "(window start)"
    for start, stop, name in kernels:
        if start > end:
            idle += start - end
            gap = gaps[(before, name)]
            gap[0] += start - end
            gap[1] += 1
        if stop > end:
            busy += stop - max(start, end)
            end, before = stop, name
    idle += last - end
    return busy, idle, gaps


def phase_profile(prof, name: str) -> dict:
    """The first range annotated ``name`` (a prefill-step phase): its wall ms, the kernels launched within it
    (CUDA runtime and driver launch calls, Triton's among them), the ms the host spent in calls that wait for
    the GPU (synchronize, blocking copies), its most frequent torch ops and the CUDA calls that took the host
    longest (call 18 found DeepSeek's MTP absorb at 18.4 ms of host time for 65 launches and 0.2 ms of waits)."""
    ranges = [e.time_range for e in prof.events() if e.name == name and e.device_type.name == "CPU"]
    if not ranges:
        return {}
    first = min(ranges, key=lambda r: r.start)
    inside = [
        e
        for e in prof.events()
        if e.device_type.name == "CPU"
        and e.name != name
        and e.time_range.start >= first.start
        and e.time_range.end <= first.end
    ]
    ops: dict = defaultdict(int)
    runtime: dict = defaultdict(
        float
    )  # CUDA runtime / driver call -> host us (cudaMalloc, cudaFree among them)
    for e in inside:
        if e.name.startswith("aten::"):
            ops[e.name] += 1
        elif e.name.startswith("cu"):
            runtime[e.name] += e.time_range.elapsed_us()
    return {
        "wall_ms": round((first.end - first.start) / 1e3, 3),
        "launches": sum(any(k in e.name for k in LAUNCH) for e in inside),
        "host_wait_ms": round(
            sum(e.time_range.elapsed_us() for e in inside if any(k in e.name for k in WAIT)) / 1e3,
            3,
        ),
        "top_ops": sorted(ops.items(), key=lambda kv: -kv[1])[:10],
        "runtime_ms": [
            (k, round(v / 1e3, 3)) for k, v in sorted(runtime.items(), key=lambda kv: -kv[1])[:8]
        ],
    }


def annotate(obj, attr: str, label: str) -> None:
    """Wrap ``obj.attr`` (a bound method) in a profiler range named ``label``."""
    real = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        with record_function(label):
            return real(*args, **kwargs)

    setattr(obj, attr, wrapped)


def diagnose(family: str, method: str, workdir: Path, max_tokens: int, tiny: bool) -> dict:
    """One method's row (module docstring); ``tiny``: bench e2e's tiny widening (a CPU's smoke run)."""
    device, dtype = bench_device()
    models = widened_zoo(workdir, family, tiny, getattr(torch, dtype))
    spec = drafters(models, family)[method]
    llm = target_llm(models, family, spec, tiny, device=device, dtype=dtype, max_num_seqs=1)
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    params = row_params(0.0, max_tokens)
    llm.generate(prompts[:3], params)  # warm-up, and the chooser's first measurements
    engine, runner = llm.engine, llm.engine.runner
    walls, waits, served = [], [0.0], [0, 0]
    real_step, real_tolist = engine.step, launch_module.HostCopy.tolist
    ahead = runner.run_ahead
    real_take = ahead.take if ahead is not None else None

    def step():
        t = time.perf_counter()
        with record_function(STEP):
            out = real_step()
        walls.append(time.perf_counter() - t)
        return out

    def tolist(self):
        t = time.perf_counter()
        values = real_tolist(self)
        waits[0] += time.perf_counter() - t
        return values

    def take(ids, starts):
        launched = real_take(ids, starts)
        served[0] += launched is not None
        served[1] += 1
        return launched

    engine.step, launch_module.HostCopy.tolist = step, tolist
    prefill_step = runner.prefill_step
    annotate(prefill_step, "_forward", PHASES[0])
    annotate(prefill_step, "_sample_first", PHASES[1])
    if prefill_step.proposer is not None:
        annotate(prefill_step.proposer, "absorb", PHASES[2])
    if ahead is not None:
        ahead.take = take
    try:
        activities = [ProfilerActivity.CPU]
        if device == "cuda":
            torch.cuda.synchronize()
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            started = time.perf_counter()
            outs = llm.generate(prompts[3:4], params)
            if device == "cuda":
                torch.cuda.synchronize()
            request = time.perf_counter() - started
    finally:
        engine.step, launch_module.HostCopy.tolist = real_step, real_tolist
    # decode steps: not the prefill and the first, not the last two (and a drop)
    steps = walls[2:-2]
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.name == STEP and e.device_type.name == "CPU"
    )
    window = spans[2:-2]
    busy, idle, gaps = gpu_gaps(prof, window[0][0], window[-1][1])
    tokens = len(outs[0].token_ids)
    window_steps = len(window)
    top = sorted(gaps.items(), key=lambda kv: -kv[1][0])[:12]
    return {
        "family": family,
        "method": method,
        "steps": len(walls),
        "tokens": tokens,
        "served_by_run_ahead": f"{served[0]} of {served[1]}",
        "median_step_ms": 1e3 * statistics.median(steps),
        "mean_step_ms": 1e3 * statistics.fmean(steps),
        "slowest_steps_ms": [round(1e3 * w, 3) for w in sorted(steps)[-5:]],
        # what a request costs beyond its steady steps: the whole request, and the steps left out above
        "request_ms": 1e3 * request,
        "edge_steps_ms": [round(1e3 * w, 3) for w in walls[:2] + walls[-2:]],
        # the prefill step's parts (the first range of each), and the whole step the same way
        "prefill_step": {name: phase_profile(prof, name) for name in (STEP, *PHASES)},
        "wait_ms_a_step": 1e3 * waits[0] / len(walls),
        "gpu_busy_us_a_step": busy / window_steps,
        "gpu_idle_us_a_step": idle / window_steps,
        "largest_gaps_us_a_step": [
            (f"{a} -> {b}", round(total / window_steps, 2), count) for (a, b), (total, count) in top
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="qwen35")
    ap.add_argument("--methods", nargs="+", default=["none", "mtp"])
    ap.add_argument("--workdir", type=Path, default=Path(".e2e_models"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--tiny", action="store_true", help="bench e2e's tiny widening (a CPU's smoke run)"
    )
    args = ap.parse_args()
    rows = []
    for method in args.methods:
        row = diagnose(args.family, method, args.workdir, args.max_tokens, args.tiny)
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
