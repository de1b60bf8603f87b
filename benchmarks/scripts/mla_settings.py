"""The MLA block's launch settings measured on DeepSeek-V2-Lite's decode step (bench/family_shapes.py, random bf16
weights, one GPU): for each pair of (attention/mla_kernels.py ``min_split_rows``, layers/mla_fused.py
``MAX_Q_PARTS``), the decode graphs captured again and the engine's step time (bench/gpu.py ``time_decode``) at
batch 1 over 512 and 2048 cached tokens and at batch 8 over 512; each pair twice, in two passes, the lower kept.

    PYTHONPATH=. python3 benchmarks/scripts/mla_settings.py OUT.json"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from pathlib import Path

from outpace.attention import mla_kernels
from outpace.bench.families import build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import time_decode
from outpace.bench.profile import _recapture_decode
from outpace.layers import mla_fused

MIN_SPLIT_ROWS = (32, 64, 128, 256)
MAX_Q_PARTS = (4, 8)
POINTS = ((1, 512), (1, 2048), (8, 512))  # (batch, cached tokens)


def main(out: str) -> None:
    shape = family_shapes()["deepseek-v2-lite"]
    shipped = mla_kernels.min_split_rows, mla_fused.MAX_Q_PARTS
    rows: dict[tuple, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        llm = build(Path(tmp), shape.config, max_num_seqs=8, graph_sizes=(1, 8))
        try:
            for _ in range(2):
                for split, parts in itertools.product(MIN_SPLIT_ROWS, MAX_Q_PARTS):
                    mla_kernels.min_split_rows, mla_fused.MAX_Q_PARTS = split, parts
                    _recapture_decode(llm.engine)
                    for batch, context in POINTS:
                        ms = time_decode(llm, batch, context, steps=24)["step_ms"]
                        rows.setdefault((split, parts, batch, context), []).append(ms)
        finally:
            mla_kernels.min_split_rows, mla_fused.MAX_Q_PARTS = shipped
            close(llm)
    table = [
        {"min_split_rows": s, "max_q_parts": p, "batch": b, "context": c, "step_ms": min(ms)}
        for (s, p, b, c), ms in rows.items()
    ]
    Path(out).write_text(json.dumps(table, indent=1))
    print("min_split_rows max_q_parts " + " ".join(f"b{b}@{c}" for b, c in POINTS) + " (step ms)")
    for split, parts in itertools.product(MIN_SPLIT_ROWS, MAX_Q_PARTS):
        cells = " ".join(f"{min(rows[(split, parts, b, c)]):7.3f}" for b, c in POINTS)
        print(f"{split:14d} {parts:11d} {cells}")


if __name__ == "__main__":
    main(sys.argv[1])
