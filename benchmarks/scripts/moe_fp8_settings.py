"""The grouped experts' kernels (layers/moe_kernels.py) at a few tokens on one GPU, in one of two studies:

- ``splits`` (the default): the planned split-K (``plan_splits``: module docstring, Split-K) against no split,
  forced as splits (1, 1), and any ``--splits`` pairs, over block-FP8 and bf16 stacks at 1, 2, 4, 8 and 16
  tokens: each kernel's microseconds a call, the call's (the three kernels of a graph replay over CUDA events),
  and the share of the floor, the distinct chosen experts' bytes over 4.8 TB/s, that the call reaches;
- ``tiles``: candidate tiles of the gate/up and down kernels (``few_token_gate_up`` / ``few_token_down``:
  BLOCK_N, BLOCK_K, warps, stages) over block-FP8 stacks at 1, 2, 4 and 8 tokens, each kernel's time and TB/s.

The shapes: Step-3.5-Flash's stacks (288 experts, hidden 4096, intermediate 1280, top 8; gate, up and down
stacks of their own: layers/quant/experts.py ``run_quantized_stacks``' launch), the same at expert
parallelism 2 (rank 0's 144 experts, 4 of each token's 8 slots another rank's: ids -1, skipped), the same with
its shared expert fused as a shared slot (the splits study's), and DeepSeek-V2-Lite's (64 experts, hidden 2048,
intermediate 1408, top 6, gate and up packed) with its shared MLP of two experts' width as 2 shared slots
(``QuantizedExpertStacks.run``' launch). Each launch is ``grouped_experts``' with the stacks and scales those
launches pass. A call is one of LAYERS calls on distinct layers' random stacks (random routing each, distinct
experts a token, the block layout written before capture) captured in one CUDA graph, so its weights come from
memory, not L2 (a call reads 60-130 MB at one token); a kernel's time is its CUDA time in torch.profiler over
REPLAYS replays, per call. Every setting's output is checked against the first setting's. The floor counts the
weights (fp8 bytes and float32 scales, or bf16) of the distinct experts; no swiglu clamp (Step-3.5's limits
change no load).

    PYTHONPATH=. python benchmarks/scripts/moe_fp8_settings.py --out DIR [--study splits|tiles]
        [--shapes NAME ...] [--tokens N ...] [--dtypes fp8 bf16] [--splits U,D ...]

writes DIR/moe_fp8_settings.json (the tiles study) or DIR/moe_splits.json (the splits study)."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from outpace.layers import moe_kernels as mk
from outpace.layers.quant.experts import slot_views
from outpace.layers.quant.moe_quant_kernels import ExpertScales

BLOCK = (128, 128)  # the checkpoints' scale blocks
BANDWIDTH = 4.8e12  # the H200's HBM3e, bytes/s
DEVICE = "cuda"
LAYERS = 4
REPLAYS = 20
TOKENS = {"splits": (1, 2, 4, 8, 16), "tiles": (1, 2, 4, 8)}
KERNELS = ("_gate_up_kernel", "_down_kernel", "_combine_kernel")
# (gate/up tiles, down tiles), each (BLOCK_N, BLOCK_K, warps, stages); the shipped pair first
SETTINGS = [
    (mk.few_token_gate_up, mk.few_token_down),
    ((32, 128, 4, 8), (64, 128, 4, 8)),  # twice the stages (bf16's bytes in flight)
    ((32, 128, 4, 6), (64, 128, 4, 6)),
    ((16, 128, 4, 8), (32, 128, 4, 8)),
    ((16, 128, 4, 12), (16, 128, 4, 12)),
    ((64, 128, 4, 4), (128, 128, 4, 4)),
    ((64, 128, 4, 6), (128, 128, 4, 6)),
    ((32, 64, 4, 8), (64, 64, 4, 8)),
    ((32, 128, 2, 8), (64, 128, 8, 8)),
]
UNSPLIT = (1, 1)


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
    "step-3.5-flash-shared": Shape(288, 8, 1, 4096, 1280, stacked=True),
    "deepseek-v2-lite": Shape(64, 6, 2, 2048, 1408),
}
STUDY_SHAPES = {
    "splits": ["deepseek-v2-lite", "step-3.5-flash-shared"],
    "tiles": ["step-3.5-flash", "step-3.5-flash-ep2", "deepseek-v2-lite"],
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


def make_layer(shape: Shape, gen: torch.Generator, device, fp8: bool = True) -> dict:
    """One layer's random experts of rank 0 as the shape's launch takes them: ``grouped_experts``' gate, up,
    down, shared (views of a shared MLP's own tensors) and quant (block FP8; None: bf16)."""
    e, h, i = shape.local_experts, shape.hidden, shape.inter

    def weight(*size: int) -> torch.Tensor:
        if fp8:
            return random_fp8(size, gen, device)
        return torch.randn(size, generator=gen, device=device, dtype=torch.bfloat16) * 0.02

    def scales(rows: int, cols: int, experts: int | None = e) -> torch.Tensor | None:
        return _scales(rows, cols, experts, gen, device) if fp8 else None

    if shape.stacked:
        gate, up, down = weight(e, i, h), weight(e, i, h), weight(e, h, i)
        gate_s, up_s, down_s = scales(i, h), scales(i, h), scales(h, i)
    else:  # one [2i, h] gate/up weight an expert, its scale rows the gate's then up's
        gate_up, gate_up_s = weight(e, 2 * i, h), scales(2 * i, h)
        gate, up = gate_up[:, :i], gate_up[:, i:]
        if fp8:
            gate_s, up_s = gate_up_s[:, : i // BLOCK[0]], gate_up_s[:, i // BLOCK[0] :]
        else:
            gate_s = up_s = None
        down, down_s = weight(e, h, i), scales(h, i)
    layer = dict(gate=gate, up=up, down=down, shared=None, quant=None)
    shared_scales = None
    if shape.shared:  # the shared MLP's own tensors, seen as its slots (layers/quant/experts.py)
        width = shape.shared * i
        ins, out = slot_views([weight(width, h), weight(width, h)], weight(h, width), shape.shared)
        layer["shared"] = (*ins, out)
        if fp8:
            ins, out = slot_views(
                [scales(width, h, None), scales(width, h, None)],
                scales(h, width, None),
                shape.shared,
            )
            shared_scales = (*ins, out)
    if fp8:
        layer["quant"] = ExpertScales("fp8_block", BLOCK, gate_s, up_s, down_s, shared_scales)
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
    return weights, ids, mk.align(ids, shape.local_experts, shape.shared)


def run(
    shape: Shape,
    layer: dict,
    x: torch.Tensor,
    routing,
    tiles=None,
    splits: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The layer's experts over x [tokens, hidden] at ``tiles`` ((gate/up, down); None: the shipped) and
    ``splits`` (None: the planned)."""
    weights, ids, layout = routing
    return mk.grouped_experts(
        x, weights, ids, layer["gate"], layer["up"], layer["down"], tiles=tiles, shared=layer["shared"],
        layout=layout, skipped_slots=shape.ranks > 1, quant=layer["quant"], splits=splits,
    )  # fmt: skip


def planned_splits(shape: Shape, layer: dict, routing) -> tuple[int, int]:
    """The (gate/up, down) split counts ``plan_splits`` gives the shipped tiles' launch."""
    layout = routing[2]
    up_tiles, down_tiles = mk._tiles(layout.block_m, fp32=False)
    quant = layer["quant"]
    up_k, down_k = (up_tiles[1], down_tiles[1]) if quant is None else (
        quant.block_k(up_tiles[1]), quant.block_k(down_tiles[1])
    )  # fmt: skip
    up, down = mk.plan_splits(
        layout, shape.top_k + shape.shared, shape.local_experts + shape.shared, shape.hidden,
        shape.inter, (up_tiles[0], up_k), (down_tiles[0], down_k), layout.block_expert.device,
    )  # fmt: skip
    return up.count, down.count


def distinct_bytes(shape: Shape, ids: torch.Tensor, fp8: bool = True) -> tuple[int, int, int]:
    """(experts read, gate/up bytes, down bytes) of a call: its distinct routed experts and the shared slots,
    fp8 weights and float32 scales, or bf16 weights."""
    experts = int(ids[ids >= 0].unique().numel()) + shape.shared
    h, i = shape.hidden, shape.inter
    if not fp8:
        return experts, experts * 2 * 2 * h * i, experts * 2 * h * i
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


def call_us(graph: torch.cuda.CUDAGraph) -> float:
    """A call's wall time in the graph (us): REPLAYS replays over CUDA events, per call."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPLAYS * LAYERS)


def measure(shape: Shape, layers: list[dict], x, routings, settings: list[dict]) -> list[dict]:
    """Each setting ({"tiles": ..., "splits": ...}: grouped_experts' arguments) checked against the first
    and captured over the layers: the settings that ran, each with its error, kernel times and call time."""
    reference = run(shape, layers[0], x, routings[0], **settings[0]).float()
    measured, graphs = [], []
    for setting in settings:
        try:
            err = ((run(shape, layers[0], x, routings[0], **setting).float() - reference).norm()
                   / reference.norm()).item()  # fmt: skip
            if not err < 1e-2:
                print(f"  {setting}: wrong (relative error {err:.3g})", flush=True)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for layer, routing in zip(layers, routings):
                    run(shape, layer, x, routing, **setting)
        except Exception as e:  # noqa: BLE001 (a tile beyond the shared memory or the registers)
            print(f"  {setting}: {type(e).__name__}: {e}"[:200], flush=True)
            continue
        measured.append(dict(setting, error=err))
        graphs.append(graph)
    for row, us, graph in zip(measured, kernel_times(graphs), graphs):
        row.update(
            gate_up_us=us["_gate_up_kernel"], down_us=us["_down_kernel"],
            combine_us=us["_combine_kernel"], call_us=call_us(graph),
        )  # fmt: skip
    return measured


def point_routing(shape: Shape, layers: list[dict], tokens: int, seed: int, fp8: bool):
    """Routings a layer, x [tokens, hidden] bf16, and the mean (experts, gate/up bytes, down bytes) a call."""
    gen = torch.Generator().manual_seed(seed)
    routings = [make_routing(shape, tokens, gen, DEVICE) for _ in layers]
    x = (torch.randn(tokens, shape.hidden, generator=gen) * 0.1).to(DEVICE, torch.bfloat16)
    counts = [distinct_bytes(shape, r[1], fp8) for r in routings]
    return routings, x, [sum(c[j] for c in counts) / len(counts) for j in range(3)]


def splits_point(
    shape: Shape, layers: list[dict], tokens: int, fp8: bool, extra: list[tuple[int, int]]
) -> dict:
    """The planned splits, no split and the ``extra`` forced splits at ``tokens`` tokens: a row of the JSON."""
    routings, x, (experts, up_bytes, down_bytes) = point_routing(shape, layers, tokens, tokens, fp8)
    planned = planned_splits(shape, layers[0], routings[0])
    forced = list(dict.fromkeys([UNSPLIT, *extra]))
    rows = measure(
        shape, layers, x, routings, [dict(splits=None)] + [dict(splits=s) for s in forced]
    )
    floor_us = (up_bytes + down_bytes) / BANDWIDTH * 1e6
    for row in rows:
        row["planned"] = row["splits"] is None
        row["splits"] = row["splits"] or planned
        row["floor_share"] = floor_us / row["call_us"]
    return dict(
        tokens=tokens, dtype="fp8" if fp8 else "bf16", experts_read=experts, gate_up_bytes=up_bytes,
        down_bytes=down_bytes, floor_us=floor_us, planned=planned, settings=rows,
    )  # fmt: skip


def tiles_point(shape: Shape, layers: list[dict], tokens: int) -> dict:
    """Every tile setting at ``tokens`` tokens over block-FP8 ``layers`` (planned splits): a row of the JSON."""
    routings, x, (experts, up_bytes, down_bytes) = point_routing(
        shape, layers, tokens, tokens, True
    )
    rows = measure(shape, layers, x, routings, [dict(tiles=t) for t in SETTINGS])
    for row in rows:
        tiles = row.pop("tiles")
        row.update(
            gate_up=tiles[0], down=tiles[1], shipped=tiles == SETTINGS[0],
            gate_up_tb_s=up_bytes / row["gate_up_us"] / 1e6, down_tb_s=down_bytes / row["down_us"] / 1e6,
        )  # fmt: skip
    return dict(
        tokens=tokens, experts_read=experts, gate_up_bytes=up_bytes, down_bytes=down_bytes,
        gate_up_floor_us=up_bytes / BANDWIDTH * 1e6, down_floor_us=down_bytes / BANDWIDTH * 1e6,
        settings=rows,
    )  # fmt: skip


def print_splits_table(rows: list[dict]) -> None:
    """One line a (shape, dtype, tokens, splits): the kernels' and the call's us, the floor's share."""
    print(
        f"{'shape':22} {'dtype':5} {'tok':>3} {'splits':>7} {'gate/up':>8} {'down':>7} {'combine':>7} "
        f"{'call us':>8} {'floor':>6} {'share':>6}"
    )
    for row in rows:
        for s in row["settings"]:
            mark = "*" if s["planned"] else " "
            print(
                f"{row['shape']:22} {row['dtype']:5} {row['tokens']:3d} {mark}{s['splits'][0]:>2},{s['splits'][1]:<3}"
                f" {s['gate_up_us']:8.1f} {s['down_us']:7.1f} {s['combine_us']:7.1f} {s['call_us']:8.1f} "
                f"{row['floor_us']:6.1f} {s['floor_share']:6.1%}",
                flush=True,
            )


def print_tiles_point(name: str, point: dict) -> None:
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


def _pair(text: str) -> tuple[int, int]:
    up, down = (int(v) for v in text.split(","))
    return up, down


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="the grouped experts' split-K or tiles timed at a few tokens (module docstring)"
    )
    ap.add_argument("--out", type=Path, required=True, help="directory for the JSON")
    ap.add_argument("--study", choices=sorted(STUDY_SHAPES), default="splits")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="default: the study's")
    ap.add_argument("--tokens", nargs="+", type=int, help="default: the study's")
    ap.add_argument(
        "--dtypes", nargs="+", choices=("fp8", "bf16"), default=["fp8", "bf16"],
        help="the splits study's stacks (the tiles study: fp8)",
    )  # fmt: skip
    ap.add_argument(
        "--splits", nargs="*", type=_pair, default=[], metavar="U,D",
        help="more (gate/up, down) split counts the splits study forces",
    )  # fmt: skip
    args = ap.parse_args(argv)
    args.shapes = args.shapes or STUDY_SHAPES[args.study]
    args.tokens = args.tokens or list(TOKENS[args.study])
    if args.study == "tiles":
        args.dtypes = ["fp8"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    rows = []
    with torch.inference_mode():
        for name in args.shapes:
            shape = SHAPES[name]
            for dtype in args.dtypes:
                gen = torch.Generator(DEVICE).manual_seed(0)
                layers = [make_layer(shape, gen, DEVICE, fp8=dtype == "fp8") for _ in range(LAYERS)]
                for tokens in args.tokens:
                    if args.study == "splits":
                        point = splits_point(shape, layers, tokens, dtype == "fp8", args.splits)
                    else:
                        point = tiles_point(shape, layers, tokens)
                        print_tiles_point(name, point)
                    rows.append(dict(shape=name, **point))
                del layers
                torch.cuda.empty_cache()
    result = dict(
        study=args.study, device=torch.cuda.get_device_name(), triton=triton.__version__,
        layers=LAYERS, replays=REPLAYS, bandwidth=BANDWIDTH, rows=rows,
    )  # fmt: skip
    name = "moe_splits.json" if args.study == "splits" else "moe_fp8_settings.json"
    (args.out / name).write_text(json.dumps(result, indent=1))
    if args.study == "splits":
        print_splits_table(rows)
    else:
        print_best(rows, args.tokens)
    print(f"{time.perf_counter() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
