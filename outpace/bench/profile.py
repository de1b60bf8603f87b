"""Where a decode step's GPU time goes (``python -m outpace.bench.profile``): the 8B-shaped model at
batch 1, context 512, one forward run eagerly under torch.profiler, kernel time summed by kernel
name, next to the captured graph's replay time (the difference is launch gaps inside the graph
and the host-to-device copies of its inputs)."""
from __future__ import annotations

import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from outpace.attention import forward_context, uniform_paged_metadata
from outpace.bench.gpu import build_8b, time_verify_shapes


def profile_decode(batch: int = 1, context: int = 512, top: int = 25) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        llm = build_8b(Path(tmp), max_context=1024, max_num_seqs=max(batch, 1))
        engine = llm.engine
        graph_ms = time_verify_shapes(llm, batch, context)[0]["ms"]
        runner, pool = engine.runner, engine.pool
        ids = [f"profile-{i}" for i in range(batch)]
        for rid in ids:
            pool.grow(rid, context + 1)
        tables = torch.tensor([pool.table(r) for r in ids], device="cuda")
        starts = torch.full((batch,), context, device="cuda")
        tokens = torch.randint(0, 1000, (batch,), device="cuda")

        def forward():
            meta = uniform_paged_metadata(tables, starts, 1, pool.block_size)
            with torch.inference_mode(), forward_context(meta, runner.backend):
                return engine.model.compute_logits(engine.model(tokens, starts).hidden_states)

        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward()
            torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += e.device_time_total / 1e3  # ms
            by_name[e.name][1] += 1
    total = sum(v[0] for v in by_name.values())
    print(f"batch {batch}, context {context}: kernels {total:.3f} ms in {sum(v[1] for v in by_name.values())} launches; "
          f"graph replay {graph_ms:.3f} ms")
    for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{ms:8.3f} ms {n:5d}x  {name[:110]}")


if __name__ == "__main__":
    profile_decode(*(int(a) for a in sys.argv[1:]))
