"""layers/argmax.py's two-launch argmax against torch's, on the GPU: microseconds a call at vocabulary widths
of the seed families and the rows of decode (1, 8, 32) and verify (8 x 5), each timed over a CUDA graph of
100 calls (what a captured step pays, launch gaps included).

    PYTHONPATH=. python benchmarks/scripts/argmax_speed.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from outpace.bench.graph_timing import graph_call_us
from outpace.layers.argmax import argmax_last

WIDTHS = (102400, 151936, 128256, 262144)  # DeepSeek-V2, Qwen, Llama-3, Gemma
ROWS = (1, 8, 32, 40)
CALLS = 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    print(f"{'width':>7} {'rows':>4} {'torch us':>9} {'ours us':>8}")
    for width in WIDTHS:
        for r in ROWS:
            x = torch.randn(r, width, device="cuda").to(torch.bfloat16)
            assert torch.equal(argmax_last(x), x.argmax(-1))
            row = {
                "width": width,
                "rows": r,
                "torch_us": graph_call_us(lambda: x.argmax(-1), CALLS),
                "ours_us": graph_call_us(lambda: argmax_last(x), CALLS),
            }
            rows.append(row)
            print(f"{width:>7} {r:>4} {row['torch_us']:>9.2f} {row['ours_us']:>8.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows) + "\n")


if __name__ == "__main__":
    main()
