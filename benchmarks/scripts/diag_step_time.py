"""Where a speculative decode step's wall time goes on the GPU (issue 15 diagnosis): per engine step,
the wall time, the part spent waiting for the GPU's results, and how many steps were served by a step
run ahead; for plain decoding and adaptive drafters on the zoo widened to 8B, batch 32, temperature 0.8.
Run from the repository root on the GPU machine: python3 benchmarks/scripts/diag_step_time.py"""

import json
import time
from pathlib import Path

import torch

from outpace import LLM, SamplingParams
from outpace.bench.widen import LLAMA_8B, widen_zoo
from outpace.config import SpeculativeConfig
from outpace.engine import run_ahead

w = Path(".e2e_models")
if not (w / "tinypy" / "config.json").is_file():
    widen_zoo("zoo", w, LLAMA_8B, dtype=torch.bfloat16)
prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"]
prompts = (prompts + prompts)[:32]
waited = [0.0]
real_tolist = run_ahead.HostCopy.tolist


def timed_tolist(self):
    t = time.perf_counter()
    out = real_tolist(self)
    waited[0] += time.perf_counter() - t
    return out


run_ahead.HostCopy.tolist = timed_tolist
specs = {
    "none": SpeculativeConfig(),
    "tree": SpeculativeConfig(
        "eagle3", str(w / "tinypy-eagle3"), num_steps=5, topk=4, num_draft_tokens=16, adaptive=True
    ),
    "ngram": SpeculativeConfig("ngram", num_steps=4, adaptive=True),
}
for name, spec in specs.items():
    llm = LLM(
        str(w / "tinypy"),
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=32,
        num_kv_blocks=1024,
        speculative=spec,
    )
    eng = llm.engine
    p = SamplingParams(temperature=0.8, max_tokens=128, ignore_eos=True, seed=0)
    llm.generate(prompts, p)
    times, hits = [], [0]
    real_step, take = eng.step, eng.runner._take_ahead

    def step():
        t = time.perf_counter()
        out = real_step()
        times.append(time.perf_counter() - t)
        return out

    def counting(ids, starts):
        launch = take(ids, starts)
        hits[0] += launch is not None
        return launch

    eng.step, eng.runner._take_ahead = step, counting
    waited[0] = 0.0
    t0 = time.perf_counter()
    outs = llm.generate(prompts, p)
    elapsed = time.perf_counter() - t0
    steady = sorted(times[2:])
    print(
        f"{name}: {len(times)} steps, {hits[0]} run ahead, median step {1e3 * steady[len(steady) // 2]:.2f} ms, "
        f"waiting for the GPU {1e3 * waited[0] / len(times):.2f} ms/step, host {1e3 * (sum(times) - waited[0]) / len(times):.2f} ms/step, "
        f"{sum(len(o.token_ids) for o in outs) / elapsed:.0f} tokens/s"
    )
    del llm, eng
    torch.cuda.empty_cache()
