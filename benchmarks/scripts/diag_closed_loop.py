"""Where a served engine's steps go: the offline engine under the load a server gives it, step by step.

    PYTHONPATH=. python benchmarks/scripts/diag_closed_loop.py --model DIR [--method eagle3 --draft DIR] [--streams 64]
        [--requests 512] [--max-tokens 128] [--spread 0.5] [--device cuda --dtype bfloat16] [--num-steps N]
        [--out FILE.json]

``--streams`` requests are in flight at once and each that finishes is replaced by the next (a closed loop, as
``bench multi``'s dp parts and ``bench serve`` load a server), with the engine streaming its outputs as the server
runs it (``stream_outputs``). Every step is recorded: its wall time, its rows (prefill chunks and decode rows),
the tokens it committed and, with adaptive speculation, the draft shape the step chose and what the chooser
believed that shape costs at that batch size (speculative/adaptive.py: on a GPU the time between events around the
step's launch, not the host's work around it). The table compares, per shape, the wall time of the steps that
only decoded with the chooser's belief, and says how many steps carried a prefill.

Why: on two H200s (benchmarks/results/multi_gpu/dp_h200_8req, call 3), one replica served 64 streams at 9239 output
tokens/s with plain decoding and 5205 with adaptive EAGLE3 (tau 3.58): about 7 ms a step against 44 ms, where the
chooser had chosen speculation. This run shows which steps take the time, without the HTTP server around them.

2026-11-28, this container's 2-core CPU, the zoo's tinypy, 32 streams, 256 requests of 64 tokens: plain decoding
1840 output tokens/s (512 steps, 8 of them carrying the prefills of a wave), adaptive EAGLE3 1574 (181 steps; 113
carried a prefill and took 68% of the wall time, 61 ms at the median against 50 ms that the chooser believed for
their decode part). Decode-only chain-3 steps made 1911 tokens/s, plain's 1922: on the CPU every part of a step is
the model's compute, so the chooser's beliefs match the decode-only steps, and what speculation loses is in the
steps that also prefill (with EAGLE3 the requests end at different steps, so their successors' prefills spread over
most steps). On the GPU (one H200, the widened zoo, ``closed_loop_h200/``) the 37 ms steps that
carried a prefill were a decode step computed twice (the step run ahead dropped at the join) and an eager prefill of
several chunks; after 4ea5060 they take 18-19 ms and EAGLE3 makes 1.14x plain decoding's tokens/s (0.68x before).
The same load with lengths spread (``--spread 0.5``), two rounds each on the shared CPU (+-15% between rounds):
plain 1430 and 1209 tokens/s, EAGLE3 1159 and 1423; with equal lengths plain 1531 and 1651, EAGLE3 1080 and 1315.
Equal lengths, as bench multi's dp parts ask, let plain decoding prefill a whole wave of requests in one step.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from outpace.config import EngineConfig, SpeculativeConfig  # noqa: E402
from outpace.engine.engine import LLMEngine  # noqa: E402
from outpace.engine.scheduler import is_decoding  # noqa: E402
from outpace.sampling_params import SamplingParams  # noqa: E402
from outpace.server.bench import load_prompts  # noqa: E402
from outpace.zoo import zoo_dir  # noqa: E402


@dataclass
class StepRecord:
    wall_s: float
    decode_rows: int
    prefill_rows: int
    prefill_tokens: int
    tokens: int  # committed by the step, over its rows
    shape: str | None  # the draft shape chosen (adaptive speculation), e.g. "chain 5"
    believed_s: float | None  # the chooser's cost for that shape and batch size after the step


def _shape_name(shape) -> str:
    return (
        "plain"
        if not shape.num_steps
        else (
            f"chain {shape.num_steps}"
            if shape.is_chain
            else f"tree {shape.num_steps}x{shape.topk}/{shape.num_nodes}"
        )
    )


class _Watch:
    """Each step's batch composition and chosen shape, seen through the scheduler's and choosers' calls."""

    def __init__(self, engine: LLMEngine) -> None:
        self.decode_rows, self.prefill_chunks, self.chosen = 0, [], []
        schedule = engine.scheduler.schedule

        def watched_schedule():
            batch = schedule()
            decoding = [
                is_decoding(s.request) for s in batch
            ]  # (before the step changes the requests)
            self.decode_rows = sum(decoding)
            self.prefill_chunks = [s.num_new_tokens for s, d in zip(batch, decoding) if not d]
            return batch

        engine.scheduler.schedule = watched_schedule
        for chooser in engine.choosers.values():
            choose = chooser.choose

            def watched_choose(bucket, *args, _choose=choose, _chooser=chooser, **kwargs):
                shape = _choose(bucket, *args, **kwargs)  # (a closed batch's ``remaining`` too)
                self.chosen.append((_chooser, bucket, shape))
                return shape

            chooser.choose = watched_choose


