"""Where batch-invariant mode's decode cost goes between the GPU and the host: for each family shape
(bench/family_shapes.py, random bf16 weights, built as bench/families.py builds them) at each batch, in both
modes, an engine's decode steps timed from return to return (``bench.gpu.time_decode``'s rate), the captured
graphs' replays a step (1.0: every step replayed its graph), and under torch.profiler the GPU's kernel time a
step, the span from a step's first kernel to its last, and the host's busiest calls. A step whose wall time is
well above its GPU span is paced by the host, not by its kernels.

    PYTHONPATH=. python3 benchmarks/scripts/invariant_step_gap.py OUT SHAPE[@BATCH] ...
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.bench.families import build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import start_decoding

CONTEXT = 512
TIMED_STEPS = 48
PROFILED_STEPS = 6


def replays(llm) -> int:
    return sum(call.replays for call in llm.engine.runner.decode_step.graphs.values())


def gpu_per_step(prof) -> tuple[float, float]:
    """(kernel and copy time, span from first start to last end) per profiled step, in us."""
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in events)
    span = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    return busy / PROFILED_STEPS, span / PROFILED_STEPS


def host_top(prof, lines: int = 8) -> list[str]:
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=lines)
    return table.splitlines()


def measure(shape: str, batch: int, invariant: bool, workdir: Path) -> dict:
    config = family_shapes()[shape].config
    llm = build(workdir, config, batch, (batch,), batch_invariant=invariant)
    try:
        engine = llm.engine
        ids = start_decoding(llm, batch, CONTEXT, max_tokens=64 * TIMED_STEPS)
        before = replays(llm)
        t0 = time.perf_counter()
        for _ in range(TIMED_STEPS):
            engine.step()
        wall_us = 1e6 * (time.perf_counter() - t0) / TIMED_STEPS
        per_step = (replays(llm) - before) / TIMED_STEPS
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED_STEPS):
                engine.step()
            torch.cuda.synchronize()
        busy, span = gpu_per_step(prof)
        for rid in ids:
            engine.abort_request(rid)
        return {
            "shape": shape,
            "batch": batch,
            "batch_invariant": invariant,
            "wall_us": wall_us,
            "replays_per_step": per_step,
            "gpu_busy_us": busy,
            "gpu_span_us": span,
            "host_top": host_top(prof),
        }
    finally:
        close(llm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("shapes", nargs="+", help="SHAPE[@BATCH]")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.shapes:
        shape, _, batch = name.partition("@")
        for invariant in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(measure(shape, int(batch or 1), invariant, Path(tmp)))
            r = rows[-1]
            print("\n".join(r["host_top"]), flush=True)
    (args.out / "invariant_step_gap.json").write_text(json.dumps(rows, indent=1))
    print(
        f"\n{'shape':22s} {'batch':>5s} {'mode':>10s} {'wall us':>9s} {'replays':>8s} {'gpu busy':>9s} {'span':>9s}"
    )
    for r in rows:
        mode = "invariant" if r["batch_invariant"] else "normal"
        print(
            f"{r['shape']:22s} {r['batch']:5d} {mode:>10s} {r['wall_us']:9.1f} "
            f"{r['replays_per_step']:8.2f} {r['gpu_busy_us']:9.1f} {r['gpu_span_us']:9.1f}"
        )


if __name__ == "__main__":
    main()
