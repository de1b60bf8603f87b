"""How close the random Qwen3-Next target's routers come to a tie (the hypothesis of
benchmarks/results/gpu_2026-11-29c/README.md: its graphed and eager plain decoding differ at one token of 256
because rounding flips a router's choice of 10 of 512 experts). The target and prompts of
diag_hybrid_mtp_lossless.py, plain decoding run eagerly in fp32 on one GPU, every router's input hooked: per
decode step, the smallest gap between the 10th and 11th softmax scores over the rows and layers, relative to
the 10th; and the smallest gaps of the whole run with their step, layer and row. A gap near float32 rounding
(~1e-7 relative) at the step of the differing token supports the hypothesis; gaps far above it refute it.
Usage: python benchmarks/scripts/diag_router_margins.py WORKDIR OUT.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from outpace import LLM, SamplingParams
from outpace.bench.family_shapes import QWEN3_NEXT_80B, slice_layers, with_mtp
from outpace.bench.random_checkpoint import random_target
from outpace.models.qwen3_next import RouterWithSharedGate

PROMPTS, TOKENS = 8, 32


def main(workdir: str, out: str) -> None:
    config = with_mtp(slice_layers(QWEN3_NEXT_80B, 4))  # bench multi's Plan.hybrid_random
    model = str(random_target(Path(workdir) / "random-qwen3-next", config, device="cuda"))
    prompts = [[(13 * i + 7 * j) % config["vocab_size"] for j in range(32)] for i in range(PROMPTS)]
    llm = LLM(model, device="cuda", dtype="float32", max_num_seqs=PROMPTS, cuda_graphs=False)
    routers = [m for m in llm.engine.model.modules() if isinstance(m, RouterWithSharedGate)]
    gaps: list[list] = [[] for _ in routers]  # per layer: one [rows] tensor per decode forward

    def hook(layer: int):
        def record(module, args, _out) -> None:
            x = args[0]  # [rows, hidden]
            if x.shape[0] > PROMPTS:  # (a prefill)
                return
            k = module.routing.top_k
            scores = torch.softmax(x.float() @ module.weight.float().T, dim=-1)  # [rows, experts]
            top = scores.topk(k + 1, dim=-1).values  # [rows, k + 1], descending
            gaps[layer].append(((top[:, k - 1] - top[:, k]) / top[:, k - 1]).cpu())

        return record

    for i, r in enumerate(routers):
        r.register_forward_hook(hook(i))
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True))
    llm.close()
    layers = [
        i for i, g in enumerate(gaps) if g
    ]  # (the MTP layer's router does not run in plain decoding)
    steps = min(len(gaps[i]) for i in layers)
    per_step = [min(float(gaps[i][s].min()) for i in layers) for s in range(steps)]
    smallest = sorted(
        (float(v), s, i, row)
        for i in layers
        for s in range(steps)
        for row, v in enumerate(gaps[i][s].tolist())
    )[:10]
    result = {"per_decode_step_min_relative_gap": per_step, "smallest": smallest}
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    for s, v in enumerate(per_step):
        print(f"decode step {s:>2} (token {s + 1}): smallest relative gap {v:.3e}")
    print("smallest (gap, step, layer, row):", smallest)


if __name__ == "__main__":
    main(*sys.argv[1:3])
