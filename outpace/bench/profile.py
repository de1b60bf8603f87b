"""Where the GPU time of a step goes (``python -m outpace.bench.profile``).

- ``8b [batch] [context]``: the 8B-shaped model: the captured decode step's time (rows of the
  padding slot) at each value of the SETTINGS; one forward run eagerly under torch.profiler, kernel
  time summed by kernel name, next to the captured step's replay time (the difference is launch
  gaps inside the graph and the step's sampling and state updates).
- ``zoo [method] [batch]``: the zoo target (``none``) or one of its drafters (bench/gpu.py's
  ZOO_DRAFTERS) generating through the engine, CUDA graphs and run-ahead as served: per engine step,
  the wall time, the GPU's busy time and kernel count (from torch.profiler), and the time of the step's
  graph replayed back to back with no host in between (what the GPU alone needs).
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace import LLM, SamplingParams
from outpace.attention import forward_context, uniform_paged_metadata
from outpace.bench.gpu import ZOO_DRAFTERS, build_8b, start_decoding
from outpace.config import SpeculativeConfig
from outpace.engine.cuda_graphs import bucket_for
from outpace.engine.step_key import SamplingMode, StepKey
from outpace.layers import fused_projection
from outpace.speculative.proposer import DraftShape

# launch settings measured at each of their values by ``profile_decode`` (then set back as shipped):
# label -> (module, attribute, values)
SETTINGS = {
    "pipeline stages of o_proj and down_proj": (fused_projection, "plain_stages", (5, 6, 7)),
    "pipeline stages of q/k/v": (fused_projection, "qkv_stages", (4, 5)),
    "pipeline stages of gate/up": (fused_projection, "swiglu_stages", (4, 5, 6)),
    "pipeline stages of the LM head": (fused_projection, "paired_stages", (5, 6)),
}


def _cuda_events(prof) -> list:
    """The profiled region's GPU kernels and copies, in launch order."""
    return sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )


def kernel_timeline(events: list) -> list[str]:
    """One line a kernel or copy of ``events`` (in launch order): its start after the first one's, its duration
    and the gap since the previous one ended (us), and its name; then the span of them all."""
    t0 = prev_end = events[0].time_range.start
    lines = []
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        lines.append(f"{start - t0:9.1f} {end - start:7.1f} {start - prev_end:6.1f}  {e.name[:90]}")
        prev_end = max(prev_end, end)
    lines.append(f"span {prev_end - t0:.1f} us")
    return lines


def decode_step_timeline(llm: LLM, batch: int, context: int) -> list[str]:
    """The kernels of one captured greedy decode step of ``llm`` at ``batch`` requests of ``context`` tokens, in
    the order the GPU ran them (``kernel_timeline``): three steps profiled, the second kept (steps launch
    alike). Under tensor or expert parallelism this is the calling rank's GPU."""
    ids = start_decoding(llm, batch, context, max_tokens=64)
    engine = llm.engine
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
    for rid in ids:
        engine.abort_request(rid)
    events = _cuda_events(prof)
    per_step = len(events) // 3
    step = events[per_step : 2 * per_step]
    return [
        f"batch {batch}: {len(step)} kernels and copies, start/dur/gap in us",
        *kernel_timeline(step),
    ]


