"""Narrow against whole pending windows in one engine: for ``bench e2e --family FAMILY``'s widened zoo target with
its holding drafter (adaptive MTP or EAGLE3), the captured greedy step drafting k tokens at each batch, replayed
over the narrow windows (the rows a verify leaves) and over the whole ones (``HOLD_ROWS`` more: the step after
held ones), each key's median replay (``ModelRunner.profile``, rows of the padding index), the two interleaved in
three rounds and the lowest median kept.

    PYTHONPATH=. python3 benchmarks/scripts/narrow_window_ab.py OUT.json FAMILY:METHOD --batches 1 8 32 --workdir DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from outpace import LLM
from outpace.bench.e2e import FAMILIES, drafters, widened_zoo
from outpace.engine.step_key import SamplingMode, StepKey


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("case", help="FAMILY:METHOD, e.g. qwen35:mtp")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--workdir", default=".e2e_models")
    args = parser.parse_args()
    family, method = args.case.split(":")
    models = widened_zoo(Path(args.workdir), family)
    llm = LLM(
        str(models[FAMILIES[family].models[0]]),
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=max(args.batches),
        num_kv_blocks=2048,
        cuda_graph_sizes=tuple(args.batches),
        speculative=drafters(models, family)[method],
    )
    runner = llm.engine.runner
    rows = []
    for batch in args.batches:
        for shape in runner.shapes:
            if runner.holds.narrow_variants(shape) != (False, True):
                continue
            keys = {n: StepKey(batch, shape, SamplingMode.GREEDY, narrow=n) for n in (True, False)}
            times = {n: [] for n in keys}
            for _ in range(3):  # the two interleaved
                for n, key in keys.items():
                    times[n].append(1e3 * runner.profile(key, 20))
            ms = {n: min(t) for n, t in times.items()}
            rows.append(
                {"batch": batch, "shape": shape.label, "narrow_ms": ms[True], "whole_ms": ms[False]}
            )
            print(
                f"b{batch:<3} {shape.label:8} narrow {ms[True]:.3f} ms  whole {ms[False]:.3f} ms  "
                f"({ms[False] / ms[True]:.3f}x)",
                flush=True,
            )
    Path(args.out).write_text(json.dumps({"case": args.case, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
