"""Gated DeltaNet's step kernel (layers/deltanet_step_kernel.py) at Qwen3.5's linear-attention shape (16 key
heads, 32 value heads, dims 128; hidden 2048), bf16 on one GPU: one layer's forward (projections included, the
same in every setting) replayed from a CUDA graph, for each value-column split count and warp count forced,
at batch 1, 2, 4 and runs of 1 (decode), 2, 3 and 4 tokens a sequence (verify), and the layer's torch path
(``fused_step`` off) beside them. A setting's difference from another is the step kernel's. What the shipped
heuristics (``value_splits``, ``num_warps``) pick is marked with a star.

    PYTHONPATH=. python3 benchmarks/scripts/deltanet_step_settings.py [OUT.json]"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from outpace.attention import build_paged_metadata, forward_context
from outpace.layers import deltanet_step_kernel as dk
from outpace.layers.gated_deltanet import GatedDeltaNet
from outpace.layers.recurrent import RecurrentMetadata
from outpace.layers.sm_count import num_sms

HIDDEN = 2048
SHAPE = dict(
    num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128
)  # Qwen3.5's config.json
BATCHES = (1, 2, 4)
LENGTHS = (1, 2, 3, 4)
SPLITS = (1, 2, 4, 8)
WARPS = (1, 2, 4)
SNAPSHOT_ROWS = 8


def make_layer() -> GatedDeltaNet:
    torch.manual_seed(0)
    layer = GatedDeltaNet(
        HIDDEN, conv_width=4, eps=1e-6, activation="silu", packed_by_key_head=False, **SHAPE
    )
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * (p.shape[1] ** -0.5 if p.dim() == 2 else 0.5))
    return layer.to("cuda", torch.bfloat16)


def time_us(layer: GatedDeltaNet, batch: int, length: int) -> float:
    """One forward over ``batch`` runs of ``length`` tokens (snapshots kept: a verify; length 1: the
    engine's decode), replayed from a CUDA graph: us a replay."""
    x = torch.randn(batch * length, HIDDEN, device="cuda", dtype=torch.bfloat16)
    meta = build_paged_metadata(
        [[i] for i in range(batch)], [0] * batch, [length] * batch, 16, "cuda"
    )
    meta.token_table()
    recurrent = RecurrentMetadata(
        torch.arange(batch, device="cuda"),
        torch.ones(batch, dtype=torch.bool, device="cuda"),
        None,
        True,
    )
    states, snapshots = {}, {}
    for name, (shape, declared) in layer.state_shapes().items():
        kind = dict(dtype=declared or torch.bfloat16, device="cuda")
        states[name] = torch.randn(batch, *shape, **kind) * 0.1
        snapshots[name] = torch.zeros(batch, SNAPSHOT_ROWS, *shape, **kind)
    layer.bind_state(states, snapshots)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), forward_context(meta, recurrent=recurrent):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            layer(x)  # compiled (and the arrival counters made) outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            layer(x)
    for _ in range(5):
        graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        begin.record()
        for _ in range(50):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, begin.elapsed_time(end) / 50 * 1e3)
    return best


def main(out: str | None = None) -> None:
    layer = make_layer()
    shipped_splits, shipped_warps = dk.value_splits, dk.num_warps
    sms = num_sms(torch.device("cuda"))
    rows = []
    layer.fused_step = False
    for batch in BATCHES:
        times = [time_us(layer, batch, n) for n in LENGTHS]
        rows.append(dict(batch=batch, splits=None, warps=None, us=times, shipped=False))
        print(f"b{batch} torch path          " + " ".join(f"{t:7.1f}" for t in times), flush=True)
    layer.fused_step = True
    try:
        for batch, splits, warps in itertools.product(BATCHES, SPLITS, WARPS):
            dk.value_splits = lambda *a, s=splits: s
            dk.num_warps = lambda bk, bv, w=warps: w
            shipped = (
                shipped_splits(batch, 32, 128, sms) == splits
                and shipped_warps(128, 128 // splits) == warps
            )
            try:
                times = [time_us(layer, batch, n) for n in LENGTHS]
            except Exception as e:  # noqa: BLE001 (registers, shared memory)
                print(f"batch {batch} splits {splits} warps {warps}: {type(e).__name__}: {e}"[:200])
                continue
            rows.append(dict(batch=batch, splits=splits, warps=warps, us=times, shipped=shipped))
            cells = " ".join(f"{t:7.1f}" for t in times)
            print(
                f"b{batch} splits {splits} warps {warps}{' *' if shipped else '  '} {cells}",
                flush=True,
            )
    finally:
        dk.value_splits, dk.num_warps = shipped_splits, shipped_warps
    if out:
        Path(out).write_text(json.dumps(dict(lengths=LENGTHS, rows=rows), indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
