"""What a verify step costs beyond a decode step, kernel by kernel: for a shape of bench/family_shapes.py (random
bf16 weights, one GPU) at a batch, the captured greedy step verifying t = 1, 2, 3 tokens per sequence (t - 1
n-gram drafts, adaptive so that every draft count is captured; bench/families.py ``verify_costs`` times the
same replays), each replayed under torch.profiler. Prints the kernels by name, their launches and GPU us a
replay at each t, the names whose time grows most from t = 1 to t = 2 first; writes every kernel of one replay
at each t in launch order (start after the replay's first kernel, duration, gap since the previous ended, us).

    PYTHONPATH=. python3 benchmarks/scripts/verify_timeline.py OUT SHAPE[@BATCH] ...
    PYTHONPATH=. python3 benchmarks/scripts/verify_timeline.py OUT e2e:FAMILY:METHOD[@BATCH] --workdir DIR

The second form times a drafter's own step instead (t - 1 drafts of METHOD, e.g. mtp or eagle3, drafting for
the next step too) on ``bench e2e --family FAMILY``'s widened zoo target, written under DIR (or reused).

writes OUT/verify_SHAPE@BATCH_tT.txt. The kernel time (the sum of the replay's kernel durations) is the figure to
compare: a replay's span can hold a host gap. Replays run on the padding row (attention reads no context), so the
difference between the t columns is the cost of verifying more tokens, not of a longer context."""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.bench.families import MAX_VERIFY_TOKENS, build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.profile import _cuda_events, kernel_timeline
from outpace.config import SpeculativeConfig
from outpace.engine.cuda_graphs import bucket_for
from outpace.engine.step_key import SamplingMode, StepKey
from outpace.speculative.proposer import DraftShape

TOKENS = (1, 2, 3)
REPLAYS = 3


def replay_events(llm, batch: int, tokens: int) -> list:
    """The kernels of one replay (the second of REPLAYS) of the step verifying ``tokens`` a sequence, on the
    idle rows (``ModelRunner.probe_replays``: the copies that save and restore the state buffers stay
    outside the profiled region, so the region holds the replays alone)."""
    runner = llm.engine.runner
    shape = DraftShape(
        tokens - 1
    )  # drafting over narrow windows where the drafter holds (the usual step)
    key = StepKey(
        bucket_for(runner.graph_buckets, batch),
        shape,
        SamplingMode.GREEDY,
        narrow=runner.holds.narrow_variants(shape)[-1],
    )
    with runner.probe_replays(key) as replay:
        replay()  # warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                replay()
            torch.cuda.synchronize()
    events = _cuda_events(prof)
    if len(events) % REPLAYS:
        raise RuntimeError(f"{len(events)} kernels over {REPLAYS} replays of one graph")
    per = len(events) // REPLAYS
    return events[per : 2 * per]


def by_name(events: list) -> dict[str, tuple[int, float]]:
    table: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        table[e.name][0] += 1
        table[e.name][1] += e.time_range.end - e.time_range.start
    return {name: (n, us) for name, (n, us) in table.items()}


def engine(shape: str, batch: int, workdir: Path, models_dir: Path):
    """A family shape with n-gram drafts, or ``e2e:FAMILY:METHOD``'s widened zoo target and drafter."""
    if not shape.startswith("e2e:"):
        spec = SpeculativeConfig("ngram", num_steps=MAX_VERIFY_TOKENS - 1, adaptive=True)
        return build(workdir, family_shapes()[shape].config, batch, (batch,), spec)
    from outpace import LLM
    from outpace.bench.e2e import FAMILIES, drafters, widened_zoo

    _, family, method = shape.split(":")
    models = widened_zoo(models_dir, family)
    return LLM(
        str(models[FAMILIES[family].models[0]]),
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=batch,
        num_kv_blocks=1024,
        cuda_graph_sizes=(batch,),
        speculative=drafters(models, family)[method],
    )


def compare(shape: str, batch: int, out: Path, workdir: Path, models_dir: Path) -> list[str]:
    llm = engine(shape, batch, workdir, models_dir)
    try:
        tables, spans = [], []
        for t in TOKENS:
            events = replay_events(llm, batch, t)
            lines = kernel_timeline(events)
            (out / f"verify_{shape.replace(':', '_')}@{batch}_t{t}.txt").write_text(
                "\n".join(lines) + "\n"
            )
            tables.append(by_name(events))
            spans.append(lines[-1].split()[-2])
    finally:
        close(llm)
    names = sorted(
        set().union(*tables),
        key=lambda n: -(tables[1].get(n, (0, 0.0))[1] - tables[0].get(n, (0, 0.0))[1]),
    )
    head = "  ".join(f"t={t}: n     us" for t in TOKENS)
    busy = " / ".join(f"{sum(us for _, us in tab.values()):.1f}" for tab in tables)
    lines = [
        f"{shape} batch {batch}: kernel time (us) {busy}; replay span " + " / ".join(spans),
        f"{head}  kernel",
    ]
    for name in names:
        cells = "  ".join(
            f"{tab.get(name, (0, 0.0))[0]:7d} {tab.get(name, (0, 0.0))[1]:7.1f}" for tab in tables
        )
        lines.append(f"{cells}  {name[:80]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("shapes", nargs="+", help="SHAPE[@BATCH] or e2e:FAMILY:METHOD[@BATCH]")
    parser.add_argument("--workdir", default=".e2e_models", help="the e2e form's widened models")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        shape, _, batch = name.partition("@")
        with tempfile.TemporaryDirectory() as tmp:
            lines = compare(shape, int(batch or 1), out, Path(tmp), Path(args.workdir))
        (out / f"verify_{shape.replace(':', '_')}@{batch or 1}.txt").write_text(
            "\n".join(lines) + "\n"
        )
        print("\n".join(lines[:40]), flush=True)


if __name__ == "__main__":
    main()
