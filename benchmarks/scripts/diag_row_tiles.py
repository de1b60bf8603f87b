"""Whether a row's bits from the fused projection kernel depend on the row tile it sits in, on the GPU
(tests/layers/test_fused_batch_invariant.py's GPU check failed at the LM head's width on the H200,
benchmarks/results/gpu_2026-11-30 call 3: row 16 of a 17-row call against the same row alone).

    PYTHONPATH=. python3 benchmarks/scripts/diag_row_tiles.py

For widths N (4096: o_proj; 16384 and 128256: head-wide tiles) and tile settings ((outputs a program, BK,
warps, stages, outputs a sub-tile at most); None: the default), PDL on and off: rows 0, 5 and 16 of one call
over 17 (or 32) rows against each row computed alone, and the 17-row call repeated."""

from __future__ import annotations

import torch

from outpace.layers import fused_projection as fp
from outpace.layers.fused_rows_kernel import PLAIN
from outpace.layers.normed_rows import normed_rows

K = 4096
TILES = {
    "default": None,
    "sub32": (None, None, None, None, 32),
    "stages2": (None, None, None, 2, None),
    "bk128": (None, 128, None, None, None),
    "warps8": (None, None, 8, None, None),
    "warps1": (None, None, 1, None, None),
}


def plain(x, w, res, pdl, tiles):
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    return fp._launch(x, w, out, w.shape[0], PLAIN.value, residual=res, pdl=pdl, tiles=tiles)


def normed(x, w, res, pdl, tiles):
    """RMSNorm folded in (SCALE_ROWS), no residual."""
    rows = normed_rows(x, torch.ones(x.shape[1], dtype=x.dtype, device=x.device))
    return fp.norm_project(rows, 1e-5, w, pdl=pdl, tiles=tiles)


def main() -> None:
    torch.manual_seed(0)
    for n in (4096, 16384, 128256):
        w = (torch.randn(n, K, device="cuda") * K**-0.5).bfloat16()
        for rows in (17, 32):
            x = torch.randn(rows, K, device="cuda").bfloat16()
            res = torch.randn(rows, n, device="cuda").bfloat16()
            runs = [(plain, name, tiles) for name, tiles in TILES.items()]
            runs.append((normed, "normed", None))
            for fn, name, tiles in runs:
                for pdl in (True, False):
                    try:
                        full = fn(x, w, res, pdl, tiles)
                        again = fn(x, w, res, pdl, tiles)
                        verdict = []
                        for r in (0, 5, 16):
                            alone = fn(x[r : r + 1], w, res[r : r + 1], pdl, tiles)
                            diff = (alone[0].float() - full[r].float()).abs().max().item()
                            verdict.append(f"r{r}:{'eq' if diff == 0 else f'{diff:.1e}'}")
                        repeat = "eq" if torch.equal(full, again) else "NE"
                    except Exception as e:  # noqa: BLE001 (a tile setting the GPU refuses)
                        verdict, repeat = [type(e).__name__], "-"
                    print(
                        f"N={n:6} rows={rows:2} tiles={name:8} pdl={int(pdl)}  {' '.join(verdict)}  "
                        f"repeat {repeat}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
