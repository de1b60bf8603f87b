"""Plain decode on the CPU against transformers' generate, in one run (``outpace bench cpu``).

Both decode the same prompts (``outpace bench``'s: ``zoo/eval_prompts.json``) greedily to the same number of new tokens,
EOS ignored (transformers: ``min_new_tokens``), in the same process, so on the same CPU with the same
threads (the count outpace chose at start, outpace/threads.py). transformers' LlamaForCausalLM is
loaded from the same checkpoint directory in the same dtype. Rounds interleave the two (outpace then
transformers, prompt by prompt); each round's tokens/s is its tokens over its time, prefill
included, and the figure is the median over rounds.

``busy``: for each value, one measurement beside that many processes spinning on the CPU (started
here, stopped after it), to see what a shared machine does to each.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from outpace import LLM, SamplingParams
from outpace.bench.decode import bench_prompts
from outpace.threads import available_cpus


def run_cpu_bench(
    model: str,
    max_tokens: int,
    num_prompts: int,
    rounds: int,
    busy: list[int],
    engine_kwargs: dict,
    out_json: str | None = None,
) -> list[dict]:
    import transformers

    llm = LLM(model, **{**engine_kwargs, "device": "cpu"})
    dtype = next(llm.engine.model.parameters()).dtype
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
    prompts = _prompt_ids(llm, num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    def outpace_generate(ids: list[int]) -> list[int]:
        return llm.generate(ids, params)[0].token_ids

    def hf_generate(ids: list[int]) -> list[int]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = hf.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
            )
        return out[0, len(ids) :].tolist()

    outpace_generate(prompts[0][:8])  # warm-up
    hf_generate(prompts[0][:8])
    results = []
    for num_busy in busy:
        rates, same = _measure(
            {"outpace": outpace_generate, "transformers": hf_generate},
            prompts,
            max_tokens,
            rounds,
            num_busy,
        )
        median = {name: statistics.median(r) for name, r in rates.items()}
        results.append(
            {
                "model": str(model),
                "dtype": str(dtype).removeprefix("torch."),
                "max_tokens": max_tokens,
                "num_prompts": len(prompts),
                "rounds": rounds,
                "busy_processes": num_busy,
                "cpus_available": available_cpus(),
                "torch_threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokens_per_s": median,
                "outpace_over_transformers": median["outpace"] / median["transformers"],
                "rounds_tokens_per_s": rates,
                "same_tokens": f"{same}/{rounds * len(prompts)}",
            }
        )
        print(
            f"busy {num_busy}: outpace {median['outpace']:.1f} tokens/s, transformers "
            f"{median['transformers']:.1f} tokens/s ({results[-1]['outpace_over_transformers']:.2f}x), "
            f"{torch.get_num_threads()} threads, same tokens {results[-1]['same_tokens']}"
        )
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(results, indent=2) + "\n")
    return results


def _measure(
    generators: dict, prompts: list[list[int]], max_tokens: int, rounds: int, busy: int
) -> tuple[dict[str, list[float]], int]:
    """Per round and generator, tokens/s over all prompts, beside ``busy`` spinning processes; and how
    many of the prompts' outputs were the same for all generators."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    rates: dict[str, list[float]] = {name: [] for name in generators}
    same = 0
    try:
        for _ in tqdm(range(rounds), desc=f"cpu bench, {busy} busy"):
            elapsed = dict.fromkeys(generators, 0.0)
            for ids in prompts:
                tokens = []
                for name, generate in generators.items():
                    t0 = time.perf_counter()
                    tokens.append(generate(ids))
                    elapsed[name] += time.perf_counter() - t0
                    assert len(tokens[-1]) == max_tokens, (name, len(tokens[-1]))
                same += all(t == tokens[0] for t in tokens)
            for name in generators:
                rates[name].append(len(prompts) * max_tokens / elapsed[name])
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return rates, same


def _prompt_ids(llm: LLM, count: int) -> list[list[int]]:
    """``outpace bench``'s prompts (bench/decode.py), as token ids: transformers takes ids."""
    return [
        p if isinstance(p, list) else llm.tokenizer.encode(p, add_special_tokens=True)
        for p in bench_prompts(llm, count)
    ]
