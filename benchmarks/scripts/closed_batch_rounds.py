"""Drafters against plain decoding in closed batches, repeated: ``bench e2e``'s rows (the widened zoo, bf16 on the
GPU; ``--tiny``: its small test widening, float32 on a CPU), each one closed batch of b prompts of
``--max-tokens``, timed ``--rounds`` times, the methods' engines built once and their rounds interleaved, and
the median of each row's closed-batch seconds and steady rate reported, and of its rounds' ratios to plain
decoding's rounds of the same index (``paired``). One closed batch moves by several
percent with one-off costs (a slow first prefill, a dropped step run ahead): single runs could not tell two
closed-batch rules apart (issue 43 item 7; benchmarks/results/gpu_2026-12-01b, calls 4-7). ``--steps FILE``
also writes every engine step of each row's rounds (wall ms, decoding rows, the draft shape chosen, its kind: held,
flush, draft or probe; ``steps`` the last round's, ``rounds`` every round's: one round of Qwen3.5's EAGLE3 tree took
11% longer than the other two, gpu_2026-12-06i call 3, whose log kept only the last) and prints, per batch and
temperature, where a method's last round spent more time than plain decoding's, and its steps by kind (``--profile-steps I...``: those steps of each row's last round
also under torch.profiler, their wall times with it, each one's table printed, by the GPU's time on a GPU), and
each row's first step (the prompts' prefill) over every round: its median, since one round's first step moved by 10 to
20 ms now and then on an H100 (benchmarks/results/gpu_2026-12-06g; torch's CPU repeat_interleave, found with
``--profile-every-round``: gpu_2026-12-06h), with the prompt tokens it computed and those the prefix cache gave (a
drafter whose rows read tokens past a block keys its blocks by them too, cache/prefix_cache.py: on the CPU's tiny
widening, 32 requests of a repeated round, MTP's three layers computed 310 tokens where plain decoding computed 230).

    PYTHONPATH=. python benchmarks/scripts/closed_batch_rounds.py [--family F] [--methods ngram draft] [--batches 8 32]
        [--temperatures 0 0.8] [--rounds 3] [--tiny] [--workdir .e2e] [--out FILE.json] [--steps FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from outpace import LLM
from outpace.bench.e2e import (
    _run,
    bench_device,
    drafters,
    row_params,
    target_llm,
    widened_zoo,
)
from outpace.engine.scheduler import is_decoding
from outpace.zoo import zoo_dir


def engines(
    methods: list[str], workdir: Path, tiny: bool, max_batch: int, family: str = "llama"
) -> dict[str, LLM]:
    """Plain decoding's engine and each method's, on the family's widened zoo as bench e2e builds them."""
    device, dtype = bench_device()
    models = widened_zoo(workdir, family, tiny, getattr(torch, dtype))
    specs = drafters(models, family)
    return {
        name: target_llm(
            models, family, specs[name], tiny, device=device, dtype=dtype, max_num_seqs=max_batch
        )
        for name in ["none", *methods]
    }


