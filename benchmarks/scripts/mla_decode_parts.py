"""The absorbed MLA's two decode kernels alone (attention/mla_kernels.py ``mla_attention_up``: ``_mla_kernel``, then
``_combine_kernel`` merging the splits through W_UV) under the module's launch settings: DeepSeek-V2-Lite's shape (16
heads) and DeepSeek-V3's (128), kv_lora_rank 512, rope 64, v_head_dim 128, bf16, at batch 1 and 8 of one new token
over 512 cached rows, in block tables as wide as an engine's (4096 rows: the split count follows the width).

Each setting's output is checked against the shipped launch's first (else skipped, as a launch that does not
compile is); then LAYERS calls on distinct caches, queries and W_UV (a decode step's layers: more than L2 holds)
captured in one CUDA graph, its replay timed by triton.testing.do_bench (median; us per call = replay / LAYERS),
and a few replays under torch.profiler: each kernel's GPU us a call and the mean gap between one kernel's end and
the next one's start. A setting whose launch (tiles, stages, warps, splits, merge tiles) equals one already timed
is skipped (V3's 32-row tiles run 8 warps whatever ``attention_warps``: its warps sweep adds nothing). Prints a
line a (shape, batch, setting); writes every row to OUT/mla_decode_parts.json.

    PYTHONPATH=. python3 benchmarks/scripts/mla_decode_parts.py OUT [--sweep split tile ...] [--batches 1 8 ...]"""

from __future__ import annotations

import argparse
import json
import math
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from outpace.attention import PagedAttentionMetadata, uniform_paged_metadata
from outpace.attention import mla_kernels as mla
from outpace.bench.profile import _cuda_events

# shape -> heads; both DeepSeek shapes have R 512, P 64 and 128 nope and v dims a head
SHAPES = {"v2-lite": 16, "v3": 128}
R, P, NOPE, V = 512, 64, 128, 128
SCALE = (NOPE + P) ** -0.5
BATCHES = (1, 8)
CACHED = 512  # cached rows a sequence, before its new token
BLOCK_SIZE = 16  # EngineConfig.block_size's default
CAPACITY = 4096  # block-table rows a sequence
LAYERS = 27  # DeepSeek-V2-Lite's
REPLAYS = 3  # profiled
KNOBS = (
    "min_split_rows",
    "half_block_n",
    "attention_stages",
    "attention_warps",
    "combine_programs_per_sm",
    "combine_block_tokens",
)
SWEEPS = {
    "split": [{"min_split_rows": n} for n in (32, 64, 128, 256, 512)],
    "tile": [{"half_block_n": n, "attention_stages": s} for n in (16, 32, 64) for s in (1, 2, 3)],
    "warps": [{"half_block_n": n, "attention_warps": w} for n in (32, 64) for w in (2, 4, 8)],
    "combine": [
        {"combine_programs_per_sm": p, "combine_block_tokens": t} for p in (1, 2, 4) for t in (1, 2)
    ],
    # the merge's tokens a program (W_UV read once a program: once a head at the batch's power of two)
    "combine_tokens": [{"combine_block_tokens": t} for t in (2, 4, 8, 16)],
}


@contextmanager
def knobs(setting: dict):
    """The module's launch settings set to ``setting`` (name -> value) for the block, then as they were."""
    shipped = {name: getattr(mla, name) for name in setting}
    try:
        for name, value in setting.items():
            setattr(mla, name, value)
        yield
    finally:
        for name, value in shipped.items():
            setattr(mla, name, value)


def build_meta(batch: int, device: torch.device) -> tuple[PagedAttentionMetadata, int]:
    """(the decode step's metadata, cache blocks): ``batch`` sequences of CACHED rows bringing one token each, in
    shuffled blocks (block 0 the padding) of block tables CAPACITY rows wide, as the engine builds it."""
    per_seq = math.ceil((CACHED + 1) / BLOCK_SIZE)
    tables = torch.zeros(batch, CAPACITY // BLOCK_SIZE, dtype=torch.int64)  # [batch, max_blocks]
    tables[:, :per_seq] = 1 + torch.randperm(batch * per_seq).view(batch, per_seq)
    starts = torch.full((batch,), CACHED, dtype=torch.int64)  # [batch]
    meta = uniform_paged_metadata(tables.to(device), starts.to(device), 1, BLOCK_SIZE)
    return meta, 1 + batch * per_seq


def build_layer(heads: int, batch: int, num_blocks: int, dtype: torch.dtype, device: torch.device):
    """One layer's (q_parts [1, batch, heads, R], q_rope [batch, heads, P], cache [num_blocks, BLOCK_SIZE, 1,
    R + P], up [heads, V, R]): W_UV a view of kv_b_proj's weight, as layers/mla.py ``up_weights`` gives it. One
    query part: V2-Lite's absorption writes the latent whole, and V3's ``q_parts`` is 1 at 128 heads."""
    kv_b = torch.randn(heads, NOPE + V, R, device=device) * R**-0.5  # [heads, nope + v, R]
    return (
        torch.randn(1, batch, heads, R, device=device).to(dtype),
        torch.randn(batch, heads, P, device=device).to(dtype),
        torch.randn(num_blocks, BLOCK_SIZE, 1, R + P, device=device).to(dtype),
        kv_b.to(dtype)[:, NOPE:],
    )


def attend(layer: tuple, meta: PagedAttentionMetadata) -> torch.Tensor:
    q_parts, q_rope, cache, up = layer
    return mla.mla_attention_up(q_parts, q_rope, cache, meta, SCALE, up)  # [batch, heads, V]


def launch(heads: int, meta: PagedAttentionMetadata) -> dict:
    """The half-precision launch ``_attend`` and ``_combine_launch`` choose under the settings now: tiles, warps,
    stages, least split rows, splits launched and those a sequence runs (``_split_len``), the merge's tiles."""
    device = meta.block_tables.device
    block_m = mla.tile_rows(meta.max_query_len, heads, fp32=False)
    tiles = math.ceil(meta.max_query_len * heads / block_m)
    wide = meta.num_seqs * tiles <= mla.wide_tile_programs
    block_n = mla.half_block_n if wide else 32
    capacity = meta.block_tables.shape[1] * meta.block_size
    splits = mla.kv_splits(meta.num_seqs * tiles, capacity, block_n, device)
    min_split = max(block_n, mla.min_split_rows // block_n * block_n)
    seq_len = CACHED + 1
    split_len = max(math.ceil(math.ceil(seq_len / splits) / block_n) * block_n, min_split)
    block_t, chunk = mla._combine_launch(meta.num_seqs, heads, V, splits, False, device)
    return {
        "block_m": block_m,
        "block_n": block_n,
        "warps": 8 if block_m > 16 else (mla.attention_warps if wide else 4),
        "stages": mla.attention_stages,
        "min_split": min_split,
        "splits": splits,
        "splits_run": math.ceil(seq_len / split_len),
        "combine_block_t": block_t,
        "combine_chunk": chunk,
    }


def kernel_times(graph: torch.cuda.CUDAGraph) -> dict:
    """GPU us a call of each kernel, and the mean gap (us) between kernels, over REPLAYS profiled replays."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    events = _cuda_events(prof)
    per = len(events) // REPLAYS
    replays = [events[i * per : (i + 1) * per] for i in range(REPLAYS)]
    gaps = [b.time_range.start - a.time_range.end for r in replays for a, b in zip(r, r[1:])]
    times = {"gap_us": sum(gaps) / len(gaps)}
    for key, name in (("mla_us", "_mla_kernel"), ("combine_us", "_combine_kernel")):
        spans = [e.time_range.end - e.time_range.start for e in events if name in e.name]
        times[key] = sum(spans) / len(spans)
    return times


def measure(layers: list, meta: PagedAttentionMetadata, expected: torch.Tensor) -> dict:
    """One call checked against ``expected`` [batch, heads, V], then the LAYERS calls' graph timed."""
    got = attend(layers[0], meta)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            attend(layer, meta)
    graph.replay()
    us = do_bench(graph.replay, return_mode="median") * 1e3 / len(layers)
    return {"us": us, **kernel_times(graph)}


def label(setting: dict) -> str:
    return " ".join(f"{name}={value}" for name, value in setting.items()) or "shipped"


def sweep_shape(shape: str, batch: int, settings: list[dict], device: torch.device) -> list[dict]:
    """The rows of ``settings`` (the shipped launch first) at one shape and batch."""
    heads = SHAPES[shape]
    meta, num_blocks = build_meta(batch, device)
    layers = [build_layer(heads, batch, num_blocks, torch.bfloat16, device) for _ in range(LAYERS)]
    expected = attend(layers[0], meta)
    rows, timed = [], {}
    for setting in [{}, *settings]:
        head = f"{shape:8s} b{batch} {label(setting):52s}"
        try:
            with knobs(setting):
                geometry = launch(heads, meta)
                values = {name: getattr(mla, name) for name in KNOBS}
                key = json.dumps(geometry)
                if key in timed:
                    print(f"{head} the launch of {timed[key]}: skipped", flush=True)
                    continue
                row = measure(layers, meta, expected)
        except Exception as e:  # noqa: BLE001 (a launch that does not compile or computes wrongly)
            print(f"{head} {type(e).__name__}: {str(e).strip().splitlines()[0][:100]}", flush=True)
            continue
        timed[key] = label(setting)
        rows.append(
            {"shape": shape, "batch": batch, "setting": label(setting), **values, **geometry, **row}
        )
        print(
            f"{head} {row['us']:7.2f} us/call  mla {row['mla_us']:6.2f}  combine {row['combine_us']:6.2f}  "
            f"gap {row['gap_us']:5.2f}  BLOCK_N {geometry['block_n']:2d}  "
            f"splits {geometry['splits_run']}/{geometry['splits']}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sweep", nargs="+", choices=list(SWEEPS), default=list(SWEEPS))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    device = torch.device("cuda")
    settings = [setting for name in args.sweep for setting in SWEEPS[name]]
    rows = []
    for shape in SHAPES:
        for batch in args.batches:
            rows += sweep_shape(shape, batch, settings, device)
            report = {"device": torch.cuda.get_device_name(), "layers": LAYERS, "rows": rows}
            (args.out / "mla_decode_parts.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
