"""Which DeltaNet step launch variants give token 0's float32 state other bits (gpu_2026-12-03d call 2): the
kernel alone (tests/kernels/test_deltanet_step.py's ``kernel_step``) at tinyqwen35's shape in bf16, batch-invariant
mode, 16 seeds; token 0 run as decode into the row, decode into snapshot 0, or the first of a chain of 3 (snapshots,
its end in the row or not). Each against decode into the row: how many seeds differ, the most elements differing.

    PYTHONPATH=.:tests python3 variant_bits.py"""

import torch

from outpace.attention.context import forward_settings
from tests.kernels.test_deltanet_step import (
    DEVICE,
    TINYQWEN35,
    kernel_step,
    make_layer,
    pool,
    token_rows,
)

FORMS = {
    "decode into the row": (([1], [True], None, False), None),
    "decode into snapshot 0": (([1], [True], None, True), 0),
    "chain of 3 into snapshots": (([3], [True], None, True), 0),
    "chain of 3, its end in the row": (([3], [True], None, True, 2), 0),
    "chain of 1, its end in the row": (([1], [True], None, True, 0), None),
}
ROW = 3
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # (the CPU: a check of this script)
results = {name: [0, 0] for name in FORMS}
for seed in range(16):
    layer = make_layer(False, seed=seed, dtype=DTYPE, device=DEVICE, hidden=128, **TINYQWEN35)
    with torch.no_grad():
        layer.A_log.uniform_(-2, 0)
        x = torch.randn(3, 128, generator=torch.Generator().manual_seed(100 + seed)).to(
            DEVICE, DTYPE
        )
        states, snapshots = pool(layer, seed, DTYPE, DEVICE)
        states["recurrent"] *= 0.1
        with forward_settings(True):
            projected = layer._projected_rows(x)
            got = {}
            for name, (form, snap) in FORMS.items():
                rows = projected if form[0][0] == 3 else token_rows(projected, 0)
                _, st, sn = kernel_step(layer, rows, form, states, snapshots, [ROW])
                got[name] = st["recurrent"][ROW] if snap is None else sn["recurrent"][ROW, snap]
    want = got["decode into the row"]
    for name, state in got.items():
        differ = (state != want).sum().item()
        results[name][0] += differ > 0
        results[name][1] = max(results[name][1], differ)
for name, (seeds, most) in results.items():
    print(f"{name:34s} seeds differing {seeds:2d}/16, most elements differing {most}")
