"""The few-row kernels past one row tile: the 8B-shaped model's captured decode step (rows of the padding slot,
as ``bench.profile`` times it) at batches of 8 to 64 rows, with the fused kernels (layers/fused_projection.py)
taking at most ``FEW_ROWS`` rows outside batch-invariant mode (more: cuBLAS and the unfused chain), for each
limit given; 24 rows are what a verify of three tokens a sequence at batch 8 computes. Then one eager forward
over the same cache blocks at each batch, each limit's logits against the first limit's (the largest difference,
the greedy tokens that differ). Past 16 rows each 16-row tile is a program of its own (the batch-invariant
layout); gpu_2026-12-01j call 3 timed a program holding every row, code since removed.

    PYTHONPATH=. python3 benchmarks/scripts/fused_row_limit.py [--limits 16 32 64] [--batches 8 16 24 32 48 64]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from outpace.attention import forward_context, uniform_paged_metadata
from outpace.bench.gpu import build_8b
from outpace.bench.profile import _decode_key, _recapture_decode
from outpace.layers import fused_projection


def logits_by_limit(engine, batch: int, context: int, limits: list[int]) -> list[torch.Tensor]:
    """One eager forward of ``batch`` rows after ``context`` cached tokens each (the same cache blocks) at each
    limit -> logits [batch, vocab] each."""
    runner, pool = engine.runner, engine.pool
    ids = [f"limit-{batch}-{i}" for i in range(batch)]
    for rid in ids:
        pool.grow(rid, context + 1)
    try:
        tables = torch.tensor([pool.table(r) for r in ids], device="cuda")
        starts = torch.full((batch,), context, device="cuda")
        tokens = torch.arange(batch, device="cuda") * 37 + 11
        logits = []
        for limit in limits:
            fused_projection.FEW_ROWS = limit
            meta = uniform_paged_metadata(tables, starts, 1, pool.block_size)
            with torch.inference_mode(), forward_context(meta, runner.backend):
                hidden = engine.model(tokens, starts).hidden_states
                logits.append(engine.model.compute_logits(hidden).float())
        return logits
    finally:
        for rid in ids:
            pool.free(rid)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limits", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 24, 32, 48, 64])
    p.add_argument("--context", type=int, default=512)
    a = p.parse_args()
    shipped = fused_projection.FEW_ROWS
    with tempfile.TemporaryDirectory() as tmp:
        llm = build_8b(
            Path(tmp),
            max_context=a.context + 64,
            max_num_seqs=max(a.batches),
            cuda_graph_sizes=tuple(sorted(a.batches)),
        )
        engine = llm.engine
        ms = {}
        for limit in a.limits:
            fused_projection.FEW_ROWS = limit
            _recapture_decode(engine)
            for b in a.batches:
                key = _decode_key(engine, b)
                ms[limit, b] = min(1e3 * engine.runner.profile(key) for _ in range(3))
        logits = {b: logits_by_limit(engine, b, a.context, a.limits) for b in a.batches}
        fused_projection.FEW_ROWS = shipped
    print("captured decode step, ms (rows of the padding slot):")
    print(f"{'rows':>6} " + " ".join(f"{'<= ' + str(limit):>10}" for limit in a.limits))
    for b in a.batches:
        print(f"{b:>6} " + " ".join(f"{ms[limit, b]:>10.4f}" for limit in a.limits))
    print(
        f"eager forward at context {a.context}, against FEW_ROWS = {a.limits[0]}: max |logit diff|, greedy "
        "tokens differing"
    )
    for i, limit in enumerate(a.limits[1:], 1):
        for b in a.batches:
            ref, got = logits[b][0], logits[b][i]
            diff = (got - ref).abs().max().item()
            flips = int((got.argmax(-1) != ref.argmax(-1)).sum())
            print(
                f"  <= {limit:<3} batch {b:>3}: {diff:.4f}, {flips} of {b} (logits up to "
                f"{ref.abs().max().item():.2f})"
            )


if __name__ == "__main__":
    main()
