"""Where a family's decode step goes: for each shape of bench/family_shapes.py (random bf16 weights, one GPU), the
greedy decode steps of a batch (1, or the ``SHAPE@BATCH`` given) under torch.profiler, its kernels by name (GPU
ms and launches per step, largest first). The batch's requests are real ones with distinct prompts (as bench
families times them), so a MoE layer routes them to as many distinct experts as the timed rows do.
``PYTHONPATH=. python3 benchmarks/scripts/family_kernels.py OUT SHAPE[@BATCH][:QUANT] ...`` writes
OUT/kernels_SHAPE[@BATCH][:QUANT].txt and prints the tables; ``:fp8``, ``:fp8-published`` or ``:int4`` builds the
shape as ``bench families --quantized`` does (bench/families.py ``bench_shapes``)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.bench.families import bench_shapes, build, close
from outpace.bench.gpu import start_decoding
from outpace.bench.profile import _kernel_table

STEPS, CONTEXT = 5, 512


def step_kernels(shape_name: str, workdir: Path, batch: int = 1, quant: str = "") -> list[str]:
    shape = bench_shapes(quant or None, [shape_name])[shape_name]
    config = shape.config
    llm = build(workdir, config, max_num_seqs=batch, graph_sizes=(batch,))
    try:
        start_decoding(llm, batch, CONTEXT, max_tokens=64)
        engine = llm.engine
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                engine.step()
            torch.cuda.synchronize()
        layers = shape.config["num_hidden_layers"]
        title = f"{shape_name}{' in ' + quant if quant else ''}: {layers} layers, per decode step of batch {batch}"
        return [title] + _kernel_table(prof, 40, STEPS)
    finally:
        close(llm)


def main(out: str, names: list[str]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    for name in names:
        name_batch, _, quant = name.partition(":")
        shape, _, batch = name_batch.partition("@")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                lines = step_kernels(shape, Path(tmp), int(batch or 1), quant)
            except Exception as e:  # noqa: BLE001 (one shape's failure is reported, the others still run)
                lines = [f"{name}: {type(e).__name__}: {e}"[:400]]
        (Path(out) / f"kernels_{name}.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
