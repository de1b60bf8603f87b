"""The kernels of one decode step in the order the GPU ran them: for a shape of bench/family_shapes.py (random bf16
weights, one GPU) at a batch, the captured greedy decode step under torch.profiler, one line a kernel: its start
after the step's first kernel, its duration and the gap since the previous kernel ended (us), and its name. Where
family_kernels.py sums kernels by name, this shows a layer's chain, and with ``OUTPACE_PDL=0`` each kernel's own
time (with programmatic dependent launch a kernel is timed from its early start, so it holds some of the
previous kernel's time).

    PYTHONPATH=. python3 benchmarks/scripts/step_timeline.py OUT SHAPE[@BATCH] ... [--batch-invariant]

writes OUT/timeline_SHAPE@BATCH.txt (timeline_SHAPE@BATCH_invariant.txt in batch-invariant mode) (every kernel of the second profiled step) and prints its first
``--lines`` lines."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.bench.families import build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import start_decoding
from outpace.bench.profile import _cuda_events, kernel_timeline

CONTEXT = 512


def step_lines(shape_name: str, workdir: Path, batch: int, invariant: bool) -> list[str]:
    shape = family_shapes()[shape_name]
    llm = build(
        workdir, shape.config, max_num_seqs=batch, graph_sizes=(batch,), batch_invariant=invariant
    )
    try:
        start_decoding(llm, batch, CONTEXT, max_tokens=64)
        engine = llm.engine
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                engine.step()
            torch.cuda.synchronize()
        events = _cuda_events(prof)
        per_step = len(events) // 3
        step = events[per_step : 2 * per_step]  # the second step's kernels (steps launch alike)
        mode = " (batch-invariant)" if invariant else ""
        head = (
            f"{shape_name} batch {batch}{mode}: {len(step)} kernels and copies, start/dur/gap in us"
        )
        return [head, *kernel_timeline(step)]
    finally:
        close(llm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("shapes", nargs="+", help="SHAPE[@BATCH]")
    parser.add_argument("--lines", type=int, default=60)
    parser.add_argument("--batch-invariant", action="store_true")
    args = parser.parse_args()
    suffix = "_invariant" if args.batch_invariant else ""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        shape, _, batch = name.partition("@")
        with tempfile.TemporaryDirectory() as tmp:
            lines = step_lines(shape, Path(tmp), int(batch or 1), args.batch_invariant)
        (Path(args.out) / f"timeline_{shape}@{batch or 1}{suffix}.txt").write_text(
            "\n".join(lines) + "\n"
        )
        print("\n".join(lines[: args.lines] + lines[-1:]), flush=True)


if __name__ == "__main__":
    main()
