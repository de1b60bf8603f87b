"""The few-row quantized matmul (layers/quant/quant_matmul_kernel.py) over block-FP8 weights at the FP8
families' decode shapes: ``plan``'s launch against a pruned grid of launch settings (columns a program, K
step, warps, stages, and programs an SM, which sets the K split). Each time is one call's share of a CUDA
graph of 8 calls on 8 distinct weights (more bytes than L2 holds), the median of the replays
(fp8_projection_settings.py ``graph_us``); every setting's output is checked against torch's product on the
dequantized weight first, and a setting that does not compile or computes wrongly is reported and skipped.
The floor is the fp8 bytes and the float32 scales over 4.8 TB/s (an H200's HBM).

The grid (``SWEEP``), pruned to finish within 105 s on an H200 (at most 297 timings and 50 compiles; it
prints its size and bound first):
1. one row: the settings of ``tile_settings``' rules, at 8 programs an SM;
2. one row: the best 2 of those over stages 3, 4, 6 x programs an SM 4, 8, 16;
3. 8 and 16 rows (the same 16-row tile as one row): the plan and the best 3 settings of one row.

    PYTHONPATH=. python3 benchmarks/scripts/quant_matmul_settings.py [--out OUT.json]
    PYTHONPATH=. python3 benchmarks/scripts/quant_matmul_settings.py --smoke  (CPU: the interpreter, tiny)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time

if "--smoke" in sys.argv:  # (before Triton is imported)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from fp8_projection_settings import CALLS, graph_us  # (the timing of the FP8 sweeps)

from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block
from outpace.layers.quant.quant_matmul_kernel import QuantTiles, few_row_tiles, plan, quant_matmul

BLOCK = (128, 128)
HBM_BYTES_PER_S = 4.8e12
# name: (N, K), a rank's part where a projection is tensor-parallel
SHAPES = {
    "step-3.5 tp2 q_proj": (6144, 4096),
    "step-3.5 tp2 o_proj": (4096, 6144),
    "step-3.5 tp2 k_proj": (512, 4096),
    "qwen3-next in_proj_qkvz": (12288, 2048),
    "llama-8b down_proj": (4096, 14336),
    "llama-8b gate_up": (28672, 4096),
    "deepseek-v2-lite kv_a": (576, 2048),
    "deepseek-v2-lite q": (3072, 2048),
    "deepseek-v2-lite o": (2048, 2048),
}
STAGES = (3, 4, 6)
# (seconds on an H200: graph_us's do_bench runs 25 + 100 ms; a variant's compile, conservatively)
SECONDS_A_TIMING, SECONDS_A_COMPILE, SECONDS_TO_START = 0.15, 0.8, 20.0


@dataclasses.dataclass(frozen=True)
class Setting:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 8

    def tiles(self, m: int, n: int, k: int, device: torch.device) -> QuantTiles:
        return few_row_tiles(m, n, k, device, **dataclasses.asdict(self))

    def __str__(self) -> str:
        return (
            f"bn{self.block_n} bk{self.block_k} w{self.num_warps} s{self.num_stages} "
            f"p{self.programs_per_sm}"
        )


@dataclasses.dataclass(frozen=True)
class Grid:
    """What is swept (module docstring): ``first`` at the first row count, the best ``refined`` of them
    over ``stages`` x ``programs_per_sm``, the best ``carried`` at the other row counts."""

    rows: tuple[int, ...]
    first: tuple[Setting, ...]
    stages: tuple[int, ...]
    programs_per_sm: tuple[int, ...]
    refined: int
    carried: int

    def refinements(self, best: Setting) -> list[Setting]:
        """``best`` at every stage count that fits and every programs-an-SM count."""
        return [
            Setting(best.block_n, best.block_k, best.num_warps, stages, programs)
            for stages, programs in itertools.product(self.stages, self.programs_per_sm)
            if fits(best.block_n, best.block_k, stages)
        ]

    def bounds(self, shapes: int) -> tuple[int, int, float]:
        """(timings, compiles, seconds) at most: per shape the plan, ``first``, the refinements of the best
        ``refined`` and at the other row counts the plan and ``carried`` settings; a compile for each
        (BN, BK, warps, stages) split and not (the row tile is the same 16 rows up to 16 rows), plan's
        two tiles among them."""
        refinements = [self.refinements(s) for s in self.first]
        timings = shapes * (
            1 + len(self.first) + self.refined * max(map(len, refinements)) - self.refined
        )
        timings += shapes * (len(self.rows) - 1) * (1 + self.carried)
        variants = {dataclasses.replace(r, programs_per_sm=8) for rs in refinements for r in rs}
        stage_variants = shapes * self.refined * (len(self.stages) - 1)
        compiles = 2 * (2 + min(len(variants), len(self.first) + stage_variants))
        seconds = SECONDS_TO_START + timings * SECONDS_A_TIMING + compiles * SECONDS_A_COMPILE
        return timings, compiles, seconds


def fits(block_n: int, block_k: int, stages: int) -> bool:
    """The pipeline's buffers (fp8 weight tiles and 16-row bf16 x tiles) within 200 KB of shared memory."""
    return stages * (block_n * block_k + 16 * block_k * 2) <= 200 * 1024


