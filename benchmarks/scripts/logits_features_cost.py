"""What one request's logits features cost every request of its batch: steady decode tokens/s of bench e2e's
widened Llama (the 8B shape, bf16 on the GPU; ``--tiny``: its small widening, float32 on a CPU), plain decoding
and adaptive EAGLE3, greedy batches of b prompts all plain, or one of them with top-5 log-probabilities, or one
with a repetition penalty, or one constrained by a regular expression. Each such batch runs twice: its steps eager (``ModelRunner._capture_late`` off: how
every step with logits features ran before 2026-12-07) and captured on first use (as shipped). Prints the table
and writes it as JSON.

    PYTHONPATH=. python benchmarks/scripts/logits_features_cost.py OUT.json [--tiny] [--batches 8 32]
        [--max-tokens 64] [--repeats 2] [--workdir .e2e] [--methods none eagle3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from outpace import SamplingParams
from outpace.bench.e2e import _run, bench_device, drafters, row_params, target_llm, widened_zoo
from outpace.sampling_params import StructuredOutputsParams
from outpace.zoo import zoo_dir

VARIANTS = {  # what the batch's first request asks besides greedy decoding
    "plain": {},
    "logprobs": {"logprobs": 5},
    "penalty": {"repetition_penalty": 1.1},
    # 1000 characters: no end-of-sequence token within the 64 or so tokens timed
    "grammar": {
        "structured_outputs": StructuredOutputsParams(regex="[a-z ]{1000}"),
        "ignore_eos": False,
    },
}


def batch_params(variant: str, batch: int, max_tokens: int) -> list[SamplingParams]:
    params = [row_params(0.0, max_tokens)] * batch
    return [params[0].replace(**VARIANTS[variant])] + params[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs a row (the median kept)")
    ap.add_argument("--workdir", type=Path, default=Path(".e2e"))
    ap.add_argument("--methods", nargs="+", choices=("none", "eagle3"), default=["none", "eagle3"])
    args = ap.parse_args()
    device, dtype = bench_device()
    models = widened_zoo(args.workdir, "llama", args.tiny, getattr(torch, dtype))
    specs = drafters(models)
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    rows = []
    for method in args.methods:
        llm = target_llm(
            models, "llama", specs[method], args.tiny, device=device, dtype=dtype,
            max_num_seqs=max(args.batches),
        )  # fmt: skip
        runner = llm.engine.runner
        shipped = runner._capture_late
        for steps in ("eager", "captured"):  # eager first: a key captured stays captured
            runner._capture_late = shipped if steps == "captured" else lambda key: None
            for batch in args.batches:
                group = [prompts[i % len(prompts)] for i in range(batch)]
                for variant in VARIANTS:
                    params = batch_params(variant, batch, args.max_tokens)
                    _run(llm, group, batch, params, batch)  # warm-up (and the first-use captures)
                    rates = [_run(llm, group, batch, params, batch)[2] for _ in range(args.repeats)]
                    rows.append(
                        dict(
                            method=method,
                            steps=steps,
                            batch=batch,
                            variant=variant,
                            tokens_per_s=statistics.median(rates),
                        )
                    )
                    print(rows[-1], flush=True)
        del llm
    args.out.write_text(json.dumps(dict(device=device, dtype=dtype, rows=rows), indent=1))
    rate = {(r["method"], r["steps"], r["batch"], r["variant"]): r["tokens_per_s"] for r in rows}
    print("\nmethod  batch  variant   eager tok/s  captured tok/s  (of the all-plain batch)")
    for (method, steps, batch, variant), r in rate.items():
        if steps == "captured":
            eager, plain = (
                rate[method, "eager", batch, variant],
                rate[method, steps, batch, "plain"],
            )
            print(
                f"{method:7} {batch:5}  {variant:9} {eager:11.1f}  {r:14.1f}  ({eager / plain:.3f} -> "
                f"{r / plain:.3f})"
            )


if __name__ == "__main__":
    main()
