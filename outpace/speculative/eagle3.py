"""EAGLE3 proposer: chain drafting (topk 1) and EAGLE-2-style tree drafting (topk > 1).

Row convention (shared with the draft's training): draft row t reads the token at t + 1 and a
hidden state for t, at rotary position t, and predicts the token at t + 2. For rows the target
computed the hidden state is ``fc(aux hidden states)``; for drafted rows it is the draft's own
previous pre-norm output.

Each propose first runs the *draft-extend* over the rows the target committed since the last
propose (prefill chunks, or the previous verify's accepted path): this writes their draft KV and
its last row predicts the first draft token. Let L be the request's committed length (its last
token, the previous bonus, sits at position L and is not in the KV yet). Chain: step j >= 2 is one
row at position L + j - 2 reading draft j - 1 (draft j - 1 sits at position L + j - 1). Tree: each step expands the ``topk`` best frontier
nodes (rows at position L + step - 2, all attending to their own ancestors), every expanded node
proposes ``topk`` children, and finally the ``num_draft_tokens - 1`` candidates with the highest
cumulative log-probability form the verified tree.
"""
from __future__ import annotations

import torch

from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.request import Request
from outpace.models.eagle3 import load_eagle3_draft
from outpace.speculative.chain import ChainDrafts
from outpace.models.llama import pack_projections
from outpace.speculative.proposer import CommittedRows, DraftBatch, Proposer, merge_pending, take_excess_rows
from outpace.speculative.rows import draft_rows, row_positions
from outpace.speculative.tree import select_tree


