"""A test-only proposer that knows each request's true greedy continuation and proposes it with
random corruptions, in chains or random trees: it drives the speculative loop through every
acceptance length and tree shape, independent of any draft model's quality.

Its request state is each request's whole true sequence (prompt + reference continuation) in a device
row, written when the prompt's prefill completes; drafting reads it at positions L + depth."""

from __future__ import annotations

import torch

from outpace.speculative.chain import chain_drafts
from outpace.speculative.proposer import (
    DecodeRows,
    Drafts,
    DraftShape,
    PrefillRows,
    Proposer,
    Verified,
)


class OracleProposer(Proposer):
    references: dict[tuple[int, ...], list[int]] = {}  # prompt -> its full greedy continuation
    corruption = 0.3
    vocab_size = 200
    supports_trees = True
    # it drafts from the references (SpeculativeConfig.draft None)
    takes_draft_checkpoint = False

    def __init__(
        self, spec, target, pool, max_requests, dtype, device, attention_backend="torch"
    ) -> None:
        super().__init__(spec, pool, max_requests, device, attention_backend)
        self.truth = torch.zeros(
            max_requests + 1,
            target.config.max_position_embeddings + 64,
            dtype=torch.int64,
            device=self.device,
        )
        self.rng = torch.Generator(device=self.device).manual_seed(0)
        self.prompts: dict[int, list[int]] = {}  # row -> the prompt so far (chunks)
        self.committed_rows = 0  # rows reported by absorb and update, for tests

    @property
    def lookahead(self) -> int:
        return self.spec.num_draft_tokens - 1

    def absorb(self, prefill: PrefillRows) -> None:
        assert (
            prefill.rows.numel()
            == prefill.next_token_ids.numel()
            == prefill.token_ids.numel()
            == sum(prefill.counts)
        )
        self.committed_rows += sum(prefill.counts)
        offset = 0
        for row, start, count, final in zip(
            prefill.req_indices, prefill.starts, prefill.counts, prefill.final
        ):
            chunk = prefill.token_ids[offset : offset + count].tolist()
            offset += count
            prompt = (self.prompts.get(row, []) if start else []) + chunk
            self.prompts[row] = prompt
            if final:
                full = prompt + self.references.get(tuple(prompt), [])
                full = full[: self.truth.shape[1]]
                self.truth[row].zero_()
                self.truth[row, : len(full)] = torch.tensor(full, device=self.device)

    def update(self, verified: Verified) -> None:
        self.committed_rows += int(verified.result.num_accepted_tokens.sum())

    def _maybe_wrong(self, tokens: torch.Tensor) -> torch.Tensor:
        wrong = torch.rand(tokens.shape, generator=self.rng, device=self.device) < self.corruption
        noise = torch.randint(self.vocab_size, tokens.shape, generator=self.rng, device=self.device)
        return torch.where(wrong, noise, tokens)

    def _truth(self, rows: DecodeRows, depths: torch.Tensor) -> torch.Tensor:
        """The true token at position L + depth, [b, ...] like ``depths``."""
        pos = (rows.lengths.view(-1, *[1] * (depths.dim() - 1)) + depths).clamp(
            max=self.truth.shape[1] - 1
        )
        truth = self.truth.index_select(0, rows.req_indices)
        return truth.gather(1, pos.reshape(rows.size, -1)).view(depths.shape)

    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        b, n, steps = rows.size, shape.num_nodes, shape.num_steps
        if shape.is_chain:
            depth = torch.arange(1, n, device=self.device).expand(b, -1)
            return chain_drafts(
                rows, list(self._maybe_wrong(self._truth(rows, depth)).unbind(1)), []
            )
        parents = torch.full((b, n), -1, dtype=torch.int64, device=self.device)
        depths = torch.zeros(b, n, dtype=torch.int64, device=self.device)
        for i in range(1, n):  # a random parent among the earlier nodes not at the depth limit
            allowed = (depths[:, :i] < steps).float()
            p = torch.multinomial(allowed, 1, generator=self.rng)[:, 0]
            parents[:, i] = p
            depths[:, i] = depths.gather(1, p[:, None])[:, 0] + 1
        ids = torch.randint(self.vocab_size, (b, n), generator=self.rng, device=self.device)
        ids[:, 0] = rows.last_tokens
        node = torch.zeros(b, dtype=torch.int64, device=self.device)
        for _ in range(steps):  # plant the truth along a random root path
            children = (parents == node[:, None]).float()
            has = children.sum(1) > 0
            child = torch.multinomial(children + (~has[:, None]).float(), 1, generator=self.rng)[
                :, 0
            ]
            planted = self._maybe_wrong(self._truth(rows, depths.gather(1, child[:, None])[:, 0]))
            ids = torch.where(
                has[:, None] & (torch.arange(n, device=self.device) == child[:, None]),
                planted[:, None],
                ids,
            )
            node = torch.where(has, child, node)
        return Drafts(ids, parents, depths)