class StepLog:
    """Each engine step of an ``LLM``'s runs while ``on``: [wall ms, decoding rows, draft shape or None, the
    chooser's cost of that shape in ms (its GPU time, as the step was chosen) or None, its kind or None, prompt
    tokens it computed, prompt tokens the prefix cache gave];
    ``profile_steps``: the indices of a run's steps logged also under torch.profiler (``tables``). The kinds
    of an adaptive drafter's steps: ``held`` (zero drafts, the drafter's forward held back), ``flush`` (zero
    drafts, its forward run over the rows held: engine/step_key.py ``HoldRule``), ``draft`` (a shape the
    chooser judged best, or one whose cost it had yet to measure), ``probe`` (a shape drafted to keep its
    acceptance measured: speculative/adaptive.py); None for plain decoding's engine and for steps without
    decoding rows."""

    def __init__(
        self, llm: LLM, profile_steps: Sequence[int] = (), sort_by: str | None = None
    ) -> None:
        self.on, self.profiling, self.steps, self._shape, self._believed = (
            False,
            False,
            [],
            None,
            None,
        )
        self._kind: str | None = None
        self._probe = False
        self.profile_steps, self.tables = profile_steps, []
        on_gpu = torch.cuda.is_available()
        sort_by = sort_by or ("self_device_time_total" if on_gpu else "self_cpu_time_total")
        engine = llm.engine
        real_step = engine.step
        self._prefilled = [0, 0]  # this step's prompt tokens: computed, from the prefix cache

        def step():
            if not self.on:
                return real_step()
            self._shape = self._believed = self._kind = None
            self._prefilled[:] = [0, 0]
            rows = sum(map(is_decoding, engine.scheduler.running))
            profiled = self.profiling and len(self.steps) in self.profile_steps
            with torch.profiler.profile() if profiled else contextlib.nullcontext() as prof:
                t = time.perf_counter()
                outputs = real_step()
                wall = time.perf_counter() - t
            self.steps.append(
                [
                    round(1e3 * wall, 3),
                    rows,
                    self._shape,
                    self._believed,
                    self._kind,
                    *self._prefilled,
                ]
            )
            if profiled:
                table = prof.key_averages().table(sort_by=sort_by, row_limit=60)
                self.tables.append((len(self.steps) - 1, table))
            return outputs

        engine.step = step
        for chooser in engine.choosers.values():
            choose = chooser.choose

            def watched(bucket, *args, _choose=choose, _chooser=chooser, **kwargs):
                shape = _choose(bucket, *args, **kwargs)
                if self._shape is None:  # (the step's own; a step run ahead chooses after it)
                    self._shape = f"{shape.num_steps}x{shape.topk}" if shape.num_steps else "plain"
                    cost = _chooser.costs.get((bucket, shape))
                    self._believed = None if cost is None else round(1e3 * cost, 3)
                    self._probe = _chooser._since_probe == 0  # (a probe restarts that count)
                return shape

            chooser.choose = watched
        decode_step = engine.runner.decode_step
        run = decode_step.run

        def watched_run(key, *args, **kwargs):
            if self.on and self._shape is not None and self._kind is None:  # the shape logged
                drafted = "probe" if self._probe else "draft"
                self._kind = drafted if key.shape.num_steps else "held" if key.hold else "flush"
            return run(key, *args, **kwargs)

        decode_step.run = watched_run
        prefill_step = engine.runner.prefill_step
        run_prefill = prefill_step.run

        def counted_prefill(chunks, *args, **kwargs):
            self._prefilled[0] += sum(c.num_new_tokens for c in chunks)
            self._prefilled[1] += sum(c.num_reused_tokens for c in chunks)
            return run_prefill(chunks, *args, **kwargs)

        prefill_step.run = counted_prefill


def step_differences(logs: dict[tuple, list], methods: list[str]) -> list[str]:
    """Per method, batch and temperature, its last round against plain decoding's (``logs``: a list of steps a
    round): steps, total ms, and the phases (first step, decode steps with every request, the tail) in ms."""

    def phases(steps: list) -> tuple[float, float, float, int]:
        full = max(step[1] for step in steps)
        body = [step[0] for step in steps[1:] if step[1] == full]
        return steps[0][0], sum(body), sum(step[0] for step in steps[1 + len(body) :]), len(body)

    lines = []
    for (name, b, t), rounds in logs.items():
        if name == "none":
            continue
        steps, plain = rounds[-1], logs["none", b, t][-1]
        drafted = sum(1 for step in steps if step[2] not in (None, "plain"))
        (f0, body0, tail0, n0), (f1, body1, tail1, n1) = phases(plain), phases(steps)
        lines.append(
            f"{name:<6} b{b:<3} t{t}: steps {len(plain)} -> {len(steps)} ({drafted} drafted); ms total "
            f"{sum(s[0] for s in plain):.1f} -> {sum(s[0] for s in steps):.1f}; first {f0:.2f} -> {f1:.2f}; "
            f"full-batch steps {n0}: {body0:.1f} -> {n1}: {body1:.1f}; tail {tail0:.2f} -> {tail1:.2f}"
        )
        lines.append(f"{'':<6} by kind (steps, ms): {kinds_summary(steps)}")
    return lines


def kinds_summary(steps: list) -> str:
    """A run's steps by kind (``StepLog``), in the order first met: how many and their summed wall ms."""
    kinds: dict[str, list[float]] = {}
    for step in steps:
        kinds.setdefault(step[4] or "other", []).append(step[0])
    return ", ".join(f"{kind} {len(ms)}: {sum(ms):.1f}" for kind, ms in kinds.items())


