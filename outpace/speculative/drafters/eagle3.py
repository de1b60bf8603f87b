"""EAGLE3 proposer: chain drafting (topk 1) and EAGLE-2-style tree drafting (topk > 1).

Row convention (shared with the draft's training): draft row t reads the token at t + 1 and a
hidden state for t, at rotary position t, and predicts the token at t + 2. For rows the target
computed, the hidden state is ``fc(aux hidden states)``; for drafted rows it is the draft's own
previous pre-norm output.

State per row: the rows the target committed since the draft last ran ("pending",
speculative/proposer.py ``PendingRows``: at most ``num_steps + 1`` after a verify, one more for each
zero-draft step held since, adaptive drafting holding up to ``HOLD_ROWS`` more), each with the
target's aux states and the token after it. ``fc`` fuses them in the draft-extend, over the whole
window at once: a held step runs no part of the draft, and ``fc``'s weight is read once a forward,
not once a step. Let L be a request's length (its last token sits at position L). ``draft`` first
runs the draft-extend over the window, pending rows L - count .. L - 1 and padding (the padding rows
past L - 1, up to L + width - 2, write KV that nothing reads: the extend is causal, each draft step
writes its own row before reading it, and the next extend rewrites rows from L on); the last pending
row's output predicts draft 1. A held zero-draft step (``hold``) runs no forward and appends its
committed row: the next extend writes its KV as the skipped one would have. Chain: step j >= 2 is
one row at position L + j - 2 reading draft j - 1. Tree: each step expands the ``topk`` best
frontier nodes (rows at position L + step - 2, each attending to its own ancestors), every expanded
node proposes ``topk`` children, and finally the ``num_draft_tokens - 1`` candidates with the
highest cumulative log-probability form the verified tree. Prefill chunks are extended at once
(``absorb``), all but a completed prompt's last row, which stays pending.
"""

from __future__ import annotations

import torch

from outpace.attention import forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.host_copies import to_device
from outpace.layers.decoder import pack_projections
from outpace.models.drafts.eagle3 import load_eagle3_draft, target_capture_ids
from outpace.speculative.chain import chain_drafts, draft_token, position_gumbel
from outpace.speculative.proposer import (
    HOLD_ROWS,
    DecodeRows,
    Drafts,
    DraftShape,
    PendingRows,
    PrefillRows,
    Proposer,
    Verified,
)
from outpace.speculative.rows import prefill_extension
from outpace.speculative.tree import select_tree, tree_log_probs


