"""Where a family's decode step goes: for each shape of bench/family_shapes.py (random bf16 weights, one GPU), the
captured batch-1 greedy decode step replayed under torch.profiler, its kernels by name (GPU ms and launches per
replay, largest first). ``PYTHONPATH=. python3 benchmarks/scripts/family_kernels.py OUT SHAPE [SHAPE ...]``
writes OUT/kernels_SHAPE.txt and prints the tables."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.bench.families import build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.profile import _decode_key, _kernel_table

REPLAYS = 5


def step_kernels(shape_name: str, workdir: Path) -> list[str]:
    shape = family_shapes()[shape_name]
    llm = build(workdir, shape.config, max_num_seqs=1, graph_sizes=(1,))
    try:
        runner = llm.engine.runner
        graph = runner.decode_step.graphs[_decode_key(llm.engine, 1)]
        runner.decode_step.batch_indices.fill_(runner.req_table.padding_index)
        graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                graph.replay()
            torch.cuda.synchronize()
        layers = shape.config["num_hidden_layers"]
        return [f"{shape_name}: {layers} layers, per replay of the batch-1 step"] + _kernel_table(
            prof, 40, REPLAYS
        )
    finally:
        close(llm)


def main(out: str, names: list[str]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                lines = step_kernels(name, Path(tmp))
            except Exception as e:  # noqa: BLE001 (one shape's failure is reported, the others still run)
                lines = [f"{name}: {type(e).__name__}: {e}"[:400]]
        (Path(out) / f"kernels_{name}.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
