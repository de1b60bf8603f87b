"""Pieces every chain drafter shares: choosing a draft token from draft logits (greedy, sampled from the request's
processed distribution q, which speculative sampling then needs, or for a seeded row the Gumbel-max guess with the
noise of the position: layers/sampler.py), and packing the drafts into a chain ``Drafts``."""

from __future__ import annotations

from typing import Callable

import torch

from outpace.layers.argmax import argmax_last
from outpace.layers.sampler import draw_gumbel, logits_to_probs, sample_from_probs
from outpace.request import DRAFT, SAMPLE
from outpace.speculative.proposer import DecodeRows, Drafts
from outpace.speculative.tree import chain_tree


def position_gumbel(rows: DecodeRows, first: int, count: int, vocab: int) -> torch.Tensor | None:
    """[b * count, vocab] (row-major: row s's positions together) the seeded noise of the tokens at positions
    L + first .. L + first + count - 1 of each row (layers/sampler.py: the noise of the position's own
    sample, whoever computes it), or None when no row is seeded."""
    if not rows.sampling.any_seeded:
        return None
    keys = torch.stack([rows.keys(first + i, SAMPLE) for i in range(count)], dim=1)  # [b, count]
    return draw_gumbel(keys.reshape(-1), vocab)


def choose_chain(
    logits: torch.Tensor, rows: DecodeRows, j: int, probs: list[torch.Tensor]
) -> torch.Tensor:
    """Draft j (at position L + j) from logits [b, vocab] over the target vocabulary -> [b]: the argmax
    when every row is greedy; else drawn from each row's processed distribution q, appended to ``probs``.
    A seeded row's q is the point mass at its Gumbel-max sample under the draft, with the noise the target
    samples position L + j with: where the draft agrees with the target, so does the draft token."""
    if rows.sampling.all_greedy:
        return argmax_last(logits)
    q = logits_to_probs(
        logits, rows.sampling, position_gumbel(rows, j, 1, logits.shape[-1])
    )  # [b, vocab]
    probs.append(q)
    return sample_from_probs(q, rows.keys(j, DRAFT))


def draft_token(
    rows: DecodeRows,
    j: int,
    probs: list[torch.Tensor],
    greedy: Callable[[], torch.Tensor],
    logits: Callable[[], torch.Tensor],
) -> torch.Tensor:
    """Draft j [b] from a draft head: ``greedy()`` (the argmax token ids, which a head gives in one launch
    without writing its logits: layers/fused_decoder.py ``head_argmax_tokens``) when every row is greedy,
    else ``choose_chain`` of ``logits()`` [b, vocab]."""
    if rows.sampling.all_greedy:
        return greedy()
    return choose_chain(logits(), rows, j, probs)


def chain_drafts(rows: DecodeRows, tokens: list[torch.Tensor], probs: list[torch.Tensor]) -> Drafts:
    """The chain [last token, tokens[0], ...] of every row (each token [b]), with the q of sampled drafts."""
    token_ids = (
        torch.stack([rows.last_tokens] + tokens, dim=1) if tokens else rows.last_tokens[:, None]
    )  # [b, num_drafts + 1]
    parents, depths = chain_tree(rows.size, token_ids.shape[1], token_ids.device)
    return Drafts(token_ids, parents, depths, torch.stack(probs, dim=1) if probs else None)