class Eagle3Proposer(Proposer):
    supports_trees = True
    kv_reads_ahead = 1  # draft row t reads token t + 1
    draft_checkpoint_tensor = "fc.weight"  # the fusion of the target's aux hidden states

    def __init__(
        self,
        spec: SpeculativeConfig,
        target,
        pool: BlockPool,
        max_requests: int,
        dtype: torch.dtype,
        device: str,
        attention_backend: str = "torch",
    ) -> None:
        super().__init__(spec, pool, max_requests, device, attention_backend)
        self.draft_model = load_eagle3_draft(spec.draft, target, dtype, device)
        pack_projections(self.draft_model)  # one matmul for q/k/v and for gate/up
        self.aux_layer_ids = target_capture_ids(self.draft_model.config, target)
        bind_kv_cache(self.draft_model, pool, dtype, device)
        self.vocab_size = target.config.vocab_size
        # draft vocabulary -> target ids, [draft_vocab]
        self.target_ids = self.draft_model.draft_to_target(
            torch.arange(self.draft_model.config.draft_vocab_size, device=self.device)
        )
        self.verify_rows = spec.num_steps + 1  # a verify commits at most this many rows
        held = HOLD_ROWS if spec.adaptive else 0  # only adaptive drafting has zero-draft steps
        cfg = self.draft_model.config
        self.pending = PendingRows(
            max_requests + 1,
            self.verify_rows + held,
            cfg.num_aux * cfg.target_hidden_size,
            dtype,
            self.device,
            self.verify_rows,
        )  # the target's aux states, concatenated (fused in ``_extend``)
        self.hold_window = self.pending.width if held else 0
        self.narrow_window = self.verify_rows if held else 0

    @property
    def lookahead(self) -> int:
        # the verify's and the draft steps' rows; the extend's padding rows reach L + width - 2
        drafts = max(self.spec.num_draft_tokens, (self.spec.num_steps - 1) * self.spec.topk) - 1
        return max(drafts, self.pending.width - 2)

    @property
    def unsettled_rows(self) -> int:
        return self.pending.width  # the pending rows, rewritten by the next draft-extend

    def state(self) -> list[torch.Tensor]:
        return self.pending.tensors()

    def pending_rows(self, shape: DraftShape) -> int:
        return shape.num_steps + 1  # the verify's committed rows (a prefill leaves one)

    # ---- committed rows ------------------------------------------------------------------------
    # The draft layer runs over a prompt's rows eagerly (``absorb``) or as captured (``absorb_layers``,
    # engine/prefill_graphs.py); a completed prompt's last row stays pending either way (``_hold_last_rows``).
    captures_absorb = True

    def absorb(self, prefill: PrefillRows) -> None:
        aux = self.absorb_rows(prefill)
        keep = [1 if f else 0 for f in prefill.final]  # a completed prompt's last row stays pending
        ext = prefill_extension(prefill, keep, self.pool.block_size)
        if ext is not None:
            with ext.context(self.backend):
                self.draft_model(
                    prefill.next_token_ids[ext.rows],
                    ext.positions,
                    self.draft_model.fuse_aux(aux[ext.rows]),
                )
        self._hold_last_rows(prefill, aux)

    def absorb_buffer(self, rows: int) -> torch.Tensor:
        return self.pending.hidden.new_zeros(rows, self.pending.hidden.shape[-1])

    def absorb_rows(self, prefill: PrefillRows) -> torch.Tensor:
        return prefill.aux_hidden_states[prefill.rows]  # [total, num_aux * target hidden]

    def absorb_layers(self, meta, token_ids, next_ids, rows) -> None:
        next_ids = next_ids.flatten()  # [K * P] (no reach: each row's next token alone)
        with forward_context(meta, self.backend):
            self.draft_model(next_ids, meta.token_positions, self.draft_model.fuse_aux(rows))

    def absorb_state(self, prefill: PrefillRows) -> None:
        self._hold_last_rows(prefill, self.absorb_rows(prefill))

    def _hold_last_rows(self, prefill: PrefillRows, aux: torch.Tensor) -> None:
        """Each completed prompt's last row becomes its pending row: its aux states (its row of ``aux``
        [total, num_aux * target hidden], the prefill's rows) and the sampled token after it."""
        last_rows = prefill.last_rows
        done = [i for i, f in enumerate(prefill.final) if f]
        if done:
            # [3, len(done)]: each completed prompt's row, its last row in the prefill, that row's position
            indices, last, start = to_device(
                [
                    [prefill.req_indices[i] for i in done],
                    [last_rows[i] for i in done],
                    [prefill.starts[i] + prefill.counts[i] - 1 for i in done],
                ],
                self.device,
            )
            self.pending.hidden[indices, 0] = aux[last]
            self.pending.tokens[indices, 0] = prefill.next_token_ids[last]
            self.pending.start[indices] = start
            self.pending.count.index_fill_(0, indices, 1)

    def update(self, verified: Verified) -> None:
        rows, b, n = verified.rows, verified.rows.size, self.verify_rows
        committed = verified.committed_rows(n).reshape(-1)  # [b * n]
        # [b * n, num_aux * target hidden]
        aux = verified.aux_hidden_states.index_select(0, committed)
        self.pending.hidden[rows.req_indices, :n] = aux.view(b, n, -1)
        self.pending.tokens[rows.req_indices, :n] = verified.next_tokens(n)
        self.pending.start[rows.req_indices] = rows.lengths
        self.pending.count[rows.req_indices] = verified.result.num_correct_drafts + 1

    def hold(self, verified: Verified) -> None:
        # a zero-draft step's forward is node 0 alone, its one committed row, followed by the bonus token
        self.pending.append(
            verified.rows.req_indices, verified.aux_hidden_states, verified.result.bonus_token_ids
        )

    # ---- drafting ------------------------------------------------------------------------------
    def _extend(self, rows: DecodeRows) -> torch.Tensor:
        """Draft-extend over each row's pending rows; returns the last one's output [b, hidden]."""
        b, pending = rows.size, self.pending
        w = pending.columns(rows.narrow_window)
        start, count = pending.start[rows.req_indices], pending.count[rows.req_indices]
        # (the padding row, which every padded row of a batch appends to, may count more than narrow windows)
        if rows.narrow_window:
            count = count.clamp(max=w)
        with rows.context(start, w, self.backend) as ctx:
            out = self.draft_model(
                pending.tokens[rows.req_indices, :w].reshape(-1),
                ctx.metadata.token_positions,
                self.draft_model.fuse_aux(pending.hidden[rows.req_indices, :w].reshape(b * w, -1)),
            )
        return out.view(b, w, -1)[torch.arange(b, device=out.device), count - 1]

    def _to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[n, draft_vocab] -> [n, vocab] with -inf outside the draft vocabulary."""
        full = draft_logits.new_full((draft_logits.shape[0], self.vocab_size), float("-inf"))
        full[:, self.target_ids] = draft_logits
        return full

    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        hidden = self._extend(rows)
        if shape.is_chain:
            return self._draft_chain(rows, shape.num_steps, hidden)
        return self._draft_tree(rows, shape, hidden)

    def _draft_chain(self, rows: DecodeRows, num_steps: int, hidden: torch.Tensor) -> Drafts:
        tokens, probs = [], []
        for j in range(1, num_steps + 1):
            tokens.append(
                draft_token(
                    rows,
                    j,
                    probs,
                    lambda: self.draft_model.greedy_tokens(hidden, self.target_ids),
                    lambda: self._to_target_logits(self.draft_model.compute_logits(hidden)),
                )
            )
            if j < num_steps:  # the row reading draft j sits at position L + j - 1
                row = rows.lengths + j - 1
                with rows.context(row, 1, self.backend):
                    hidden = self.draft_model(tokens[-1], row, hidden)
        return chain_drafts(rows, tokens, probs)

    def _tree_log_probs(
        self, hidden: torch.Tensor, rows: DecodeRows, depth: int, repeats: int
    ) -> torch.Tensor:
        """[b * repeats, draft_vocab]: what the children at ``depth`` (position L + depth) of ``repeats`` nodes per
        row are ranked by (tree.tree_log_probs), from those nodes' outputs ``hidden`` [b * repeats, hidden]."""
        logits = self.draft_model.compute_logits(hidden)  # [b * repeats, draft_vocab]
        gumbel = position_gumbel(rows, depth, 1, self.vocab_size)  # [b, vocab] or None
        if gumbel is None:
            return torch.log_softmax(logits, -1)
        gumbel = gumbel[:, self.target_ids].repeat_interleave(
            repeats, dim=0
        )  # [b * repeats, draft_vocab]
        return tree_log_probs(logits, rows.sampling.repeat_interleave(repeats), gumbel)

    def _draft_tree(self, rows: DecodeRows, shape: DraftShape, hidden: torch.Tensor) -> Drafts:
        b, k, dev = rows.size, shape.topk, rows.req_indices.device
        logp = self._tree_log_probs(hidden, rows, 1, 1)  # [b, draft_vocab]
        score, tok = logp.topk(k, dim=-1)  # [b, k]
        scores, tokens = [score], [tok]
        parent_cands = [torch.full((b, k), -1, dtype=torch.int64, device=dev)]
        depths = [torch.ones(b, k, dtype=torch.int64, device=dev)]
        frontier = torch.arange(k, device=dev).expand(b, k)  # candidate ids being expanded
        frontier_hidden = hidden[:, None, :].expand(b, k, hidden.shape[-1])  # [b, k, hidden]
        frontier_score, frontier_tok = score, tok
        row_anc = torch.zeros(b, k, 0, dtype=torch.bool, device=dev)  # ancestors among tree rows
        eye = torch.eye(k, dtype=torch.bool, device=dev).expand(b, k, k)
        num_candidates = k
        for step in range(2, shape.num_steps + 1):
            written = (
                step - 2
            ) * k  # tree rows already in the draft KV (rows L .. L + written - 1)
            mask = torch.cat([row_anc, eye], dim=2)  # [b, k, written + k]
            pos = (rows.lengths + step - 2).repeat_interleave(k)  # [b * k]
            with rows.context(rows.lengths + written, k, self.backend, mask):
                out = self.draft_model(
                    self.target_ids[frontier_tok].reshape(-1),
                    pos,
                    frontier_hidden.reshape(b * k, -1),
                ).view(b, k, -1)
            child_logp, child_tok = self._tree_log_probs(
                out.reshape(b * k, -1), rows, step, k
            ).topk(k, dim=-1)  # [b * k, k]
            child_score = (frontier_score[:, :, None] + child_logp.view(b, k, k)).reshape(b, k * k)
            child_tok = child_tok.view(b, k * k)
            scores.append(child_score)
            tokens.append(child_tok)
            parent_cands.append(frontier.repeat_interleave(k, dim=1))
            depths.append(torch.full((b, k * k), step, dtype=torch.int64, device=dev))
            best = child_score.topk(k, dim=1).indices  # [b, k] among the k * k children
            parent_row = best // k  # which frontier row they came from
            frontier = num_candidates + best
            num_candidates += k * k
            frontier_score = torch.gather(child_score, 1, best)
            frontier_tok = torch.gather(child_tok, 1, best)
            frontier_hidden = torch.gather(
                out, 1, parent_row[..., None].expand(-1, -1, out.shape[-1])
            )
            row_anc = torch.gather(mask, 1, parent_row[..., None].expand(-1, -1, mask.shape[2]))
        token_ids, parents, node_depths = select_tree(
            torch.cat(scores, 1),
            self.target_ids[torch.cat(tokens, 1)],
            torch.cat(parent_cands, 1),
            torch.cat(depths, 1),
            rows.last_tokens,
            shape.num_nodes,
        )
        return Drafts(token_ids, parents, node_depths)
