"""Where a batch-1 request's time outside the steady decode steps goes on the GPU (issue 15 diagnosis:
the closed-batch column loses ~30 ms per request to something besides decoding). For plain decoding and
EAGLE3 on the zoo widened to 8B: the wall time of every engine step of one warm request (the first is the
prefill), the time of ``generate`` outside the steps, and the prefill step under torch.profiler (CPU ops
and GPU kernels by self time). Run from the repository root on the GPU machine:
python3 benchmarks/scripts/diag_prefill.py"""

import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace import LLM, SamplingParams
from outpace.bench.widen import LLAMA_8B, widen_zoo
from outpace.config import SpeculativeConfig

w = Path(".e2e_models")
if not (w / "tinypy" / "config.json").is_file():
    widen_zoo("zoo", w, LLAMA_8B, dtype=torch.bfloat16)
prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"]
specs = {
    "none": SpeculativeConfig(),
    "eagle3": SpeculativeConfig("eagle3", str(w / "tinypy-eagle3"), num_steps=5, adaptive=True),
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
    p = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    for q in prompts[:4]:
        llm.generate([q], p)
    times = []
    real_step = eng.step

    def step():
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = real_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        return out

    eng.step = step
    for q in prompts[4:8]:
        times.clear()
        t0 = time.perf_counter()
        llm.generate([q], p)
        total = time.perf_counter() - t0
        n = len(llm.tokenizer.encode(q))
        print(
            f"{name}: prompt {n} tokens, generate {1e3 * total:.1f} ms, {len(times)} steps: prefill step "
            f"{1e3 * times[0]:.2f} ms, 2nd {1e3 * times[1]:.2f}, 3rd {1e3 * times[2]:.2f}, median "
            f"{1e3 * sorted(times)[len(times) // 2]:.2f}, outside the steps {1e3 * (total - sum(times)):.1f} ms"
        )
    eng.step = real_step
    torch.cuda.synchronize()
    first = [True]

    def profiled_step():
        if not first[0]:
            return real_step()
        first[0] = False
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = real_step()
            torch.cuda.synchronize()
        print(
            prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60
            )
        )
        print(
            prof.key_averages().table(
                sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60
            )
        )
        return out

    eng.step = profiled_step
    llm.generate([prompts[9]], p.replace(max_tokens=2))
    eng.step = real_step
    del llm, eng
    torch.cuda.empty_cache()
