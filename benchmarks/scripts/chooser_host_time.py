"""The adaptive chooser's host time a step (speculative/adaptive.py: ``observe`` of the step's verify, then ``choose``
of the next shape), over the shapes of an EAGLE3 tree engine (chains of 0-4 drafts, two trees), at batch 8 and 32,
in throughput mode and in a closed batch. Where a step is not run ahead (a hybrid's batch whose recurrent state is
over engine/run_ahead.py's bound; a grammar; a batch no graph holds) this time adds to the step's.

``--against FILE``: another version of adaptive.py (e.g. ``git show REV:outpace/speculative/adaptive.py > FILE``),
timed in turn with this tree's on the same draws; every choice of the two is compared.

    PYTHONPATH=. python benchmarks/scripts/chooser_host_time.py [--steps 600] [--against FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import time

from outpace.speculative import adaptive
from outpace.speculative.proposer import DraftShape

SHAPES = [DraftShape(k) for k in range(5)] + [DraftShape(3, 2), DraftShape(4, 4)]


def chooser(module, bucket: int):
    c = module.DraftLengthChooser(SHAPES, probe_budget=module.PROBE_BUDGET)
    for s in SHAPES:  # a step's seconds, growing with its nodes
        c.record_cost(bucket, s, 0.008 + 0.0005 * s.num_nodes)
    return c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--against", default=None)
    a = p.parse_args()
    modules = {"this tree": adaptive}
    if a.against:
        spec = importlib.util.spec_from_file_location("adaptive_against", a.against)
        modules[a.against] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[a.against])
    print(f"{'adaptive.py':<28} {'batch':>5} {'mode':<10} {'us a step (median)':>18}")
    for bucket in (8, 32):
        for closed in (False, True):
            ids = [f"r{i}" for i in range(bucket)]
            choosers = {name: chooser(m, bucket) for name, m in modules.items()}
            times = {name: [] for name in modules}
            rng, differ = random.Random(0), 0
            for step in range(a.steps):
                shape = SHAPES[1 + step % (len(SHAPES) - 1)]
                accepted = [
                    rng.randint(0, shape.num_steps) if rng.random() < 0.7 else 0 for _ in ids
                ]
                remaining = [rng.randint(1, 40) for _ in ids] if closed else None
                order = list(choosers) if step % 2 else list(reversed(choosers))
                picks = {}
                for name in order:
                    t = time.perf_counter()
                    choosers[name].observe(shape, accepted, ids)
                    picks[name] = choosers[name].choose(bucket, ids, remaining)
                    times[name].append(time.perf_counter() - t)
                differ += len(set(picks.values())) > 1
            for name, ts in times.items():
                mode = "closed" if closed else "throughput"
                print(f"{name:<28} {bucket:>5} {mode:<10} {1e6 * statistics.median(ts):>18.0f}")
            if a.against:
                print(f"{'':<28} choices that differ: {differ} of {a.steps}")


if __name__ == "__main__":
    main()
