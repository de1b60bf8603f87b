"""For GPU tests of the few-row fused paths in float32 (they serve half precision): let them take float32 rows, and
count the decode steps that ran the fused residual stack (layers/fused_decoder.py ``run_fused_layers``)."""

from __future__ import annotations

import torch


def take_the_fused_path_in_fp32(monkeypatch) -> list:
    """Patches the fused projections to serve up to 16 float32 rows on the GPU; -> a list that gains an entry at
    each ``run_fused_layers`` call."""
    from outpace.layers import fused_decoder, fused_projection

    serves = fused_projection.fused_rows_apply
    monkeypatch.setattr(
        fused_projection,
        "fused_rows_apply",
        lambda x, w: (
            serves(x, w)
            or (
                x.is_cuda
                and x.dim() == 2
                and x.shape[0] <= 16
                and x.dtype == w.dtype == torch.float32
                and w.is_contiguous()
                and not torch.is_grad_enabled()
            )
        ),
    )
    fused, run = [], fused_decoder.run_fused_layers
    monkeypatch.setattr(
        fused_decoder, "run_fused_layers", lambda *a, **kw: fused.append(1) or run(*a, **kw)
    )
    return fused
