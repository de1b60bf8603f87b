"""The captured decode step's time of family shapes at batch 1 and 8 over 512 cached tokens (random bf16 weights),
with whichever outpace is on PYTHONPATH: call2.sh runs it on two commits, one after the other, on one machine.
Each point is the lower of three ``time_decode`` runs of 24 steps.

    PYTHONPATH=<checkout> python3 step_ms.py LABEL SHAPE ..."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from outpace.bench.families import build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import time_decode

POINTS = ((1, 512), (8, 512))


def main(label: str, *shapes: str) -> None:
    for shape in shapes:
        with tempfile.TemporaryDirectory() as tmp:
            llm = build(
                Path(tmp), family_shapes()[shape].config, max_num_seqs=8, graph_sizes=(1, 8)
            )
            try:
                for batch, context in POINTS:
                    ms = min(
                        time_decode(llm, batch, context, steps=24)["step_ms"] for _ in range(3)
                    )
                    print(f"STEP {label} {shape} b{batch}@{context} {ms:.3f} ms", flush=True)
            finally:
                close(llm)


if __name__ == "__main__":
    main(*sys.argv[1:])
