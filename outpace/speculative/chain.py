"""Pieces every chain drafter shares: choosing a draft token from draft logits (greedy, or sampled from the request's
processed distribution q, which speculative sampling then needs), and packing the drafts into a chain ``Drafts``."""
from __future__ import annotations

import torch

from outpace.layers.sampler import logits_to_probs, sample_from_probs
from outpace.request import DRAFT
from outpace.speculative.proposer import DecodeRows, Drafts
from outpace.speculative.tree import chain_tree


def choose_chain(logits: torch.Tensor, rows: DecodeRows, j: int, probs: list[torch.Tensor]) -> torch.Tensor:
    """Draft j (at position L + j) from logits [b, vocab] over the target vocabulary -> [b]: the argmax
    when every row is greedy; else drawn from each row's processed distribution q, appended to ``probs``."""
    if rows.sampling.all_greedy:
        return logits.argmax(-1)
    q = logits_to_probs(logits, rows.sampling)                                   # [b, vocab]
    probs.append(q)
    return sample_from_probs(q, rows.keys(j, DRAFT))


def chain_drafts(rows: DecodeRows, tokens: list[torch.Tensor], probs: list[torch.Tensor]) -> Drafts:
    """The chain [last token, tokens[0], ...] of every row (each token [b]), with the q of sampled drafts."""
    token_ids = torch.stack([rows.last_tokens] + tokens, dim=1)                   # [b, num_drafts + 1]
    parents, depths = chain_tree(rows.size, token_ids.shape[1], token_ids.device)
    return Drafts(token_ids, parents, depths, torch.stack(probs, dim=1) if probs else None)
