"""Decode throughput and acceptance, with and without speculation, in one run (``outpace bench``).

Prompts are the zoo's committed held-out snippets (``zoo/eval_prompts.json``, cycled) when the model
has a tokenizer (acceptance depends on real text), else fixed token sequences: the same on every
machine, so the figures reproduce anywhere. Each configuration gets a warm-up, then every batch size
runs its prompts to ``max_tokens`` greedy tokens (EOS ignored); time covers prefill and decode.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm.auto import tqdm

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.speculative.metrics import SpecMetrics
from outpace.zoo import zoo_dir


def bench_prompts(llm: LLM, count: int) -> list:
    if llm.tokenizer is None:
        vocab = llm.engine.model_config.vocab_size
        return [[(13 * i + 7 * j) % vocab for j in range(32)] for i in range(count)]
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    return [prompts[i % len(prompts)] for i in range(count)]


def run_decode_bench(
    model: str,
    batch_sizes: list[int],
    max_tokens: int,
    engine_kwargs: dict,
    speculative: SpeculativeConfig,
    out_json: str | None = None,
) -> list[dict]:
    configs = [SpeculativeConfig()] + ([speculative] if speculative.enabled else [])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    prompts = None
    for spec in configs:
        llm = LLM(model, speculative=spec, **engine_kwargs)
        prompts = prompts or bench_prompts(llm, max(batch_sizes))
        llm.generate(prompts[:1], params.replace(max_tokens=8))  # warm-up
        for bs in tqdm(batch_sizes, desc=f"bench {spec.method}"):
            t0 = time.perf_counter()
            outs = llm.generate(prompts[:bs], params)
            elapsed = time.perf_counter() - t0
            metrics = SpecMetrics.total(o.spec_metrics for o in outs)
            rows.append(
                {
                    "method": spec.method,
                    "num_steps": spec.num_steps,
                    "topk": spec.topk,
                    "num_draft_tokens": spec.num_draft_tokens if spec.enabled else 1,
                    "batch_size": bs,
                    "tokens": sum(len(o.token_ids) for o in outs),
                    "seconds": elapsed,
                    "tokens_per_s": sum(len(o.token_ids) for o in outs) / elapsed,
                    **({"speculative": metrics.to_dict()} if spec.enabled else {}),
                }
            )
        llm.close()  # (a tensor-parallel engine's ranks stop before the next one starts)
    base = {r["batch_size"]: r["tokens_per_s"] for r in rows if r["method"] == "none"}
    print(f"{'method':>8} {'batch':>6} {'tokens/s':>10} {'speedup':>8} {'tau':>6}")
    for r in rows:
        tau = r.get("speculative", {}).get("acceptance_length")
        print(
            f"{r['method']:>8} {r['batch_size']:>6} {r['tokens_per_s']:>10.1f} "
            f"{r['tokens_per_s'] / base[r['batch_size']]:>7.2f}x {'' if tau is None else f'{tau:.2f}':>6}"
        )
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows
