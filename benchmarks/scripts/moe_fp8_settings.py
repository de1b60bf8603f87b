"""The grouped experts' gate/up and down kernels (layers/moe_kernels.py) over block-FP8 expert stacks at a few
tokens, on one GPU, for candidate tiles (``few_token_gate_up`` / ``few_token_down``: BLOCK_N, BLOCK_K,
warps, stages): each kernel's microseconds a call and TB/s of the distinct experts' bytes (fp8 weights and
their scales) at 1, 2, 4 and 8 tokens, at
- Step-3.5-Flash's stacks (288 experts, hidden 4096, intermediate 1280, top 8; gate, up and down stacks of
  their own: layers/quant/experts.py ``run_quantized_stacks``' launch), and the same at expert parallelism 2
  (rank 0's 144 experts, 4 of each token's 8 slots another rank's: ids -1, skipped);
- DeepSeek-V2-Lite's (64 experts, hidden 2048, intermediate 1408, top 6, gate and up packed) with its shared
  MLP of two experts' width as 2 shared slots (``QuantizedExpertStacks.run``' launch).
A setting pairs a gate/up candidate with a down candidate: the kernels read different weights, so one call
times both. A call is one of LAYERS calls on distinct layers' random stacks (random routing each, distinct
experts a token, the block layout written before capture) captured in one CUDA graph, so its weights come
from memory, not L2 (a call reads 60-130 MB at one token); a kernel's time is its CUDA time in torch.profiler
over REPLAYS replays, per call. Every setting's output is checked against the shipped setting's first. The
floor is the kernel's bytes over 4.8 TB/s; the shipped setting is starred. No swiglu clamp (Step-3.5's
limits change no load).

    PYTHONPATH=. python3 benchmarks/scripts/moe_fp8_settings.py OUT_DIR [--shapes NAME ...] [--tokens N ...]

writes OUT_DIR/moe_fp8_settings.json."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import torch
import triton

from outpace.layers import moe_kernels as mk
from outpace.layers.expert_blocks import align
from outpace.layers.grouped_experts import grouped_experts
from outpace.layers.quant.experts import QuantizedShared, slot_views
from outpace.layers.quant.moe_quant_kernels import ExpertScales, fp8_block_grouped_experts

BLOCK = (128, 128)  # the checkpoints' scale blocks
BANDWIDTH = 4.8e12  # the H200's HBM3e, bytes/s
DEVICE, DTYPE = "cuda", torch.bfloat16
LAYERS = 4
REPLAYS = 20
TOKENS = (1, 2, 4, 8)
KERNELS = ("expert_gate_up_kernel", "expert_down_kernel")
# (gate/up tiles, down tiles), each (BLOCK_N, BLOCK_K, warps, stages); the shipped pair first
SETTINGS = [
    (mk.few_token_gate_up, mk.few_token_down),
    ((32, 256, 4, 3), (64, 256, 4, 3)),  # two scale columns a K step (weight_tile)
    ((32, 256, 4, 4), (64, 256, 4, 4)),
    ((64, 256, 4, 3), (64, 256, 4, 3)),
    ((32, 512, 4, 3), (32, 512, 4, 3)),
    ((32, 128, 4, 6), (64, 128, 4, 6)),
    ((64, 128, 4, 4), (128, 128, 4, 4)),
]


@dataclass(frozen=True)
class Shape:
    experts: int  # the model's routed experts
    top_k: int
    shared: int  # shared slots: a shared MLP of that many experts' width
    hidden: int
    inter: int
    # expert parallelism: rank 0 holds experts / ranks of the experts and of each token's slots
    ranks: int = 1
    # gate, up and down stacks of their own (Step-3.5-Flash-FP8's); else gate and up packed (per-expert layout)
    stacked: bool = False

    @property
    def local_experts(self) -> int:
        return self.experts // self.ranks

    @property
    def local_slots(self) -> int:
        return self.top_k // self.ranks


SHAPES = {
    "step-3.5-flash": Shape(288, 8, 0, 4096, 1280, stacked=True),
    "step-3.5-flash-ep2": Shape(288, 8, 0, 4096, 1280, ranks=2, stacked=True),
    "deepseek-v2-lite": Shape(64, 6, 2, 2048, 1408),
}


def random_fp8(shape: tuple[int, ...], gen: torch.Generator, device) -> torch.Tensor:
    """Random e4m3 bytes, the NaN codes (0x7f, 0xff) made zeros."""
    bits = torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=gen)
    return bits.masked_fill_((bits & 0x7F) == 0x7F, 0).view(torch.float8_e4m3fn)


def _scales(
    rows: int, cols: int, experts: int | None, gen: torch.Generator, device
) -> torch.Tensor:
    """float32 scales of a [rows, cols] weight's BLOCK blocks (of ``experts`` of them: [experts, ., .])."""
    shape = (math.ceil(rows / BLOCK[0]), math.ceil(cols / BLOCK[1]))
    shape = shape if experts is None else (experts, *shape)
    return torch.rand(shape, generator=gen, device=device) * 1e-2 + 1e-3


def make_layer(shape: Shape, gen: torch.Generator, device) -> dict:
    """One layer's random block-FP8 experts of rank 0 as the shape's launch takes them."""
    e, h, i = shape.local_experts, shape.hidden, shape.inter
    if shape.stacked:
        gate_s, up_s = _scales(i, h, e, gen, device), _scales(i, h, e, gen, device)
        return dict(
            gate=random_fp8((e, i, h), gen, device),
            up=random_fp8((e, i, h), gen, device),
            down=random_fp8((e, h, i), gen, device),
            scales=ExpertScales("fp8_block", BLOCK, gate_s, up_s, _scales(h, i, e, gen, device)),
        )
    layer = dict(
        gate_up=random_fp8((e, 2 * i, h), gen, device),
        gate_up_scale=_scales(2 * i, h, e, gen, device),
        down=random_fp8((e, h, i), gen, device),
        down_scale=_scales(h, i, e, gen, device),
        shared=None,
    )
    if shape.shared:  # the shared MLP's own tensors, seen as its slots (layers/quant/experts.py)
        width = shape.shared * i
        mlp_in = [random_fp8((width, h), gen, device) for _ in range(2)]
        mlp_in_s = [_scales(width, h, None, gen, device) for _ in range(2)]
        (gate, up), down = slot_views(mlp_in, random_fp8((h, width), gen, device), shape.shared)
        (gate_s, up_s), down_s = slot_views(
            mlp_in_s, _scales(h, width, None, gen, device), shape.shared
        )
        layer["shared"] = QuantizedShared((gate, up, down), (gate_s, up_s, down_s))
    return layer


def make_routing(shape: Shape, tokens: int, gen: torch.Generator, device):
    """(weights [tokens, top_k] float32, ids [tokens, top_k] int32, block layout): local_slots distinct experts
    of rank 0 a token, its other slots -1 (another rank's experts)."""
    ids = torch.full((tokens, shape.top_k), -1, dtype=torch.int32)
    for t in range(tokens):
        ids[t, : shape.local_slots] = torch.randperm(shape.local_experts, generator=gen)[
            : shape.local_slots
        ]
    weights = torch.rand(tokens, shape.top_k, generator=gen).to(device)
    ids = ids.to(device)
    return weights, ids, align(ids, shape.local_experts, shape.shared)


def run(shape: Shape, layer: dict, x: torch.Tensor, routing, tiles) -> torch.Tensor:
    """The layer's experts over x [tokens, hidden] at ``tiles`` ((gate/up, down); None: the shipped), in the
    layout's 16-row blocks at every count (one row a block off: moe_kernels.py ONE-ROW and PAIRS APART)."""
    weights, ids, layout = routing
    skipped = shape.ranks > 1
    with patch.object(mk, "one_token_cuda_cores", False):
        if shape.stacked:
            return grouped_experts(
                x, weights, ids, layer["gate"], layer["up"], layer["down"], tiles=tiles, layout=layout,
                skipped_slots=skipped, quant=layer["scales"],
            )  # fmt: skip
        return fp8_block_grouped_experts(
            x, weights, ids, layer["gate_up"], layer["gate_up_scale"], layer["down"],
            layer["down_scale"], layout=layout, skipped_slots=skipped, shared=layer["shared"],
            tiles=tiles,
        )  # fmt: skip


def distinct_bytes(shape: Shape, ids: torch.Tensor) -> tuple[int, int, int]:
    """(experts read, gate/up bytes, down bytes) of a call: its distinct routed experts and the shared slots,
    fp8 weights and float32 scales."""
    experts = int(ids[ids >= 0].unique().numel()) + shape.shared
    h, i = shape.hidden, shape.inter
    blocks = math.ceil(h / BLOCK[0]) * math.ceil(i / BLOCK[1])
    return experts, experts * (2 * h * i + 2 * 4 * blocks), experts * (h * i + 4 * blocks)


def kernel_times(graphs: list[torch.cuda.CUDAGraph]) -> list[dict[str, float]]:
    """Each graph's ``KERNELS``' CUDA time a call (us): REPLAYS replays of each under torch.profiler, a
    graph's LAYERS launches of a kernel a replay, in launch order."""
    from torch.profiler import ProfilerActivity, profile

    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for graph in graphs:
            for _ in range(REPLAYS):
                graph.replay()
        torch.cuda.synchronize()
    cuda = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_graph = REPLAYS * LAYERS
    times = [{} for _ in graphs]
    for name in KERNELS:
        runs = sorted((e.time_range for e in cuda if e.name == name), key=lambda r: r.start)
        if len(runs) != len(graphs) * per_graph:
            raise RuntimeError(
                f"{len(runs)} {name} launches profiled, not {len(graphs) * per_graph}"
            )
        for g, graph_times in enumerate(times):
            mine = runs[g * per_graph : (g + 1) * per_graph]
            graph_times[name] = sum(r.end - r.start for r in mine) / per_graph
    return times