class Eagle3Proposer(Proposer):
    def __init__(self, spec: SpeculativeConfig, target, pool: BlockPool, dtype: torch.dtype, device: str,
                 attention_backend: str = "torch") -> None:
        super().__init__(spec, pool, device, attention_backend)
        self.draft = load_eagle3_draft(spec.draft, target, dtype, device)
        pack_projections(self.draft)  # one matmul for q/k/v and for gate/up
        self.aux_layer_ids = self.draft.config.capture_layer_ids(target.config.num_hidden_layers)
        bind_kv_cache(self.draft, pool, dtype, device)
        self.vocab_size = target.config.vocab_size
        # draft vocabulary -> target ids, [draft_vocab]
        self.target_ids = self.draft.draft_to_target(torch.arange(self.draft.config.draft_vocab_size,
                                                                  device=self.device))
        # request id -> list of (fused hidden [m, hidden], next tokens [m], first position)
        self._pending: dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}

    @property
    def lookahead(self) -> int:
        s = self.spec
        return max(s.num_draft_tokens, (s.num_steps - 1) * s.topk) - 1

    def release(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    # ---- pending rows, handed to and from the captured iteration (speculative/eagle3_graph.py) ----------
    def num_pending_rows(self, request_id: str) -> int:
        return sum(chunk[1].shape[0] for chunk in self._pending.get(request_id, []))

    def take_pending(self, request_id: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Remove and return a request's pending rows: (fused hidden [m, hidden], next tokens [m], first row)."""
        return merge_pending(self._pending.pop(request_id))

    def put_pending(self, request_id: str, hidden: torch.Tensor, tokens: torch.Tensor, start: int) -> None:
        self._pending[request_id] = [(hidden, tokens, start)]

    def observe(self, committed: CommittedRows) -> None:
        with torch.inference_mode():
            fused = self.draft.fuse_aux(committed.aux_hidden_states[committed.rows])  # [total, hidden]
        offset = 0
        for req, start, count in zip(committed.requests, committed.starts, committed.counts):
            rows = slice(offset, offset + count)
            self._pending.setdefault(req.request_id, []).append(
                (fused[rows], committed.next_token_ids[rows], start))
            offset += count
        self._absorb_excess(committed.requests)

    def _absorb_excess(self, requests: list[Request]) -> None:
        """Extend the draft now over every pending row but a request's last ``num_draft_tokens`` (the
        prompt's rows after a prefill chunk), so that the rows left pending fit the captured
        iteration's buffers (speculative/eagle3_graph.py) and the first decode step can replay it. The two
        extends (these rows now, the rest when drafting) compute what one extend over all would."""
        reqs, parts = take_excess_rows(self._pending, requests, self.spec.num_draft_tokens)
        if not reqs:
            return
        starts, counts = [p[2] for p in parts], [p[1].shape[0] for p in parts]
        with torch.inference_mode():
            self._forward(reqs, starts, counts, torch.cat([p[1] for p in parts]),
                          row_positions(starts, counts, self.device), torch.cat([p[0] for p in parts]))

    # ---- drafting ---------------------------------------------------------------------------
    def _forward(self, requests: list[Request], num_cached: list[int], query_lens: list[int],
                 token_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                 custom_masks=None) -> torch.Tensor:
        with draft_rows(self.pool, self.backend, requests, num_cached, query_lens, self.device, custom_masks):
            return self.draft(token_ids, positions, hidden)

    def _extend(self, requests: list[Request]) -> torch.Tensor:
        """Draft-extend over every request's pending rows; returns the last row's output [batch, hidden]."""
        hidden, tokens, starts = zip(*(merge_pending(self._pending.pop(r.request_id)) for r in requests))
        counts = [t.shape[0] for t in tokens]
        out = self._forward(requests, starts, counts, torch.cat(tokens), row_positions(starts, counts, self.device),
                            torch.cat(hidden))
        last = torch.tensor(counts).cumsum(0) - 1
        return out[last.to(self.device)]

    def _to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[n, draft_vocab] -> [n, vocab] with -inf outside the draft vocabulary."""
        full = draft_logits.new_full((draft_logits.shape[0], self.vocab_size), float("-inf"))
        full[:, self.target_ids] = draft_logits
        return full

    def propose(self, requests: list[Request]) -> DraftBatch:
        with torch.inference_mode():
            last = self._extend(requests)
            if self.spec.topk == 1:
                return self._propose_chain(requests, last)
            return self._propose_tree(requests, last)

    def _propose_chain(self, requests: list[Request], hidden: torch.Tensor) -> DraftBatch:
        drafts = ChainDrafts(requests, self.device)
        base = [r.num_computed_tokens for r in requests]  # L: the last token's position
        for j in range(1, self.spec.num_steps + 1):
            token = drafts.choose(self._to_target_logits(self.draft.compute_logits(hidden)))
            if j < self.spec.num_steps:  # the row reading draft j sits at position L + j - 1
                rows = [p + j - 1 for p in base]
                hidden = self._forward(requests, rows, [1] * len(requests), token,
                                       torch.tensor(rows, device=self.device), hidden)
        return drafts.batch()

    def _propose_tree(self, requests: list[Request], hidden: torch.Tensor) -> DraftBatch:
        b, k, steps = len(requests), self.spec.topk, self.spec.num_steps
        dev = self.device
        base = [r.num_computed_tokens for r in requests]
        logp = torch.log_softmax(self.draft.compute_logits(hidden), -1)     # [batch, draft_vocab]
        score, tok = logp.topk(k, dim=-1)                                    # [batch, k]
        scores, tokens = [score], [tok]
        parent_cands = [torch.full((b, k), -1, dtype=torch.int64, device=dev)]
        depths = [torch.ones(b, k, dtype=torch.int64, device=dev)]
        frontier = torch.arange(k, device=dev).expand(b, k)                  # candidate ids being expanded
        frontier_hidden = hidden[:, None, :].expand(b, k, hidden.shape[-1])  # [batch, k, hidden]
        frontier_score, frontier_tok = score, tok
        row_anc = torch.zeros(b, k, 0, dtype=torch.bool, device=dev)         # ancestors among tree rows
        eye = torch.eye(k, dtype=torch.bool, device=dev).expand(b, k, k)
        num_candidates = k
        for step in range(2, steps + 1):
            written = (step - 2) * k  # tree rows already in the draft KV (rows L .. L + written - 1)
            mask = torch.cat([row_anc, eye], dim=2)                          # [batch, k, written + k]
            positions = torch.tensor(base, device=dev).repeat_interleave(k) + step - 2
            out = self._forward(requests, [p + written for p in base], [k] * b,
                                self.target_ids[frontier_tok].reshape(-1), positions,
                                frontier_hidden.reshape(b * k, -1), list(mask.unbind(0)))
            out = out.view(b, k, -1)
            child_logp, child_tok = torch.log_softmax(self.draft.compute_logits(out.reshape(b * k, -1)), -1) \
                .topk(k, dim=-1)                                             # [batch * k, k]
            child_score = (frontier_score[:, :, None] + child_logp.view(b, k, k)).reshape(b, k * k)
            child_tok = child_tok.view(b, k * k)
            scores.append(child_score)
            tokens.append(child_tok)
            parent_cands.append(frontier.repeat_interleave(k, dim=1))
            depths.append(torch.full((b, k * k), step, dtype=torch.int64, device=dev))
            best = child_score.topk(k, dim=1).indices                        # [batch, k] among the k * k children
            parent_row = best // k                                           # which frontier row they came from
            frontier = num_candidates + best
            num_candidates += k * k
            frontier_score = torch.gather(child_score, 1, best)
            frontier_tok = torch.gather(child_tok, 1, best)
            frontier_hidden = torch.gather(out, 1, parent_row[..., None].expand(-1, -1, out.shape[-1]))
            row_anc = torch.gather(mask, 1, parent_row[..., None].expand(-1, -1, mask.shape[2]))
        last_tokens = torch.tensor([r.token_ids[-1] for r in requests], device=dev)
        token_ids, parents, node_depths = select_tree(
            torch.cat(scores, 1), self.target_ids[torch.cat(tokens, 1)], torch.cat(parent_cands, 1),
            torch.cat(depths, 1), last_tokens, self.spec.num_draft_tokens)
        return DraftBatch(token_ids, parents, node_depths, is_chain=False)