def measure(
    llms: dict[str, LLM],
    batches: list[int],
    temperatures: list[float],
    rounds: int,
    max_tokens: int,
    logs: dict[tuple, list] | None = None,
    profile_steps: Sequence[int] = (),
    profile_every_round: bool = False,
    profile_sort: str | None = None,
) -> list[dict]:
    """Per (method, batch, temperature): every round's closed-batch seconds and steady tokens/s, and their
    medians; each row warmed up once (bench e2e's warm-ups), then the rounds run method after method.
    ``logs``: filled with each row's engine steps, a list a round (``StepLog``); ``profile_steps``: those
    steps of theirs under torch.profiler too (of every round's with ``profile_every_round``), whose tables are
    printed, sorted by ``profile_sort`` (a key_averages column; the GPU's self time on a GPU)."""
    watches = (
        {name: StepLog(llm, profile_steps, profile_sort) for name, llm in llms.items()}
        if logs is not None
        else {}
    )
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    rows = {}
    params = {t: row_params(t, max_tokens) for t in temperatures}
    for name, llm in llms.items():
        for b in batches:
            _run(
                llm, prompts, b, params[temperatures[0]].replace(max_tokens=4), b
            )  # every prefill shape
            for t in temperatures:
                _run(llm, prompts, b, params[t], b)  # this batch's and temperature's decode steps
                rows[name, b, t] = {
                    "method": name,
                    "batch": b,
                    "temperature": t,
                    "seconds": [],
                    "steady": [],
                }
    for k in range(rounds):
        for (name, b, t), row in rows.items():
            watch = watches.get(name)
            if watch is not None:
                watch.on, watch.steps = True, []
                watch.profiling = profile_every_round or k == rounds - 1
            outs, seconds, steady = _run(llms[name], prompts, b, params[t], b)
            if watch is not None:
                watch.on = False
                row.setdefault("first_ms", []).append(watch.steps[0][0])
                row.setdefault("first_tokens", []).append(watch.steps[0][5:7])
                logs.setdefault((name, b, t), []).append(watch.steps)
            if watch is not None and watch.profiling:
                for i, table in watch.tables:
                    print(
                        f"{name}, batch {b}, temperature {t}, round {k}: step {i} ({watch.steps[i][0]} ms) "
                        f"under torch.profiler\n{table}"
                    )
                watch.tables.clear()
            row["seconds"].append(seconds)
            row["steady"].append(steady)
            row["tokens"] = sum(len(o.token_ids) for o in outs)
    for row in rows.values():
        row["seconds_median"] = statistics.median(row["seconds"])
        row["steady_median"] = statistics.median(row["steady"])
    for (_, b, t), row in rows.items():
        plain = rows["none", b, t]
        row["closed_speedup"] = plain["seconds_median"] / row["seconds_median"]
        # round k's plain decoding against round k's method (run one after the other): what drifts over the rounds
        # moves both
        row["closed_paired"] = statistics.median(
            p / m for p, m in zip(plain["seconds"], row["seconds"])
        )
        row["steady_speedup"] = row["steady_median"] / plain["steady_median"]
        if "first_ms" in row:
            row["first_ms_median"] = statistics.median(row["first_ms"])
    return list(rows.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="llama", help="bench e2e's --family")
    p.add_argument("--methods", nargs="+", default=["ngram"])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--workdir", default=".e2e")
    p.add_argument("--out", default=None)
    p.add_argument("--steps", default=None, help="write each row's last-round steps here (JSON)")
    p.add_argument(
        "--profile-steps",
        type=int,
        nargs="+",
        default=(),
        help="with --steps: these steps (indices) under torch.profiler",
    )
    p.add_argument(
        "--profile-every-round",
        action="store_true",
        help="--profile-steps in every round, not only the last (a step that is slow now and then)",
    )
    p.add_argument(
        "--profile-sort",
        default=None,
        help="the profiler tables' sort column (e.g. self_cpu_time_total; default: the GPU's self time)",
    )
    a = p.parse_args()
    llms = engines(a.methods, Path(a.workdir), a.tiny, max(a.batches), a.family)
    logs = {} if a.steps else None
    rows = measure(
        llms, a.batches, a.temperatures, a.rounds, a.max_tokens, logs, a.profile_steps,
        a.profile_every_round, a.profile_sort,
    )  # fmt: skip
    print(
        f"{'method':<8} {'batch':>5} {'temp':>4} {'closed':>7} {'paired':>7} {'steady':>7}  closed seconds by round"
    )
    for r in rows:
        spread = " ".join(f"{s:.4f}" for s in r["seconds"])
        print(
            f"{r['method']:<8} {r['batch']:>5} {r['temperature']:>4} {r['closed_speedup']:>6.3f}x "
            f"{r['closed_paired']:>6.3f}x "
            f"{r['steady_speedup']:>6.3f}x  {spread}"
        )
    if a.out:
        Path(a.out).write_text(json.dumps({"rounds": a.rounds, "rows": rows}, indent=1) + "\n")
    if logs is not None:
        print("the first step (the prompts' prefill), ms, the median of the rounds:")
        for r in rows:
            computed, cached = r["first_tokens"][-1]
            print(
                f"  {r['method']:<11} b{r['batch']:<3} t{r['temperature']}: {r['first_ms_median']:.2f} "
                f"(the last round's: {computed} prompt tokens computed, {cached} from the prefix cache)"
            )
        print("\n".join(step_differences(logs, a.methods)))
        named = [
            {"method": n, "batch": b, "temperature": t, "steps": r[-1], "rounds": r}
            for (n, b, t), r in logs.items()
        ]
        Path(a.steps).write_text(json.dumps(named, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