def tile_settings() -> tuple[Setting, ...]:
    """The grid's first stage, from BN 32/64 (the B operand's N) x BK 128/256/512 x warps 4/8:
    - the dequantized tile is held in registers as float32: at most 128 values a thread
      (BN x BK <= 4096 x warps);
    - 8 warps only for tiles of 16 KB or more (smaller ones give a thread under 64 values);
    - the fewest stages of 3, 4, 6 that keep 32 KB of a program's weight in flight ((stages - 1) x
      BN x BK bytes), within the shared memory (``fits``)."""
    settings = []
    for block_n, block_k, warps in itertools.product((32, 64), (128, 256, 512), (4, 8)):
        tile = block_n * block_k
        if tile > 4096 * warps or (warps == 8 and tile < 16384):
            continue
        stages = next((s for s in STAGES if (s - 1) * tile >= 32768), STAGES[-1])
        if fits(block_n, block_k, stages):
            settings.append(Setting(block_n, block_k, warps, stages))
    return tuple(settings)


SWEEP = Grid(
    rows=(1, 8, 16),
    first=tile_settings(),
    stages=STAGES,
    programs_per_sm=(4, 8, 16),
    refined=2,
    carried=3,
)
SMOKE = Grid(  # (the interpreter: every step of the sweep, few launches)
    rows=(1, 3),
    first=(Setting(64, 256, 4, 3), Setting(32, 512, 4, 3)),
    stages=(3,),
    programs_per_sm=(4, 8),
    refined=1,
    carried=1,
)
SMOKE_SHAPES = {"smoke 200x300": (200, 300), "smoke 40x1100": (40, 1100)}


