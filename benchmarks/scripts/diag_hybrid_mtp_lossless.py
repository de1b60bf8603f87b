"""Where a random Qwen3-Next target's MTP speculation leaves plain decoding's greedy tokens on one GPU (fp32):
``bench multi`` item1 found one sequence differing at TP = 2 where plain decoding's top-2 log-prob gap was
0.17 (no near tie). The same target and prompts at TP = 1, in variants that bisect the decode path: CUDA
graphs on and off, Gated DeltaNet's fused step kernel on and off (layers/deltanet_step_kernel.py; its torch
path is the reference), one and two MTP steps. Per variant: equal, the first difference, the drafts accepted
by each differing sequence. Usage: python benchmarks/scripts/diag_hybrid_mtp_lossless.py WORKDIR OUT.json"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from outpace import LLM, SamplingParams
from outpace.bench.family_shapes import QWEN3_NEXT_80B, slice_layers, with_mtp
from outpace.bench.random_checkpoint import random_target
from outpace.config import SpeculativeConfig
from outpace.layers.gated_deltanet import GatedDeltaNet

PROMPTS, TOKENS = 8, 32


def main(workdir: str, out: str) -> None:
    config = with_mtp(slice_layers(QWEN3_NEXT_80B, 4))  # bench multi's Plan.hybrid_random
    model = str(random_target(Path(workdir) / "random-qwen3-next", config, device="cuda"))
    prompts = [[(13 * i + 7 * j) % config["vocab_size"] for j in range(32)] for i in range(PROMPTS)]
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    rows: dict = {}

    def generate(name: str, spec: SpeculativeConfig | None, graphs: bool, fused: bool | None):
        t0 = time.monotonic()
        llm = LLM(
            model, device="cuda", dtype="float32", max_num_seqs=PROMPTS, cuda_graphs=graphs,
            speculative=spec or SpeculativeConfig(),
        )  # fmt: skip
        if fused is not None:  # (eager engines only: a captured graph keeps the kernel it captured)
            for m in llm.engine.model.modules():
                if isinstance(m, GatedDeltaNet):
                    m.fused_step = fused
        outs = llm.generate(prompts, params)
        llm.close()
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        return outs

    reference = [o.token_ids for o in generate("plain", None, True, None)]
    variants = {
        "mtp2 graphs": (SpeculativeConfig("mtp", num_steps=2), True, None),
        "mtp1 graphs": (SpeculativeConfig("mtp", num_steps=1), True, None),
        "mtp2 eager fused": (SpeculativeConfig("mtp", num_steps=2), False, True),
        "mtp2 eager torch deltanet": (SpeculativeConfig("mtp", num_steps=2), False, False),
        "plain eager torch deltanet": (None, False, False),
    }
    for name, (spec, graphs, fused) in variants.items():
        outs = generate(name, spec, graphs, fused)
        differing = {
            i: {
                "first": next(j for j, (a, b) in enumerate(zip(ref, o.token_ids)) if a != b),
                "accepted": o.spec_metrics.num_accepted_drafts,
            }
            for i, (ref, o) in enumerate(zip(reference, outs))
            if o.token_ids != ref
        }
        accepted = [o.spec_metrics.num_accepted_drafts for o in outs]
        rows[name] = {"equal": not differing, "differing": differing, "accepted": accepted}
        print(name, json.dumps(rows[name]), flush=True)
        Path(out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
