"""Pieces every chain drafter shares: choosing a draft token from draft logits (greedy, or sampled
from the request's processed distribution q, which speculative sampling then needs), and packing
the drafts into a chain ``DraftBatch``."""
from __future__ import annotations

import torch

from outpace.request import DRAFT, Request, request_keys
from outpace.layers.sampler import SamplingTensors, logits_to_probs, sample_from_probs
from outpace.speculative.proposer import DraftBatch
from outpace.speculative.tree import chain_tree


class ChainDrafts:
    """Accumulates one draft token per step for a batch of requests."""

    def __init__(self, requests: list[Request], device: torch.device) -> None:
        self.requests = requests
        self.device = device
        self.st = SamplingTensors.from_params([r.params for r in requests], device)
        self.tokens: list[torch.Tensor] = []   # each [batch]
        self.probs: list[torch.Tensor] = []    # each [batch, vocab], only when some request samples

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [batch, vocab] over the target vocabulary -> the next draft token [batch]."""
        if self.st.all_greedy:
            token = logits.argmax(-1)
        else:
            q = logits_to_probs(logits, self.st)
            # draft j (this step's) sits at position L + j, L the last token's position
            positions = [r.num_computed_tokens + len(self.tokens) + 1 for r in self.requests]
            token = sample_from_probs(q, request_keys(self.requests, positions, DRAFT, self.device))
            self.probs.append(q)
        self.tokens.append(token)
        return token

    def add(self, token: torch.Tensor) -> None:
        """A draft chosen without a distribution (n-gram): q is one-hot, so no probs are kept."""
        self.tokens.append(token)

    def batch(self) -> DraftBatch:
        last = torch.tensor([r.token_ids[-1] for r in self.requests], device=self.device)
        token_ids = torch.stack([last] + self.tokens, dim=1)  # [batch, num_drafts + 1]
        parents, depths = chain_tree(len(self.requests), token_ids.shape[1], self.device)
        probs = torch.stack(self.probs, dim=1) if self.probs else None
        return DraftBatch(token_ids, parents, depths, is_chain=True, draft_probs=probs)
