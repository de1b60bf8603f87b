"""Why batch-invariant mode on the fused decoder path (049a978, reverted in 0a89ea8) broke the H200's
bit-identity check (tests/gpu/test_batch_invariant_gpu.py: plain decoding of the zoo's tinypy, greedy, at
batch 1 against batch 8).

One configuration a process (PDL is read once a process: OUTPACE_PDL=0 turns it off):

    PYTHONPATH=. python3 benchmarks/scripts/diag_batch_invariant_fused.py PARTS GRAPHS RUN_AHEAD

PARTS: ``none`` (the mode as shipped: the unfused path), ``all`` (fused_rows_apply serves the mode at any
row count, as 049a978 did), ``head_mlp`` (the same, but attention's q/k/v projection unfused, so every
layer takes the eager path and only the LM head and GatedMLP's gate/up are fused). GRAPHS, RUN_AHEAD: 0/1.
Prints, for 8 prompts and 48 greedy tokens: prompts equal at batch 1 and 8, prompts equal in two runs at
batch 8, and the first differing position of each prompt that differs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import outpace.layers.fused_decoder as fused_decoder
import outpace.layers.fused_projection as fp
from outpace import LLM, SamplingParams
from outpace.bench.families import close
from outpace.layers.skinny_gemm import MAX_ROWS

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def serve_the_mode(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """049a978's rule: any row count in batch-invariant mode, few rows otherwise."""
    return (
        x.is_cuda
        and x.dim() == 2
        and (x.shape[0] <= MAX_ROWS or fp.batch_invariant())
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and not torch.is_grad_enabled()
    )


def patch(parts: str) -> None:
    if parts == "none":
        return
    fp.fused_rows_apply = serve_the_mode
    if parts == "head_mlp":
        fused_decoder.projects_fused = lambda attn, x: False
        fused_decoder.attention_fuses = lambda attn, x: False


def generate(batch: int, graphs: bool, run_ahead: bool) -> list[list[int]]:
    llm = LLM(
        str(ZOO / "tinypy"),
        device="cuda",
        dtype="bfloat16",
        batch_invariant=True,
        max_num_seqs=batch,
        num_kv_blocks=256,
        cuda_graphs=graphs,
        run_ahead=run_ahead,
    )
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:8]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    try:
        return [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        close(llm)


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main(parts: str, graphs: bool, run_ahead: bool) -> None:
    patch(parts)
    one = generate(1, graphs, run_ahead)
    eight = generate(8, graphs, run_ahead)
    again = generate(8, graphs, run_ahead)
    same_1_8 = [first_difference(a, b) for a, b in zip(one, eight)]
    same_8_8 = [first_difference(a, b) for a, b in zip(eight, again)]
    label = f"parts={parts} graphs={int(graphs)} run_ahead={int(run_ahead)} pdl={os.environ.get('OUTPACE_PDL', '1')}"
    print(
        f"{label:48}  b1==b8 {same_1_8.count(None)}/8 (first diff {same_1_8})  "
        f"b8==b8 {same_8_8.count(None)}/8 (first diff {same_8_8})",
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1")
