"""The greedy EAGLE3 chain iteration captured as one CUDA graph per batch bucket (speculative/chain_graph.py).

The drafter's part of a replay (row convention of speculative/eagle3.py: draft row t reads the token at
t + 1 and a hidden state for t, at position t):
1. draft-extend over the pending rows start .. start + k (fused target states and the token after
   each), padded to ``k + 1`` rows a request. The padded rows L .. start + k write draft KV that
   nothing reads: the extend is causal, so no committed row sees them; each draft step below
   writes its own row before attending to rows up to it; the next extend rewrites rows from L on.
   The output of the last committed row (L - 1) predicts draft 1,
2. ``k - 1`` more greedy steps: the row reading draft j sits at row/position L + j - 1.
Kept for the next iteration: the fused target states of the verified rows and the target's token
after each (the token that row reads in the draft).
"""
from __future__ import annotations

import torch

from outpace.models.llama import ModelOutput
from outpace.speculative.chain_graph import ChainIterationGraph


class Eagle3ChainGraph(ChainIterationGraph):
    def _pending_buffers(self, max_seqs: int, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        draft = self.proposer.draft
        hidden = torch.zeros(max_seqs, rows, draft.config.layer.hidden_size, dtype=draft.fc.weight.dtype,
                             device=device)                                     # fused target states
        tokens = torch.zeros(max_seqs, rows, dtype=torch.int64, device=device)  # token after each row
        return hidden, tokens

    def _draft(self, tables, start, count, last):
        k, draft, target_ids = self.k, self.proposer.draft, self.proposer.target_ids
        bucket = start.shape[0]
        hidden_rows, token_rows = (b[:bucket] for b in self.pending)
        with self._context(tables, start, k + 1):
            out = draft(token_rows.reshape(-1), self._positions(start, k + 1),
                        hidden_rows.reshape(bucket * (k + 1), -1))
        hidden = out.view(bucket, k + 1, -1)[torch.arange(bucket, device=start.device), count - 1]  # [bucket, hidden]
        length = start + count
        drafts = []
        for j in range(1, k + 1):
            drafts.append(target_ids[draft.compute_logits(hidden).argmax(-1)])
            if j < k:
                row = length + j - 1
                with self._context(tables, row, 1):
                    hidden = draft(drafts[-1], row, hidden)
        return torch.stack(drafts, dim=1)

    def _next_pending(self, verified: ModelOutput, choice: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.proposer.draft.fuse_aux(verified.aux_hidden_states), choice
