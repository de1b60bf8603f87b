"""Where the host's time goes in a decode step on the GPU: for a shape of bench/family_shapes.py (random bf16
weights, one GPU) at a batch, the captured greedy decode step run 30 times (1) under cProfile: outpace's
functions by cumulative time a step, and (2) under torch.profiler's CPU activity: the runtime calls and torch
ops by self CPU time a step (cudaGraphLaunch, copies, synchronisations: a synchronisation's time is the host
waiting for the GPU, not host work). Beside the step's wall time, so the host work a step can be read against
the GPU's time (step_timeline.py).

    PYTHONPATH=. python3 benchmarks/scripts/host_profile.py OUT SHAPE[@BATCH] ...

writes OUT/host_SHAPE@BATCH.txt and prints it."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.bench.families import build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import start_decoding

CONTEXT = 512
STEPS = 30


def host_lines(shape_name: str, workdir: Path, batch: int) -> list[str]:
    shape = family_shapes()[shape_name]
    llm = build(workdir, shape.config, max_num_seqs=batch, graph_sizes=(batch,))
    try:
        start_decoding(llm, batch, CONTEXT, max_tokens=8 * STEPS)
        engine = llm.engine
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            engine.step()
        wall = (time.perf_counter() - t0) / STEPS * 1e6
        lines = [f"{shape_name} batch {batch}: {wall:.1f} us a step (wall, {STEPS} steps)"]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(STEPS):
            engine.step()
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(40)
        lines += ["", f"cProfile, cumulative seconds over {STEPS} steps:", text.getvalue()]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(STEPS):
                engine.step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        lines.append("torch.profiler, self CPU us a step (calls a step):")
        for e in events[:30]:
            lines.append(
                f"{e.self_cpu_time_total / STEPS:9.1f} {e.count / STEPS:6.1f}  {e.key[:100]}"
            )
        return lines
    finally:
        close(llm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("shapes", nargs="+", help="SHAPE[@BATCH]")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        shape, _, batch = name.partition("@")
        with tempfile.TemporaryDirectory() as tmp:
            lines = host_lines(shape, Path(tmp), int(batch or 1))
        (Path(args.out) / f"host_{shape}_{batch or 1}.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