def _kernel_table(prof, top: int, per: float = 1.0) -> list[str]:
    """Kernel time and launches by name (divided by ``per``), largest first."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in _cuda_events(prof):
        by_name[e.name][0] += e.device_time_total / 1e3  # ms
        by_name[e.name][1] += 1
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return [f"{ms / per:8.4f} ms {n / per:7.1f}x  {name[:110]}" for name, (ms, n) in rows]


def _gpu_busy(prof) -> tuple[float, int]:
    """(ms the GPU ran kernels or copies, number of them) over the profiled region."""
    events = _cuda_events(prof)
    return sum(e.device_time_total for e in events) / 1e3, len(events)


def _recapture_decode(engine) -> None:
    """Capture the decode steps again (after a launch setting changed); the old graphs are freed
    before the new capture, not by a later collection."""
    engine.runner.decode_step.graphs.clear()
    gc.collect()
    engine.runner.capture(engine.runner.graph_buckets)


def _decode_key(engine, batch: int) -> StepKey:
    """The captured greedy plain-decoding step of a batch."""
    return StepKey(
        bucket_for(engine.runner.graph_buckets, batch), DraftShape(0), SamplingMode.GREEDY
    )


def profile_decode(batch: int = 1, context: int = 512, top: int = 25) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        llm = build_8b(Path(tmp), max_context=4096 + 64, max_num_seqs=max(batch, 1))
        engine = llm.engine
        for ctx in sorted({context, 4096}):  # each setting's values in turn, same process
            for label, (module, name, values) in SETTINGS.items():
                shipped, times = getattr(module, name), {}
                for value in [*values, *values]:
                    setattr(module, name, value)
                    _recapture_decode(engine)
                    times.setdefault(value, []).append(
                        1e3 * engine.runner.profile(_decode_key(engine, batch))
                    )
                setattr(module, name, shipped)
                print(
                    f"context {ctx}: captured decode forward with {label} = "
                    + ", ".join(f"{v}: {min(t):.4f} ms" for v, t in times.items())
                    + f" (shipped: {shipped})"
                )
        _recapture_decode(engine)  # as shipped
        graph_ms = 1e3 * engine.runner.profile(_decode_key(engine, batch))
        runner, pool = engine.runner, engine.pool
        ids = [f"profile-{i}" for i in range(batch)]
        for rid in ids:
            pool.grow(rid, context + 1)
        tables = torch.tensor([pool.table(r) for r in ids], device="cuda")
        starts = torch.full((batch,), context, device="cuda")
        tokens = torch.randint(0, 1000, (batch,), device="cuda")

        def forward():
            meta = uniform_paged_metadata(tables, starts, 1, pool.block_size)
            with torch.inference_mode(), forward_context(meta, runner.backend):
                return engine.model.compute_logits(engine.model(tokens, starts).hidden_states)

        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward()
            torch.cuda.synchronize()
        graph = runner.decode_step.graphs[_decode_key(engine, batch)]
        with profile(activities=[ProfilerActivity.CUDA]) as graph_prof:
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
    busy, launches = _gpu_busy(prof)
    print(
        f"batch {batch}, context {context}: kernels {busy:.3f} ms in {launches} launches; graph replay {graph_ms:.3f} ms"
    )
    print("\n".join(_kernel_table(prof, top)))
    kernels = _cuda_events(graph_prof)
    last = kernels[-(len(kernels) // 3) :]  # the third replay
    span = (last[-1].time_range.end - last[0].time_range.start) / 1e3
    print(
        f"one graph replay: {len(last)} kernels, {span:.3f} ms from the first kernel's start to the last one's "
        f"end, {sum(e.device_time_total for e in last) / 1e3:.3f} ms of kernel time; its kernels in order "
        "(duration, gap after the previous kernel's end: negative when they overlap):"
    )
    for i, e in enumerate(last):
        if i < 24 or i >= len(last) - 6:
            gap = e.time_range.start - last[i - 1].time_range.end if i else 0.0
            print(f"{i:4d} {e.device_time_total:8.1f} us  gap {gap:6.1f} us  {e.name[:80]}")


def _replay_ms(call, repeats: int = 200) -> float:
    """GPU time of one replay of a captured call, replays queued back to back."""
    call.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def profile_zoo(method: str = "eagle3", batch: int = 1, tokens: int = 128, top: int = 20) -> dict:
    spec = {"none": SpeculativeConfig(), **ZOO_DRAFTERS}[method]
    llm = LLM("zoo/tinypy", device="cuda", dtype="bfloat16", max_num_seqs=batch, speculative=spec)
    prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"][:batch]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine = llm.engine
    llm.generate(prompts, params)  # warm-up
    step_ms: list[float] = []
    real_step = engine.step

    def timed_step():
        t = time.perf_counter()
        out = real_step()
        step_ms.append((time.perf_counter() - t) * 1e3)
        return out

    engine.step = timed_step
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    engine.step = real_step
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the same requests again, profiled
        llm.generate(prompts, params)
        torch.cuda.synchronize()
    busy, launches = _gpu_busy(prof)
    runner = engine.runner
    # the longest draft shape, over narrow windows where the drafter holds
    shape = runner.shapes[-1]
    bucket = bucket_for(runner.graph_buckets, batch)
    narrow = runner.holds.narrow_variants(shape)[-1]
    replay = _replay_ms(
        runner.decode_step.graphs[StepKey(bucket, shape, SamplingMode.GREEDY, narrow=narrow)]
    )
    produced, steps = sum(len(o.token_ids) for o in outs), len(step_ms)
    steady = sorted(step_ms[3:])
    row = {
        "method": method,
        "batch": batch,
        "steps": steps,
        "tokens": produced,
        "wall_ms_per_step": wall / steps,
        "gpu_busy_ms_per_step": busy / steps,
        "gpu_ops_per_step": launches / steps,
        "graph_replay_ms": replay,
        "tokens_per_s": produced / wall * 1e3,
        "first_steps_ms": step_ms[:3],
        "steady_step_ms_median": steady[len(steady) // 2] if steady else float("nan"),
    }
    print(
        f"zoo {method} b{batch}: {steps} steps, {produced} tokens, {row['tokens_per_s']:.0f} tok/s; per step: "
        f"wall {row['wall_ms_per_step']:.3f} ms, GPU busy {row['gpu_busy_ms_per_step']:.3f} ms in "
        f"{row['gpu_ops_per_step']:.1f} kernels/copies, graph replayed back to back {replay:.3f} ms; first steps "
        f"{', '.join(f'{t:.2f}' for t in step_ms[:3])} ms, then a median {row['steady_step_ms_median']:.3f} ms"
    )
    print("\n".join(_kernel_table(prof, top, per=steps)))
    return row


if __name__ == "__main__":
    if sys.argv[1:2] == ["zoo"]:
        profile_zoo(*(sys.argv[2:3] or ["eagle3"]), *(int(a) for a in sys.argv[3:]))
    else:
        profile_decode(*(int(a) for a in sys.argv[2 if sys.argv[1:2] == ["8b"] else 1 :]))
