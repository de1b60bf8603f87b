"""Where the GPU time of one captured speculative step goes at batch 1 (issue 15 diagnosis), on the zoo
widened to 8B: for plain decoding and the drafters whose batch-1 targets were missed, the captured step
of the shape adaptive speculation chooses most is replayed under torch.profiler, and its kernels are
summed by name (per replay), next to the replay time and the time the GPU sat idle inside it.
Run from the repository root on the GPU machine: python3 benchmarks/scripts/diag_spec_step.py [OUT_JSON]"""

import gc
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace import LLM, SamplingParams
from outpace.bench.e2e import drafters
from outpace.bench.widen import LLAMA_8B, widen_zoo
from outpace.engine.step_key import SamplingMode, StepKey
from outpace.speculative.proposer import DraftShape

work = Path(".e2e_models")
models = {n: work / n for n in ("tinypy", "tinypy-eagle3", "tinypy-dflash", "tinypy-draft")}
if not all((d / "config.json").is_file() for d in models.values()):
    widen_zoo("zoo", work, LLAMA_8B, dtype=torch.bfloat16)
specs = drafters(models)
prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"][:2]
# (method, temperature, the shapes to look at: num_steps, topk, num_draft_tokens)
CASES = [
    ("none", 0.0, [DraftShape(0)]),
    ("eagle3", 0.0, [DraftShape(3)]),
    ("eagle3-tree", 0.0, [DraftShape(5, 4, 16)]),
    ("dflash", 0.0, [DraftShape(2), DraftShape(7)]),
    ("eagle3", 0.8, [DraftShape(3), DraftShape(4)]),
    ("mtp", 0.0, [DraftShape(3)]),
]


def kernels_of(prof) -> list:
    return sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )


report = []
for method, temperature, shapes in CASES:
    llm = LLM(
        str(models["tinypy"]),
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=32,
        num_kv_blocks=1024,
        speculative=specs[method],
    )
    params = SamplingParams(
        temperature=temperature, max_tokens=64, ignore_eos=True, seed=0 if temperature else None
    )
    llm.generate(prompts, params)
    runner = llm.engine.runner
    mode = SamplingMode.of([params])
    for shape in shapes:
        key = StepKey(1, shape, mode)
        if key not in runner.decode_step.graphs:
            print(
                method,
                shape,
                "not captured; captured shapes:",
                sorted({k.shape for k in runner.decode_step.graphs}, key=str),
            )
            continue
        replay_ms = 1e3 * runner.profile(key, repeats=50)
        graph = runner.decode_step.graphs[key]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
        events = kernels_of(prof)
        one = events[-(len(events) // 5) :]
        span = (one[-1].time_range.end - one[0].time_range.start) / 1e3
        busy = sum(e.device_time_total for e in one) / 1e3
        by_name = defaultdict(lambda: [0.0, 0])
        for e in one:
            by_name[e.name[:90]][0] += e.device_time_total
            by_name[e.name[:90]][1] += 1
        top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:22]
        print(
            f"\n== {method} T={temperature} {shape}: replay {replay_ms:.3f} ms, {len(one)} kernels, "
            f"span {span:.3f} ms, kernel time {busy:.3f} ms, idle inside {span - busy:.3f} ms"
        )
        for name, (us, n) in top:
            print(f"  {us:8.1f} us {n:4d}x  {name}")
        report.append(
            {
                "method": method,
                "temperature": temperature,
                "shape": str(shape),
                "replay_ms": replay_ms,
                "kernels": len(one),
                "span_ms": span,
                "kernel_ms": busy,
                "top": [[name, us, n] for name, (us, n) in top],
                "sequence": [
                    [
                        e.name[:60],
                        e.device_time_total,
                        (e.time_range.start - one[i - 1].time_range.end) if i else 0.0,
                    ]
                    for i, e in enumerate(one)
                ],
            }
        )
    del llm, runner
    gc.collect()
    torch.cuda.empty_cache()
    if sys.argv[1:]:
        Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
