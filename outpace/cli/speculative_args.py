"""The speculative decoding flags (--method, --draft, the draft shape) and the config they make.

What a drafter needs (whether it loads a draft checkpoint, how many steps it drafts by default) comes
from its class (speculative/proposer.py), found through the registry; what the zoo ships, from
outpace/zoo.py. A flag that cannot work is refused here, naming it, before any model loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from outpace.config import SpeculativeConfig
from outpace.registry import PROPOSERS, proposer_class
from outpace.zoo import DEFAULT_METHOD, default_draft, is_default_model

METHODS = ["none", *PROPOSERS]  # the drafters are the registry's


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        default=None,
        choices=METHODS,
        help=f"drafter (default: {DEFAULT_METHOD} with the zoo draft on the zoo target, none "
        "otherwise)",
    )
    p.add_argument(
        "--draft",
        default=None,
        help="draft checkpoint directory (default: the zoo's draft for --method on a zoo model)",
    )
    p.add_argument(
        "--num-steps",
        type=int,
        default=None,
        help="draft steps per verify (default: the drafter's for this target and draft, e.g. a "
        "DFlash draft's block size - 1; 5 for most)",
    )
    p.add_argument("--topk", type=int, default=1, help="branches per draft step (1: a chain)")
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="tokens verified per step (default: num-steps + 1 for a chain, 16 at most for a tree)",
    )
    p.add_argument(
        "--speculative-token-map",
        default=None,
        metavar="FILE",
        help="token ids saved by torch.save (SGLang's and FR-Spec's format): MTP and DFlash drafts read only "
        "these rows of the target's head (fewer bytes a draft step; still lossless)",
    )


def speculative_config(a: argparse.Namespace) -> SpeculativeConfig:
    """The SpeculativeConfig the flags ask for (a.model: the target, resolved)."""
    method = a.method or (DEFAULT_METHOD if is_default_model(a.model) else "none")
    if method == "none":
        for flag, value in (
            ("--draft", a.draft),
            ("--num-steps", a.num_steps),
            ("--topk", None if a.topk == 1 else a.topk),
            ("--num-draft-tokens", a.num_draft_tokens),
            ("--speculative-token-map", a.speculative_token_map),
        ):
            if value is not None:
                raise ValueError(
                    f"{flag} {value} is given, but --method is none: name the drafter with --method"
                )
        return SpeculativeConfig()
    drafter = proposer_class(method)
    if a.speculative_token_map is not None:
        if not drafter.takes_token_map:
            raise ValueError(
                f"--speculative-token-map {a.speculative_token_map} is given, but --method {method} drafts from "
                "no head of the target's vocabulary (mtp and dflash do; an EAGLE3 draft has its own)"
            )
        check_token_map(a.speculative_token_map, a.model)
    draft = draft_checkpoint(a, method, drafter)
    # --num-steps / --num-draft-tokens fix the shape; without them each step chooses up to this one
    fixed = a.num_steps is not None or a.num_draft_tokens is not None
    return SpeculativeConfig(
        method,
        None if draft is None else str(draft),
        num_steps=a.num_steps,  # None: the drafter's default (SpeculativeConfig)
        topk=a.topk,
        num_draft_tokens=a.num_draft_tokens,
        adaptive=not fixed,
        token_map=a.speculative_token_map,
    )


def check_token_map(path: str, model: str) -> None:
    """Refuse a token map that is no map of the model's vocabulary (speculative/hot_vocab.py
    ``load_token_map``), before the model loads: its config.json alone gives the vocabulary."""
    from outpace.model_config import ModelConfig
    from outpace.speculative.hot_vocab import load_token_map

    load_token_map(path, ModelConfig.from_pretrained(model).vocab_size)


def draft_checkpoint(a: argparse.Namespace, method: str, drafter: type) -> Path | None:
    """The draft checkpoint ``--method`` loads: --draft, else the zoo's draft for a zoo model; None for a
    drafter that loads none. Refused when it plainly is no draft of that drafter."""
    if not drafter.takes_draft_checkpoint:
        if a.draft is not None:
            raise ValueError(
                f"--draft {a.draft} is given, but --method {method} loads no draft checkpoint"
            )
        return None
    draft = Path(a.draft) if a.draft is not None else default_draft(method, a.model)
    if draft is None:
        raise ValueError(f"--method {method} needs --draft DIR, a draft checkpoint directory")
    if not draft.is_dir():
        raise ValueError(f"--draft {draft}: no such directory")
    problem = drafter.draft_checkpoint_problem(draft)
    if problem is not None:
        raise ValueError(
            f"--draft {draft} is not a draft checkpoint for --method {method}: {problem}"
        )
    return draft
