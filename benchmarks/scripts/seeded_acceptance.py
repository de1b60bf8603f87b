"""tau of seeded requests (exact matching against the target's Gumbel-max samples, layers/sampler.py) against
unseeded ones (rejection sampling) at temperatures 0.8 and 1.0, for every zoo drafter of a target (the drafters
and shapes of ``outpace bench acceptance``), on the zoo's held-out prompts; and whether each drafter's seeded
outputs equal plain decoding's, token for token (the share of prompts that do).

    python benchmarks/scripts/seeded_acceptance.py --device cpu --out benchmarks/results/seeded_sampling
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from outpace import LLM, SamplingParams
from outpace.bench.acceptance import zoo_drafters
from outpace.speculative.metrics import SpecMetrics
from outpace.zoo import zoo_dir

TEMPERATURES = (0.8, 1.0)


def params_for(
    temperature: float, seeded: bool, max_tokens: int, num_prompts: int
) -> list[SamplingParams]:
    """One request per prompt; seeded: prompt i gets seed 1000 + i (unseeded: the engine's seed fixes the draws)."""
    return [
        SamplingParams(
            temperature=temperature,
            max_tokens=max_tokens,
            ignore_eos=True,
            seed=1000 + i if seeded else None,
        )
        for i in range(num_prompts)
    ]


def measure(model: str, prompts: list[str], max_tokens: int, engine: dict) -> dict:
    plain = LLM(model, **engine)
    reference = {
        t: [
            o.token_ids
            for o in plain.generate(prompts, params_for(t, True, max_tokens, len(prompts)))
        ]
        for t in TEMPERATURES
    }
    plain.close()
    results = {}
    for name, spec in zoo_drafters(model, zoo_dir()).items():
        llm = LLM(model, speculative=spec, **engine)
        row = {
            "method": spec.method,
            "num_steps": spec.num_steps,
            "topk": spec.topk,
            "num_draft_tokens": spec.num_draft_tokens,
        }
        for t in TEMPERATURES:
            for seeded in (False, True):
                outs = llm.generate(prompts, params_for(t, seeded, max_tokens, len(prompts)))
                metrics = SpecMetrics.total(o.spec_metrics for o in outs)
                entry = {
                    "acceptance_length": metrics.acceptance_length,
                    "acceptance_rate_per_position": metrics.acceptance_rate_per_position,
                    "num_verifies": metrics.num_verifies,
                }
                if seeded:
                    same = [o.token_ids == r for o, r in zip(outs, reference[t])]
                    entry["same_as_plain_decoding"] = all(same)
                    entry["prompt_match_rate"] = sum(same) / len(same)
                row[f"T={t} {'seeded' if seeded else 'unseeded'}"] = entry
        llm.close()
        results[name] = row
        print_row(name, row)
    return results


def print_row(name: str, row: dict) -> None:
    cells = []
    for t in TEMPERATURES:
        unseeded, seeded = row[f"T={t} unseeded"], row[f"T={t} seeded"]
        same = f"{seeded['prompt_match_rate']:.0%}"
        cells.append(
            f"{unseeded['acceptance_length']:>9.2f} {seeded['acceptance_length']:>7.2f} {same:>6}"
        )
    print(f"{name:>34} " + "   ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(zoo_dir() / "tinypy"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/seeded_sampling")
    a = ap.parse_args()
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    engine = {"device": a.device, "dtype": a.dtype, "batch_invariant": a.batch_invariant}
    print(
        f"{'':>34} "
        + "   ".join(
            f"{f'T={t}: tau unseeded':>17} {'seeded':>7} {'=plain':>6}" for t in TEMPERATURES
        )
    )
    start = time.time()
    results = measure(a.model, prompts, a.max_tokens, engine)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = (
        "seeded_acceptance"
        + ("" if Path(a.model).name == "tinypy" else f"_{Path(a.model).name}")
        + ("" if a.device == "cpu" else "_gpu")
        + ("" if a.dtype == "float32" else f"_{a.dtype}")
        + ("_batch_invariant" if a.batch_invariant else "")
    )
    (out / f"{name}.json").write_text(
        json.dumps(
            {
                "model": os.path.relpath(a.model),
                "prompts": len(prompts),
                "max_tokens": a.max_tokens,
                "engine": engine,
                "temperatures": TEMPERATURES,
                "seeds": "prompt i: 1000 + i (unseeded: the engine's seed, 0)",
                "commit": commit,
                "machine": platform.processor() or platform.machine(),
                "wall_s": round(time.time() - start),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
