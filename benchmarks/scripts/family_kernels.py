"""Where a family's decode step goes: for each shape of bench/family_shapes.py (random bf16 weights, one GPU), the
captured batch-1 greedy decode step replayed under torch.profiler, its kernels by name (GPU ms and launches per
replay, largest first). ``PYTHONPATH=. python3 benchmarks/scripts/family_kernels.py OUT SHAPE [SHAPE ...]``
writes OUT/kernels_SHAPE.txt and prints the tables."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from outpace.bench.families import build, close, profile_decode_replays
from outpace.bench.family_shapes import family_shapes
from outpace.bench.profile import _kernel_table

REPLAYS = 5


def step_kernels(shape_name: str, workdir: Path) -> list[str]:
    shape = family_shapes()[shape_name]
    llm = build(workdir, shape.config, max_num_seqs=1, graph_sizes=(1,))
    try:
        prof = profile_decode_replays(llm, 1, REPLAYS)
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
