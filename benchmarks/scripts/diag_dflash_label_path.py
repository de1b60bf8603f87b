"""How many of a DFlash block's training labels lie on the greedy path, for continuations the zoo target sampled.

A DFlash draft sees the anchor token and B - 1 mask tokens; block row i is labelled with the target's argmax after
the real prefix, whose tokens a + 1 .. a + i - 1 the draft never sees. Greedy verification accepts row i only
after rows 1 .. i - 1 were the target's argmax tokens, so a label is what serving at temperature 0 asks for only
when those tokens are argmax tokens. With continuations sampled at ``--temperature`` (the DFlash recipe's 0.8), this
prints the share of sampled tokens that are the argmax, and per block row i the share of anchors whose label is on
the greedy path (rows 1 .. i - 1 all argmax). Greedy continuations (temperature 0) put every label on it.

  PYTHONPATH=. python benchmarks/scripts/diag_dflash_label_path.py [--temperature 0.8] [--tokens 96]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root
sys.path.insert(0, str(ROOT))


def argmax_agreement(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion)] bool: whether each completion token is the target's argmax after its real prefix."""
    from outpace.attention import DenseCausalMetadata, forward_context

    ids = torch.tensor(prompt + completion)
    n = ids.numel()
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
        argmax = model.compute_logits(model(ids, torch.arange(n)).hidden_states).argmax(-1)  # [n]
    return argmax[len(prompt) - 1 : n - 1] == ids[len(prompt) :]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=str(ROOT / "zoo" / "tinypy"))
    p.add_argument("--prompts", default=str(ROOT / "zoo" / "eval_prompts.json"))
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--block-size", type=int, default=8)
    a = p.parse_args()
    from outpace import LLM, SamplingParams
    from outpace.models.loader import load_model

    prompts = json.loads(Path(a.prompts).read_text())["prompts"]
    outs = LLM(a.target).generate(
        prompts,
        SamplingParams(temperature=a.temperature, max_tokens=a.tokens, ignore_eos=True, seed=0),
    )
    model = load_model(a.target, torch.float32)
    on_path = torch.stack(
        [argmax_agreement(model, list(o.prompt_token_ids), list(o.token_ids)).float() for o in outs]
    )  # [prompts, tokens]
    anchors = a.tokens - a.block_size  # anchors with a whole block
    print(
        f"{len(prompts)} prompts, {a.tokens} tokens sampled at temperature {a.temperature}: "
        f"{on_path.mean().item():.3f} of the tokens are the target's argmax"
    )
    reach = torch.ones(on_path.shape[0], anchors)  # [prompts, anchors]
    for i in range(1, a.block_size):
        if (
            i > 1
        ):  # row i's label is on the greedy path when tokens a + 1 .. a + i - 1 are argmax tokens
            reach = reach * on_path[:, i - 1 : i - 1 + anchors]
        print(f"block row {i}: label on the greedy path for {reach.mean().item():.2f} of anchors")


if __name__ == "__main__":
    main()
