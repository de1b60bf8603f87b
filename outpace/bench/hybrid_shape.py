"""``outpace bench gpu --parts h``: a Qwen3.5-shaped hybrid target (gated DeltaNet and gated attention,
3:1, transformers' Qwen3_5TextConfig defaults: hidden 4096, 32 layers, intermediate 12288, vocabulary
248320) with one MTP layer, random bf16 weights (``load_format="dummy"``), on the GPU.

- plain decoding: tokens/s at batch 1 and 8 (the captured iteration, as served), against the floor of
  the bytes a step reads (weights, the full-attention layers' KV, each request's recurrent state read and
  written) over the copy bandwidth measured in the same run;
- the MTP drafter: each captured step's GPU time for 0..3 drafts (the costs adaptive speculation profiles
  at start-up: draft, verify with its per-position state snapshots, commit), and the speed-up they give
  under ORACLE acceptance (an assumed per-position acceptance: random weights accept nothing), labelled
  as such in the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from outpace import LLM
from outpace.bench.gpu import time_decode
from outpace.bench.oracle import oracle_speedups
from outpace.config import SpeculativeConfig
from outpace.engine.step_key import SamplingMode

BATCHES, CONTEXT, MTP_STEPS = (1, 8), 512, 3


def qwen35_config() -> dict:
    """transformers' Qwen3_5TextConfig defaults (the model type's reference shape), one MTP layer, and a
    context table sized for the bench."""
    from transformers import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(max_position_embeddings=8192).to_dict()
    cfg.update(architectures=["Qwen3_5ForCausalLM"], mtp_num_hidden_layers=1)
    return {
        k: v for k, v in cfg.items() if k not in ("id2label", "label2id", "transformers_version")
    }


def step_bytes(llm: LLM, batch: int, context: int) -> int:
    """Bytes one plain decode step must read: every weight of the target (not its MTP layer), the
    full-attention layers' KV of ``context`` tokens per request, and each request's recurrent state read
    and written (conv window and fp32 delta-rule state)."""
    model = llm.engine.model
    weights = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("mtp")
    )
    kv = sum(
        t[0, 0].numel() * t.element_size() for pair in llm.engine.runner.kv_caches for t in pair
    )
    state = sum(t[0].numel() * t.element_size() for t in llm.engine.runner.states.tensors())
    return weights + batch * (context * kv + 2 * state)


def _build(workdir: Path, speculative: SpeculativeConfig) -> LLM:
    return LLM(
        str(workdir),
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        block_size=16,
        num_kv_blocks=max(BATCHES) * (CONTEXT // 16 + 40) + 16,
        max_num_seqs=max(BATCHES),
        max_num_batched_tokens=2048,
        speculative=speculative,
    )


def run_hybrid_bench(workdir: Path, bandwidth: float) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(qwen35_config()))
    result = {
        "model": "Qwen3.5 shape (transformers Qwen3_5TextConfig defaults), one MTP layer, random bf16 weights",
        "config": qwen35_config(),
        "context": CONTEXT,
        "decode": [],
        "mtp_step_ms": {},
        "oracle": {},
    }
    llm = _build(workdir, SpeculativeConfig())
    for batch in BATCHES:
        row = time_decode(llm, batch, CONTEXT)
        floor = bandwidth / step_bytes(llm, batch, CONTEXT) * batch
        row.update(floor_tokens_per_s=floor, fraction_of_floor=row["tokens_per_s"] / floor)
        result["decode"].append(row)
    del llm
    torch.cuda.empty_cache()
    llm = _build(workdir, SpeculativeConfig("mtp", num_steps=MTP_STEPS, adaptive=True))
    runner = llm.engine.runner
    chooser = llm.engine.choosers[
        SamplingMode.GREEDY
    ]  # its costs: each captured step profiled at start-up
    for batch in BATCHES:
        bucket = min(b for b in runner.graph_buckets if b >= batch)
        costs = {s.num_steps: c for (bk, s), c in chooser.costs.items() if bk == bucket}
        result["mtp_step_ms"][batch] = {k: 1e3 * c for k, c in sorted(costs.items())}
        result["oracle"][batch] = oracle_speedups(costs)
    del llm, runner, chooser
    torch.cuda.empty_cache()
    return result


def print_hybrid_summary(r: dict) -> None:
    print(f"(h) {r['model']}, context {r['context']}")
    print("    batch  tokens/s  step ms  of floor")
    for row in r["decode"]:
        print(
            f"    {row['batch']:5d} {row['tokens_per_s']:9.1f} {row['step_ms']:8.2f} {row['fraction_of_floor']:8.1%}"
        )
    for batch, ms in r["mtp_step_ms"].items():
        print(
            f"    MTP captured step ms at batch {batch} (drafts: ms): "
            + ", ".join(f"{k}: {v:.2f}" for k, v in ms.items())
        )
        print(
            "    ORACLE acceptance (assumed), measured step costs: "
            + "; ".join(
                f"a={o['acceptance']} k={o['num_drafts']} {o['speedup']:.2f}x"
                for o in r["oracle"][batch]
            )
        )
