"""A test-only proposer that knows each request's true greedy continuation and proposes it with
random corruptions, in chains or random trees: it drives the speculative loop through every
acceptance length and tree shape, independent of any draft model's quality."""
from __future__ import annotations

import random

import torch

from outpace.speculative.proposer import CommittedRows, DraftBatch, Proposer
from outpace.speculative.tree import chain_tree


class OracleProposer(Proposer):
    references: dict[tuple[int, ...], list[int]] = {}  # prompt -> its full greedy continuation
    corruption = 0.3
    vocab_size = 200

    def __init__(self, spec, target, pool, dtype, device, attention_backend="torch") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.rng = random.Random(0)
        self.observed_rows = 0

    @property
    def lookahead(self) -> int:
        return self.spec.num_draft_tokens - 1

    def release(self, request_id: str) -> None:
        pass

    def observe(self, committed: CommittedRows) -> None:
        assert committed.rows.numel() == committed.next_token_ids.numel() == sum(committed.counts)
        self.observed_rows += sum(committed.counts)

    def _truth(self, req, depth: int) -> int:
        full = list(req.prompt_token_ids) + self.references[tuple(req.prompt_token_ids)]
        i = req.num_tokens + depth - 1
        return full[i] if i < len(full) else 0

    def _maybe_wrong(self, token: int) -> int:
        return self.rng.randrange(self.vocab_size) if self.rng.random() < self.corruption else token

    def propose(self, requests) -> DraftBatch:
        n, steps = self.spec.num_draft_tokens, self.spec.num_steps
        if self.spec.topk == 1:
            ids = [[r.token_ids[-1]] + [self._maybe_wrong(self._truth(r, d)) for d in range(1, n)] for r in requests]
            parents, depths = chain_tree(len(requests), n, self.device)
            return DraftBatch(torch.tensor(ids, device=self.device), parents, depths, is_chain=True)
        all_ids, all_parents, all_depths = [], [], []
        for r in requests:
            parents, depths = [-1], [0]
            for i in range(1, n):
                p = self.rng.choice([j for j in range(i) if depths[j] < steps])
                parents.append(p)
                depths.append(depths[p] + 1)
            ids = [r.token_ids[-1]] + [self.rng.randrange(self.vocab_size) for _ in range(1, n)]
            node = 0
            while True:  # plant the truth along a random root path
                children = [c for c in range(1, n) if parents[c] == node]
                if not children:
                    break
                node = self.rng.choice(children)
                ids[node] = self._maybe_wrong(self._truth(r, depths[node]))
            all_ids.append(ids)
            all_parents.append(parents)
            all_depths.append(depths)
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=self.device)  # noqa: E731
        return DraftBatch(t(all_ids), t(all_parents), t(all_depths), is_chain=False)
