"""The MLA block's launch settings measured on DeepSeek-V2-Lite's decode step (bench/family_shapes.py, random bf16
weights, one GPU): for each setting below (module attributes of attention/mla_kernels.py and layers/mla_fused.py),
the decode graphs captured again and the engine's step time (bench/gpu.py ``time_decode``) at batch 1 over 512
and 2048 cached tokens and at batch 8 over 512; each setting twice, in two passes, the lower kept. A setting
that fails to compile or run (shared memory) is reported and skipped.

    PYTHONPATH=. python3 benchmarks/scripts/mla_settings.py OUT.json"""

from __future__ import annotations

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

POINTS = ((1, 512), (1, 2048), (8, 512))  # (batch, cached tokens)
# (module, attribute): the values a setting overrides; the shipped values are the first setting
KNOBS = {
    "min_split_rows": (mla_kernels, "min_split_rows"),
    "tile_elements": (mla_fused, "_TILE_ELEMENTS"),
    "max_block_k": (mla_fused, "_MAX_BLOCK_K"),
    "down_stages": (mla_fused, "_DOWN_STAGES"),
    "q_absorb_stages": (mla_fused, "_Q_ABSORB_STAGES"),
}
# the weight bytes a q_absorb / down program keeps in flight: stages x tile elements x 2
SETTINGS = [
    {},
    {"tile_elements": 16384, "max_block_k": 512, "q_absorb_stages": 2},
    {"tile_elements": 16384, "max_block_k": 512},
    {"tile_elements": 16384, "max_block_k": 512, "q_absorb_stages": 4, "down_stages": 3},
    {"tile_elements": 32768, "max_block_k": 1024, "q_absorb_stages": 2, "down_stages": 2},
    {"tile_elements": 32768, "max_block_k": 1024, "q_absorb_stages": 3, "down_stages": 3},
    {"q_absorb_stages": 5, "down_stages": 6},
]


def apply(setting: dict, shipped: dict) -> None:
    for knob, (module, attr) in KNOBS.items():
        setattr(module, attr, setting.get(knob, shipped[knob]))


def main(out: str) -> None:
    shape = family_shapes()["deepseek-v2-lite"]
    shipped = {knob: getattr(module, attr) for knob, (module, attr) in KNOBS.items()}
    times: dict[tuple[int, int, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        llm = build(Path(tmp), shape.config, max_num_seqs=8, graph_sizes=(1, 8))
        try:
            for _ in range(2):
                for i, setting in enumerate(SETTINGS):
                    apply(setting, shipped)
                    try:
                        _recapture_decode(llm.engine)
                        for batch, context in POINTS:
                            ms = time_decode(llm, batch, context, steps=24)["step_ms"]
                            times.setdefault((i, batch, context), []).append(ms)
                    except Exception as e:  # noqa: BLE001 (a setting beyond the shared memory)
                        print(f"setting {setting}: {type(e).__name__}: {e}"[:300], flush=True)
        finally:
            apply({}, shipped)
            close(llm)
    table = [
        {"setting": SETTINGS[i], "batch": b, "context": c, "step_ms": min(ms)}
        for (i, b, c), ms in times.items()
    ]
    Path(out).write_text(json.dumps({"shipped": shipped, "rows": table}, indent=1))
    print(" ".join(f"b{b}@{c}" for b, c in POINTS) + " (step ms)  setting")
    for i, setting in enumerate(SETTINGS):
        cells = " ".join(
            f"{min(times[(i, b, c)]):7.3f}" if (i, b, c) in times else "      -" for b, c in POINTS
        )
        print(f"{cells}  {setting or 'shipped'}")


if __name__ == "__main__":
    main(sys.argv[1])