def closed_loop(
    engine: LLMEngine,
    prompts: list[str],
    streams: int,
    requests: int,
    max_tokens: int,
    temperature: float,
    spread: float = 0.0,
    seed: int | None = None,
    profiled: int = 0,
) -> tuple[list[StepRecord], float, int]:
    """Run ``requests`` requests, ``streams`` at a time: (step records, wall seconds, output tokens). Each asks
    for ``max_tokens``, or with ``spread`` a length drawn uniformly from max_tokens x [1 - spread, 1 + spread]
    (seeded); ``seed``: every request's sampling seed (bench e2e's rows: 0 when sampled); the first ``profiled``
    steps run under torch.profiler, whose table of host and device time by operator is printed."""
    watch = _Watch(engine)
    lengths = random.Random(0)
    sent = 0

    def send() -> None:
        nonlocal sent
        n = round(max_tokens * lengths.uniform(1 - spread, 1 + spread)) if spread else max_tokens
        params = SamplingParams(
            temperature=temperature, max_tokens=max(n, 1), ignore_eos=True, seed=seed
        )
        engine.submit(
            engine.new_request(
                prompts[sent % len(prompts)], params, f"loop-{time.perf_counter()}-{sent}"
            )
        )
        sent += 1

    for _ in range(min(streams, requests)):
        send()
    records, seen, output_tokens, start = [], {}, 0, time.perf_counter()
    while engine.has_unfinished_requests:
        watch.chosen.clear()
        t0 = time.perf_counter()
        if len(records) < profiled:
            with torch.profiler.profile(
                activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]
            ) as prof:
                outputs = engine.step()
            print(f"step {len(records)} under torch.profiler:")
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))
        else:
            outputs = engine.step()
        wall = time.perf_counter() - t0
        tokens = 0
        for out in outputs:
            n = len(out.token_ids)
            tokens += n - seen.get(out.request_id, 0)
            seen[out.request_id] = n
            if out.finished:
                seen.pop(out.request_id)
                output_tokens += n
                if sent < requests:
                    send()
        shape = believed = None
        if watch.chosen:
            chooser, bucket, chosen = watch.chosen[0]
            shape, believed = _shape_name(chosen), chooser.costs.get((bucket, chosen))
        records.append(
            StepRecord(
                wall,
                watch.decode_rows,
                len(watch.prefill_chunks),
                sum(watch.prefill_chunks),
                tokens,
                shape,
                believed,
            )
        )
    return records, time.perf_counter() - start, output_tokens


def summary(records: list[StepRecord]) -> list[dict]:
    """Per shape (and "mixed": steps that carried a prefill): steps, median wall ms, median tokens a step,
    and for decode-only steps the chooser's median belief in ms."""
    groups: dict[str, list[StepRecord]] = {}
    for r in records:
        groups.setdefault("with a prefill" if r.prefill_rows else (r.shape or "plain"), []).append(
            r
        )
    rows = []
    for name, rs in sorted(groups.items()):
        beliefs = [r.believed_s for r in rs if r.believed_s is not None]
        rows.append(
            {
                "steps": name,
                "count": len(rs),
                "wall_ms_p50": 1e3 * statistics.median(r.wall_s for r in rs),
                "believed_ms_p50": 1e3 * statistics.median(beliefs) if beliefs else None,
                "decode_rows_p50": statistics.median(r.decode_rows for r in rs),
                "tokens_per_step_p50": statistics.median(r.tokens for r in rs),
                "share_of_wall": sum(r.wall_s for r in rs) / sum(r.wall_s for r in records),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(zoo_dir() / "tinypy"))
    p.add_argument("--method", default="none")
    p.add_argument("--draft", default=None)
    p.add_argument(
        "--num-steps", type=int, default=None, help="a fixed chain (default: adaptive up to 5)"
    )
    p.add_argument(
        "--adaptive", action="store_true", help="with --num-steps: adaptive up to it (bench e2e's)"
    )
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--spread",
        type=float,
        default=0.0,
        help="output lengths drawn from max_tokens x [1 - s, 1 + s] "
        "(0: all equal, as bench multi's dp parts ask, so that a wave of requests ends in one step)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="every request's sampling seed")
    p.add_argument(
        "--profile-steps", type=int, default=0, help="the first steps measured under torch.profiler"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--out", default=None, help="a JSON file for every step's record and the summary"
    )
    a = p.parse_args()
    spec = SpeculativeConfig(
        a.method, a.draft, num_steps=a.num_steps, adaptive=True if a.adaptive else None
    )
    engine = LLMEngine(
        EngineConfig(
            model=a.model,
            device=a.device,
            dtype=a.dtype,
            speculative=spec,
            max_num_seqs=a.streams,
            max_num_batched_tokens=8192,
        )
    )
    engine.stream_outputs = True
    prompts = load_prompts(zoo_dir() / "eval_prompts.json")
    closed_loop(
        engine, prompts, a.streams, a.streams, 8, a.temperature, seed=a.seed
    )  # warm-up: this load's batch sizes
    records, wall, tokens = closed_loop(
        engine,
        prompts,
        a.streams,
        a.requests,
        a.max_tokens,
        a.temperature,
        a.spread,
        a.seed,
        a.profile_steps,
    )
    rows = summary(records)
    print(
        f"{a.method}: {a.requests} requests, {a.streams} streams: {tokens / wall:.0f} output tokens/s, "
        f"{len(records)} steps, {1e3 * wall / len(records):.2f} ms a step"
    )
    print(
        f"{'steps':>16} {'count':>6} {'wall ms':>8} {'believed':>8} {'rows':>5} {'tokens':>6} {'of wall':>7}"
    )
    for r in rows:
        believed = "-" if r["believed_ms_p50"] is None else f"{r['believed_ms_p50']:.2f}"
        print(
            f"{r['steps']:>16} {r['count']:>6} {r['wall_ms_p50']:>8.2f} {believed:>8} {r['decode_rows_p50']:>5.0f} "
            f"{r['tokens_per_step_p50']:>6.0f} {r['share_of_wall']:>7.1%}"
        )
    if a.out:
        Path(a.out).write_text(
            json.dumps(
                {
                    "args": vars(a),
                    "output_tokens_per_s": tokens / wall,
                    "summary": rows,
                    "steps": [asdict(r) for r in records],
                }
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
