"""Drafters against plain decoding in closed batches, repeated: ``bench e2e``'s rows (the widened zoo, bf16 on the
GPU; ``--tiny``: its small test widening, float32 on a CPU), each one closed batch of b prompts of
``--max-tokens``, timed ``--rounds`` times, the methods' engines built once and their rounds interleaved, and
the median of each row's closed-batch seconds and steady rate reported. One closed batch moves by several
percent with one-off costs (a slow first prefill, a dropped step run ahead): single runs could not tell two
closed-batch rules apart (issue 43 item 7; benchmarks/results/gpu_2026-12-01b, calls 4-7).

    PYTHONPATH=. python benchmarks/scripts/closed_batch_rounds.py [--methods ngram draft] [--batches 8 32]
        [--temperatures 0 0.8] [--rounds 3] [--tiny] [--workdir .e2e] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
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
from outpace.zoo import zoo_dir


def engines(methods: list[str], workdir: Path, tiny: bool, max_batch: int) -> dict[str, LLM]:
    """Plain decoding's engine and each method's, on the widened zoo as bench e2e builds them."""
    device, dtype = bench_device()
    models = widened_zoo(workdir, "llama", tiny, getattr(torch, dtype))
    specs = drafters(models)
    return {
        name: target_llm(
            models, "llama", specs[name], tiny, device=device, dtype=dtype, max_num_seqs=max_batch
        )
        for name in ["none", *methods]
    }


def measure(
    llms: dict[str, LLM],
    batches: list[int],
    temperatures: list[float],
    rounds: int,
    max_tokens: int,
) -> list[dict]:
    """Per (method, batch, temperature): every round's closed-batch seconds and steady tokens/s, and their
    medians; each row warmed up once (bench e2e's warm-ups), then the rounds run method after method."""
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
    for _ in range(rounds):
        for (name, b, t), row in rows.items():
            outs, seconds, steady = _run(llms[name], prompts, b, params[t], b)
            row["seconds"].append(seconds)
            row["steady"].append(steady)
            row["tokens"] = sum(len(o.token_ids) for o in outs)
    for row in rows.values():
        row["seconds_median"] = statistics.median(row["seconds"])
        row["steady_median"] = statistics.median(row["steady"])
    for (_, b, t), row in rows.items():
        plain = rows["none", b, t]
        row["closed_speedup"] = plain["seconds_median"] / row["seconds_median"]
        row["steady_speedup"] = row["steady_median"] / plain["steady_median"]
    return list(rows.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["ngram"])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--workdir", default=".e2e")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    llms = engines(a.methods, Path(a.workdir), a.tiny, max(a.batches))
    rows = measure(llms, a.batches, a.temperatures, a.rounds, a.max_tokens)
    print(
        f"{'method':<8} {'batch':>5} {'temp':>4} {'closed':>7} {'steady':>7}  closed seconds by round"
    )
    for r in rows:
        spread = " ".join(f"{s:.4f}" for s in r["seconds"])
        print(
            f"{r['method']:<8} {r['batch']:>5} {r['temperature']:>4} {r['closed_speedup']:>6.3f}x "
            f"{r['steady_speedup']:>6.3f}x  {spread}"
        )
    if a.out:
        Path(a.out).write_text(json.dumps({"rounds": a.rounds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
