"""Decode throughput at several batch sizes (``outpace bench``)."""
from __future__ import annotations

import time

from outpace import LLM, SamplingParams


def run_decode_bench(model: str, batch_sizes: list[int], max_tokens: int, engine_kwargs: dict,
                     prompt_len: int = 32) -> list[dict]:
    llm = LLM(model, **engine_kwargs)
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    llm.generate([[7] * prompt_len], params.replace(max_tokens=4))  # warm-up
    for bs in batch_sizes:
        prompts = [[(13 * i + 7 * j) % vocab for j in range(prompt_len)] for i in range(bs)]
        for p in prompts:
            llm.engine.add_request(p, params)
        llm.engine.step()  # the prefill step, not counted in decode throughput
        steps, t0 = 0, time.perf_counter()
        while llm.engine.has_unfinished_requests:
            llm.engine.step()
            steps += 1
        elapsed = time.perf_counter() - t0
        rows.append({"batch_size": bs, "decode_steps": steps, "decode_tokens_per_s": bs * steps / elapsed,
                     "step_ms": 1000 * elapsed / steps})
    print(f"{'batch':>6} {'steps':>6} {'step ms':>9} {'decode tok/s':>13}")
    for r in rows:
        print(f"{r['batch_size']:>6} {r['decode_steps']:>6} {r['step_ms']:>9.2f} {r['decode_tokens_per_s']:>13.1f}")
    return rows