def sweep_point(shape: Shape, layers: list[dict], tokens: int, seed: int) -> dict:
    """Every setting at ``tokens`` tokens over ``layers`` (module docstring): a row of the JSON."""
    gen = torch.Generator().manual_seed(seed)
    routings = [make_routing(shape, tokens, gen, DEVICE) for _ in layers]
    x = (torch.randn(tokens, shape.hidden, generator=gen) * 0.1).to(DEVICE, DTYPE)
    counts = [distinct_bytes(shape, r[1]) for r in routings]
    experts, up_bytes, down_bytes = (sum(c[j] for c in counts) / len(counts) for j in range(3))
    reference = run(shape, layers[0], x, routings[0], SETTINGS[0]).float()
    measured, graphs = [], []
    for tiles in SETTINGS:
        try:
            err = ((run(shape, layers[0], x, routings[0], tiles).float() - reference).norm()
                   / reference.norm()).item()  # fmt: skip
            if not err < 1e-2:
                print(f"  {tiles}: wrong (relative error {err:.3g})", flush=True)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for layer, routing in zip(layers, routings):
                    run(shape, layer, x, routing, tiles)
        except Exception as e:  # noqa: BLE001 (a tile beyond the shared memory or the registers)
            print(f"  {tiles}: {type(e).__name__}: {e}"[:200], flush=True)
            continue
        measured.append((tiles, err))
        graphs.append(graph)
    settings = []
    for (tiles, err), us in zip(measured, kernel_times(graphs)):
        up_us, down_us = us["expert_gate_up_kernel"], us["expert_down_kernel"]
        settings.append(
            dict(
                gate_up=tiles[0], down=tiles[1], shipped=tiles == SETTINGS[0], error=err,
                gate_up_us=up_us, down_us=down_us,
                gate_up_tb_s=up_bytes / up_us / 1e6, down_tb_s=down_bytes / down_us / 1e6,
            )
        )  # fmt: skip
    return dict(
        tokens=tokens, experts_read=experts, gate_up_bytes=up_bytes, down_bytes=down_bytes,
        gate_up_floor_us=up_bytes / BANDWIDTH * 1e6, down_floor_us=down_bytes / BANDWIDTH * 1e6,
        settings=settings,
    )  # fmt: skip


def print_point(name: str, point: dict) -> None:
    print(
        f"{name} tokens {point['tokens']}: {point['experts_read']:.1f} experts a call, floor gate/up "
        f"{point['gate_up_floor_us']:.1f} us, down {point['down_floor_us']:.1f} us",
        flush=True,
    )
    for s in point["settings"]:
        star = "*" if s["shipped"] else " "
        print(
            f"  {star} gate/up {str(tuple(s['gate_up'])):18} {s['gate_up_us']:7.1f} us "
            f"{s['gate_up_tb_s']:5.2f} TB/s | down {str(tuple(s['down'])):18} {s['down_us']:7.1f} us "
            f"{s['down_tb_s']:5.2f} TB/s",
            flush=True,
        )


def print_best(rows: list[dict], tokens: list[int]) -> None:
    """Each shape's fastest tiles of each kernel over the token counts together, beside the shipped ones."""
    for name in dict.fromkeys(r["shape"] for r in rows):
        for kernel in ("gate_up", "down"):
            times: dict[tuple, list[float]] = {}
            for row in rows:
                for s in row["settings"] if row["shape"] == name else ():
                    times.setdefault(tuple(s[kernel]), []).append(s[f"{kernel}_us"])
            totals = {t: sum(us) for t, us in times.items() if len(us) == len(tokens)}
            if not totals:
                continue
            best, shipped = min(totals, key=totals.get), tuple(SETTINGS[0][kernel == "down"])
            print(
                f"{name} {kernel}: best {best} {totals[best]:.1f} us over {tokens} tokens, shipped "
                f"{shipped} {totals.get(shipped, float('nan')):.1f} us",
                flush=True,
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="the block-FP8 grouped experts' tiles timed at a few tokens (module docstring)"
    )
    ap.add_argument("out", type=Path, help="directory for moe_fp8_settings.json")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    rows = []
    with torch.inference_mode():
        for name in args.shapes:
            shape = SHAPES[name]
            gen = torch.Generator(DEVICE).manual_seed(0)
            layers = [make_layer(shape, gen, DEVICE) for _ in range(LAYERS)]
            for tokens in args.tokens:
                point = sweep_point(shape, layers, tokens, seed=tokens)
                print_point(name, point)
                rows.append(dict(shape=name, **point))
            del layers
            torch.cuda.empty_cache()
    result = dict(
        device=torch.cuda.get_device_name(), triton=triton.__version__,
        layers=LAYERS, replays=REPLAYS, bandwidth=BANDWIDTH, rows=rows,
    )  # fmt: skip
    (args.out / "moe_fp8_settings.json").write_text(json.dumps(result, indent=1))
    print_best(rows, args.tokens)
    print(f"{time.perf_counter() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
