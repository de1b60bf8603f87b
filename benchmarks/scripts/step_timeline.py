"""The kernels of one decode step in the order the GPU ran them: for a shape of bench/family_shapes.py (random bf16
weights, one GPU) at a batch, the captured greedy decode step under torch.profiler, one line a kernel: its start
after the step's first kernel, its duration and the gap since the previous kernel ended (us), and its name. Where
family_kernels.py sums kernels by name, this shows a layer's chain, and with ``OUTPACE_PDL=0`` each kernel's own
time (with programmatic dependent launch a kernel is timed from its early start, so it holds some of the
previous kernel's time).

    PYTHONPATH=. python3 benchmarks/scripts/step_timeline.py OUT SHAPE[@BATCH] ... [--batch-invariant]
        [--quantized fp8|fp8-published|int4|w4a16]

writes OUT/timeline_SHAPE_bBATCH.txt (every kernel of the second profiled step; ``_invariant`` and the quantization,
``_fp8`` for instance, added to the name for those modes) and prints its first ``--lines`` lines."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from outpace.bench.families import QUANTIZATION_CONFIGS, bench_shapes, build, close
from outpace.bench.profile import decode_step_timeline

CONTEXT = 512


def step_lines(
    shape_name: str, workdir: Path, batch: int, invariant: bool, quantized: str | None
) -> list[str]:
    shape = bench_shapes(quantized, [shape_name])[shape_name]
    llm = build(
        workdir, shape.config, max_num_seqs=batch, graph_sizes=(batch,), batch_invariant=invariant
    )
    try:
        mode = " (batch-invariant)" if invariant else ""
        mode += f" ({quantized})" if quantized else ""
        return [f"{shape_name}{mode}", *decode_step_timeline(llm, batch, CONTEXT)]
    finally:
        close(llm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("shapes", nargs="+", help="SHAPE[@BATCH]")
    parser.add_argument("--lines", type=int, default=60)
    parser.add_argument("--batch-invariant", action="store_true")
    parser.add_argument(
        "--quantized", choices=sorted(QUANTIZATION_CONFIGS), help="as bench/families.py's"
    )
    args = parser.parse_args()
    suffix = ("_invariant" if args.batch_invariant else "") + (
        f"_{args.quantized}" if args.quantized else ""
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        shape, _, batch = name.partition("@")
        with tempfile.TemporaryDirectory() as tmp:
            lines = step_lines(
                shape, Path(tmp), int(batch or 1), args.batch_invariant, args.quantized
            )
        # (no "@" in the name: the device machine returns no file whose name has one)
        (Path(args.out) / f"timeline_{shape}_b{batch or 1}{suffix}.txt").write_text(
            "\n".join(lines) + "\n"
        )
        print("\n".join(lines[: args.lines] + lines[-1:]), flush=True)


if __name__ == "__main__":
    main()
