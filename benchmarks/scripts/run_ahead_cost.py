"""Whether running a decode step ahead (engine/run_ahead.py) pays where the request state is large: before a
step run ahead the batch's state rows are copied, to restore on a drop, and a hybrid's recurrent state is MBs a
row (Qwen3.5's and Nemotron-H's copies took 0.28 and 0.46 ms of a batch-8 step on the H200,
benchmarks/results/gpu_2026-11-29f call 2), while running ahead hides the host's work between steps. Plain
decode of each shape (bench/family_shapes.py, random bf16 weights) at batch 1, 8 and 32, with run_ahead on and
off, otherwise the same engine (bench/families.py ``build``, bench/gpu.py ``time_decode``).
``PYTHONPATH=. python3 benchmarks/scripts/run_ahead_cost.py OUT.json SHAPE [SHAPE ...]``."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from outpace.bench.families import BATCHES, CONTEXT, build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import time_decode


def main(out: str, names: list[str]) -> None:
    results = {}
    for name in names:
        shape = family_shapes()[name]
        for run_ahead in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                llm = build(Path(tmp), shape.config, max(BATCHES), BATCHES, run_ahead=run_ahead)
                try:
                    rows = [time_decode(llm, batch, CONTEXT) for batch in BATCHES]
                finally:
                    close(llm)
            results[f"{name} run_ahead={run_ahead}"] = rows
            ms = " / ".join(f"{r['step_ms']:.2f}" for r in rows)
            print(
                f"{name:24} run_ahead={run_ahead!s:5}  step ms at batch {BATCHES}: {ms}", flush=True
            )
    Path(out).write_text(
        json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1)
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