def floor_us(n: int, k: int) -> float:
    scales = -(-n // BLOCK[0]) * -(-k // BLOCK[1])
    return (n * k + 4 * scales) / HBM_BYTES_PER_S * 1e6


def eager_us(calls) -> float:
    """(--smoke, on the CPU) one call's share of the median wall time of ``calls()``."""
    calls()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        calls()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6 / CALLS


class Timer:
    """Times ``quant_matmul`` launches on one shape's weights at one row count; a launch seen before (the
    same tiles from another setting) is not timed again."""

    def __init__(self, x, weights, scales, expected, tolerance: float):
        self.x, self.weights, self.scales = x, weights, scales
        self.expected, self.tolerance = expected, tolerance  # [M, N] float32
        self.times: dict[QuantTiles, float | None] = {}

    def us(self, tiles: QuantTiles, label: str) -> float | None:
        """us a call with ``tiles``, None where it fails to compile or computes wrongly."""
        if tiles not in self.times:
            self.times[tiles] = self._measure(tiles, label)
        return self.times[tiles]

    def _measure(self, tiles: QuantTiles, label: str) -> float | None:
        def call(weight, scale):
            return quant_matmul(self.x, weight, scale, "fp8_block", BLOCK, tiles)

        try:
            got = call(self.weights[0], self.scales[0]).float()
            err = ((got - self.expected).norm() / self.expected.norm()).item()
            if not err < self.tolerance:
                print(f"    {label}: wrong output (relative error {err:.3g})", flush=True)
                return None
            timing = graph_us if self.x.is_cuda else eager_us
            return timing(lambda: [call(w, s) for w, s in zip(self.weights, self.scales)])
        except Exception as e:  # noqa: BLE001 (a setting that does not compile: reported, skipped)
            print(f"    {label}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            return None


def time_settings(timer, settings, m, n, k, device, timed: dict) -> None:
    """``timed`` [setting] = us at ``m`` rows, for the settings not yet in it."""
    for s in settings:
        if s not in timed:
            timed[s] = timer.us(s.tiles(m, n, k, device), str(s))


def sweep_shape(name: str, n: int, k: int, grid: Grid, device, dtype, tolerance) -> list[dict]:
    raw = torch.randn(n, k, device=device) * 0.02
    weight, scale = quantize_fp8_block(raw, BLOCK)
    dense = dequantize_fp8_block(weight, scale, BLOCK)  # [N, K] float32
    weights = [weight.clone() for _ in range(CALLS)]
    scales = [scale.clone() for _ in range(CALLS)]
    floor = floor_us(n, k)
    results, ranked = [], []
    for m in grid.rows:
        x = torch.randn(m, k, device=device, dtype=dtype)
        timer = Timer(x, weights, scales, x.float() @ dense.T, tolerance)
        timed: dict[Setting, float | None] = {}
        if m == grid.rows[0]:
            time_settings(timer, grid.first, m, n, k, device, timed)
            best = sorted((s for s in grid.first if timed[s]), key=timed.get)[: grid.refined]
            refinements = [r for b in best for r in grid.refinements(b)]
            time_settings(timer, refinements, m, n, k, device, timed)
            ranked = sorted((s for s in timed if timed[s]), key=timed.get)
        else:
            time_settings(timer, ranked[: grid.carried], m, n, k, device, timed)
        planned = plan(m, n, k, "fp8_block", BLOCK[1], device)
        plan_us = timer.us(planned, "plan")
        ok = {s: t for s, t in timed.items() if t}
        top = min(ok, key=ok.get) if ok else None
        best_text = f"{top} {ok[top]:6.1f} us" if top else "none"
        plan_text = f"{plan_us:6.1f} us" if plan_us else "failed"
        print(
            f"{name:>26} m={m:<2} plan {plan_text} | best {best_text} | floor {floor:5.1f} us",
            flush=True,
        )
        results.append(
            {
                "shape": name,
                "n": n,
                "k": k,
                "rows": m,
                "floor_us": floor,
                "plan": dataclasses.asdict(planned),
                "plan_us": plan_us,
                "best": dataclasses.asdict(top) if top else None,
                "best_tiles": dataclasses.asdict(top.tiles(m, n, k, device)) if top else None,
                "best_us": ok[top] if top else None,
                "settings": [{**dataclasses.asdict(s), "us": t} for s, t in timed.items()],
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the results as JSON")
    parser.add_argument(
        "--smoke", action="store_true", help="on the CPU: the interpreter, tiny shapes, 2 settings"
    )
    args = parser.parse_args()
    if args.smoke:
        device, dtype, tolerance = torch.device("cpu"), torch.float32, 1e-5
        shapes, grid = SMOKE_SHAPES, SMOKE
    else:
        device, dtype, tolerance = torch.device("cuda"), torch.bfloat16, 2e-2
        shapes, grid = SHAPES, SWEEP
    timings, compiles, seconds = grid.bounds(len(shapes))
    print(f"{len(grid.first)} tile settings: {' | '.join(map(str, grid.first))}", flush=True)
    print(
        f"at most {timings} timings and {compiles} compiles: at most {seconds:.0f} s on an H200",
        flush=True,
    )
    start = time.perf_counter()
    results = []
    for name, (n, k) in shapes.items():
        results += sweep_shape(name, n, k, grid, device, dtype, tolerance)
    print(f"swept in {time.perf_counter() - start:.0f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
            json.dump(
                {"device": device_name, "grid": dataclasses.asdict(grid), "results": results},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
