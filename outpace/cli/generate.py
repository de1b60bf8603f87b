"""``outpace generate``: text (or token ids) for one prompt."""

from __future__ import annotations

import argparse
import json
import sys

from outpace.cli.engine_args import add_engine_args, check_model_dir, engine_kwargs


def add_parser(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate text for one prompt")
    add_engine_args(g, positional_model=True)
    prompt = g.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt's text")
    prompt.add_argument(
        "--prompt-token-ids",
        type=int,
        nargs="+",
        metavar="ID",
        help="the prompt as token ids (models without a tokenizer); prints token ids",
    )
    # (None: the generation defaults (--generation-config), else OWN_DEFAULTS, else SamplingParams')
    g.add_argument("--max-tokens", type=int, default=None, help="default 64")
    g.add_argument("--temperature", type=float, default=None, help="default 0 (greedy)")
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=run)


# this command's defaults, below the model's generation_config.json (outpace/generation_defaults.py)
OWN_DEFAULTS = {"max_tokens": 64, "temperature": 0.0}


def run(a: argparse.Namespace) -> None:
    # NOTE: imported here, not at the top: the parser (and `outpace --help`) loads no torch
    from outpace import LLM, SamplingParams

    check_model_dir(a.model)
    flags = dict(
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        min_p=a.min_p,
        max_tokens=a.max_tokens,
    )
    given = {name: value for name, value in flags.items() if value is not None}
    SamplingParams(**given)  # (a bad flag refused before the model loads)
    prompt = a.prompt if a.prompt is not None else a.prompt_token_ids
    # (closed here, not at interpreter exit: the other ranks of a torchrun launch are released in order)
    with LLM(a.model, **engine_kwargs(a)) as llm:
        defaults = {**OWN_DEFAULTS, **llm.generation_defaults.params, **given}
        params = SamplingParams(**defaults, seed=a.seed, ignore_eos=a.ignore_eos)
        out = llm.generate([prompt], params)[0]
    if (
        out.finish_reason == "error"
    ):  # (the engine ends a request that fails alone: it is this command's only one)
        sys.exit(f"error: the request failed: {out.error}")
    spec = out.spec_metrics
    if a.json:
        row = {
            "text": out.text,
            "token_ids": out.token_ids,
            "finish_reason": out.finish_reason,
            "tokens_per_s": out.tokens_per_s,
            "speculative": spec.to_dict(),
        }
        print(json.dumps(row))
    elif a.prompt is None:  # token ids in, token ids out (--json gives the text too)
        print(" ".join(map(str, out.token_ids)))
    else:
        print(a.prompt + out.text)
        line = (
            f"\n[{len(out.token_ids)} tokens, {out.finish_reason}, {out.tokens_per_s:.1f} tokens/s"
        )
        if spec.num_verifies:
            rates = " ".join(f"{r:.2f}" for r in spec.acceptance_rate_per_position)
            line += (
                f", {spec.num_verifies} verifies, tau {spec.acceptance_length:.2f}, "
                f"per-position {rates}"
            )
        print(line + "]", file=sys.stderr)
