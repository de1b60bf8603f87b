"""The greedy DFlash iteration captured as one CUDA graph per batch bucket (speculative/chain_graph.py).

The drafter's part of a replay (conventions of speculative/dflash.py; B = k + 1 = the draft's block size):
1. write the pending context features' k/v into every draft layer's cache at rows (= positions)
   start .. start + B - 1: the committed rows start .. L - 1 and, as padding, rows L .. start + B - 1
   with stale features. The padded rows lie inside the block's rows L .. L + B - 1 (count >= 1, so
   start + B - 1 <= L + B - 2), and the block forward of step 2 writes its own k/v at those rows in
   each layer before that layer attends, so the stale k/v is never read,
2. one forward over the block ``[last token, mask x (B - 1)]`` at rows/positions L .. L + B - 1,
   non-causal over the block (a full custom mask) and seeing every context row < L; block row i >= 1
   gives draft i (the token at L + i) by argmax.
Kept for the next iteration: the context features ``draft.fuse`` of the verified rows' auxiliary
target states (rows L .. L + B - 1; the committed ones L .. L + a are written by the next step 1,
which also overwrites the block's k/v left at those rows).
"""
from __future__ import annotations

import torch

from outpace.attention import uniform_paged_metadata
from outpace.models.llama import ModelOutput
from outpace.speculative.chain_graph import ChainIterationGraph


class DFlashChainGraph(ChainIterationGraph):
    def _pending_buffers(self, max_seqs: int, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        draft = self.proposer.draft
        return (torch.zeros(max_seqs, rows, draft.config.layer.hidden_size, dtype=draft.fc.weight.dtype,
                            device=device),)  # context features

    def _draft(self, tables, start, count, last):
        draft, block, bucket = self.proposer.draft, self.k + 1, start.shape[0]
        features = self.pending[0][:bucket].reshape(bucket * block, -1)
        slots = uniform_paged_metadata(tables, start, block, self.runner.pool.block_size).slot_mapping
        draft.write_context(features, self._positions(start, block), slots)
        length = start + count
        masks = torch.full((bucket, block - 1), self.proposer.mask_token_id, dtype=torch.int64, device=start.device)
        full = torch.ones(bucket, block, block, dtype=torch.bool, device=start.device)
        with self._context(tables, length, block, full):
            hidden = draft(torch.cat([last[:, None], masks], dim=1).reshape(-1), self._positions(length, block))
        rows = hidden.view(bucket, block, -1)[:, 1:].reshape(bucket * (block - 1), -1)
        return draft.compute_logits(rows).argmax(-1).view(bucket, block - 1)

    def _next_pending(self, verified: ModelOutput, choice: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.proposer.draft.fuse(verified.aux_hidden_states),)
