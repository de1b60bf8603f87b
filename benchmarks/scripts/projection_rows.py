"""What each row past the first costs the fused few-row projections (layers/fused_projection.py ``_launch``): the
widened Qwen3.5's and Llama-3.1-8B's decode shapes at 1 .. 16 rows (a decode step's one, a verify's 2 .. 8, an MTP
window's 12), at the default tiles and at wider sub-tiles (the x tile is read again for every sub-tile) or
shorter K steps. Times as in projection_tiles.py (one call's share of a CUDA graph of 8 calls on 8 distinct
weights, under programmatic dependent launch), each output checked against torch's product first.

    PYTHONPATH=. python3 benchmarks/scripts/projection_rows.py [OUT.json [SHAPE ...]]

Prints, per shape, the default's us at each row count and, per tile, its us against the default's."""

from __future__ import annotations

import json
import sys

import torch
from projection_tiles import measure, random_weights

from outpace.layers.fused_rows_kernel import PLAIN, SWIGLU

# name: (epilogue, outputs, K); shapes of bench/widen_hybrid.py QWEN35 (hidden 4096, DeltaNet 16 key / 32 value
# heads of 128, attention 16 / 4 heads of 256 with a gate, MLP 12288), the Llama-3.1-8B shape, Gemma-3-12B's head
SHAPES = {
    "qwen3.5 in_proj": (PLAIN.value, 12352, 4096),
    "qwen3.5 out_proj": (PLAIN.value, 4096, 4096),
    "qwen3.5 gate_up": (SWIGLU.value, 12288, 4096),
    "qwen3.5 down": (PLAIN.value, 4096, 12288),
    "llama-8b gate_up": (SWIGLU.value, 14336, 4096),
    "llama-8b down_proj": (PLAIN.value, 4096, 14336),
    "llama-8b lm_head": (PLAIN.value, 128256, 4096),
    "gemma-3 lm_head": (PLAIN.value, 262144, 3840),
}
ROWS = (1, 2, 3, 4, 8, 12, 16)
# (outputs a program, BK, warps, stages, outputs a sub-tile at most); None: the default
TILES = [
    None,
    (None, 256, 4, 3, 64),
    (None, 128, 4, 5, 64),
    (None, 128, 4, 4, 128),
    (None, 128, 8, 4, 128),
    (None, 64, 4, 6, 128),
]


def main(out: str | None = None, *names: str) -> None:
    device = torch.device("cuda")
    rows = []
    for name in names or SHAPES:
        epilogue, n_out, k = SHAPES[name]
        weights, gb = random_weights(epilogue, n_out, k, device)
        for m in ROWS:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            times = [measure(x, weights, epilogue, n_out, tiles) for tiles in TILES]
            base = times[0]
            others = " ".join(f"{t / base:5.3f}" if t else "  -  " for t in times[1:])
            print(
                f"{name:>18} m={m:>2} default {base:6.1f} us {gb / base * 1e3:5.2f} TB/s | tiles {others}",
                flush=True,
            )
            rows.append({"shape": name, "rows": m, "us": times})
    if out:
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "tiles": TILES, "rows": rows}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
