"""DFlash proposer: one non-causal draft forward per step proposes a whole block of drafts.

Let L be a request's committed length: its last token (the previous bonus) sits at position L and
has no KV yet. The draft keeps paged KV at the same rows as the target (same block tables):
- ``observe`` turns the target rows committed in a step (prefill chunks, a verify's accepted path)
  into context features ``c_t = hidden_norm(fc(aux_t))`` and keeps them per request (pending);
- ``propose`` first writes the pending rows' k/v into every draft layer's cache at their rows
  (k_proj/v_proj of c, k_norm, rotary at the row's position), so rows 0 .. L - 1 hold context;
  then one forward over the block ``[token L, mask x (B - 1)]`` at rows/positions L .. L + B - 1,
  non-causal over the block (a full custom mask) and seeing every cached context row. Block row
  i >= 1 predicts the token at L + i: B - 1 drafts, verified as a chain of B = num_draft_tokens.
The block's own KV lands at rows L .. L + B - 1; the rows that become committed are overwritten by
the next context write, the others lie past the next block's start and are never read.
Greedy decode batches can run the whole iteration as one CUDA graph (speculative/dflash_graph.py), which
takes and hands back the pending rows (``take_pending`` / ``put_pending``).
"""
from __future__ import annotations

import torch

from outpace.attention import build_paged_metadata
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import ConfigError, SpeculativeConfig
from outpace.request import Request
from outpace.models.dflash import load_dflash_draft
from outpace.speculative.chain import ChainDrafts
from outpace.models.llama import pack_projections
from outpace.speculative.proposer import CommittedRows, DraftBatch, Proposer, merge_pending, take_excess_rows
from outpace.speculative.rows import draft_rows, row_positions


class DFlashProposer(Proposer):
    def __init__(self, spec: SpeculativeConfig, target, pool: BlockPool, dtype: torch.dtype, device: str,
                 attention_backend: str = "torch") -> None:
        super().__init__(spec, pool, device, attention_backend)
        self.draft = load_dflash_draft(spec.draft, target, dtype, device)
        pack_projections(self.draft)  # one matmul for q/k/v and for gate/up
        cfg = self.draft.config
        self.block_size = cfg.block_size
        if spec.topk != 1:
            raise ConfigError(f"SpeculativeConfig.topk={spec.topk} is invalid for dflash: must be 1 (a DFlash "
                              "block is verified as a chain)")
        if spec.num_draft_tokens != cfg.block_size:
            raise ConfigError(f"SpeculativeConfig.num_steps={spec.num_steps} is invalid for the DFlash draft "
                              f"{spec.draft}: its block_size is {cfg.block_size}, and num_steps + 1 "
                              f"(= {spec.num_steps + 1}) must equal block_size; use num_steps={cfg.block_size - 1}")
        self.mask_token_id = cfg.mask_token_id
        self.aux_layer_ids = cfg.capture_layer_ids
        bind_kv_cache(self.draft, pool, dtype, device)
        self._block_mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool, device=self.device)
        # request id -> list of (context features [m, hidden], position of the first row)
        self._pending: dict[str, list[tuple[torch.Tensor, int]]] = {}

    @property
    def lookahead(self) -> int:
        return self.block_size - 1

    def release(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    # ---- pending rows, handed to and from the captured iteration (speculative/dflash_graph.py) ----------
    def num_pending_rows(self, request_id: str) -> int:
        return sum(chunk[0].shape[0] for chunk in self._pending.get(request_id, []))

    def take_pending(self, request_id: str) -> tuple[torch.Tensor, int]:
        """Remove and return a request's pending rows: (context features [m, hidden], first row)."""
        return merge_pending(self._pending.pop(request_id))

    def put_pending(self, request_id: str, features: torch.Tensor, start: int) -> None:
        self._pending[request_id] = [(features, start)]

    def observe(self, committed: CommittedRows) -> None:
        with torch.inference_mode():
            features = self.draft.fuse(committed.aux_hidden_states[committed.rows])  # [total, hidden]
        offset = 0
        for req, start, count in zip(committed.requests, committed.starts, committed.counts):
            self._pending.setdefault(req.request_id, []).append((features[offset:offset + count], start))
            offset += count
        # Every pending row but a request's last block_size goes into the draft KV now (the prompt's
        # rows after a prefill chunk): the rows left pending fit the captured iteration's buffers
        # (speculative/dflash_graph.py), so the first decode step can replay it.
        self._write_rows(*take_excess_rows(self._pending, committed.requests, self.block_size))

    # ---- drafting ---------------------------------------------------------------------------
    def propose(self, requests: list[Request]) -> DraftBatch:
        with torch.inference_mode():
            self._write_context(requests)
            logits = self._block_logits(requests)  # [batch, B - 1, vocab]
            drafts = ChainDrafts(requests, self.device)
            for position in logits.unbind(1):  # every block position drafts independently of the others
                drafts.choose(position)
            return drafts.batch()

    def _write_context(self, requests: list[Request]) -> None:
        """Write every request's pending context rows into the draft KV (one pass for the batch)."""
        reqs, chunks = [], []
        for r in requests:
            pending = self._pending.pop(r.request_id, [])
            if not pending:
                continue
            chunk = merge_pending(pending)
            # NOTE: pending rows are contiguous and end right before the block (the row at L).
            assert chunk[1] + chunk[0].shape[0] == r.num_computed_tokens, (r.request_id, chunk, r.num_computed_tokens)
            reqs.append(r)
            chunks.append(chunk)
        self._write_rows(reqs, chunks)

    def _write_rows(self, requests: list[Request], chunks: list[tuple[torch.Tensor, int]]) -> None:
        """Write chunk i's context rows (features [m, hidden], first row) of request i into the draft KV."""
        if not requests:
            return
        starts, counts = [c[1] for c in chunks], [c[0].shape[0] for c in chunks]
        meta = build_paged_metadata([self.pool.table(r.request_id) for r in requests], starts, counts,
                                    self.pool.block_size, self.device)
        with torch.inference_mode():
            self.draft.write_context(torch.cat([c[0] for c in chunks]), row_positions(starts, counts, self.device),
                                     meta.slot_mapping)

    def _block_logits(self, requests: list[Request]) -> torch.Tensor:
        """One draft forward over every request's block -> logits of rows 1 .. B - 1, [batch, B - 1, vocab]."""
        b, n = len(requests), self.block_size
        base = [r.num_computed_tokens for r in requests]  # L: the block's first row and position
        ids = torch.full((b, n), self.mask_token_id, dtype=torch.int64)
        ids[:, 0] = torch.tensor([r.token_ids[-1] for r in requests], dtype=torch.int64)
        positions = (torch.tensor(base)[:, None] + torch.arange(n)).reshape(-1)
        with draft_rows(self.pool, self.backend, requests, base, [n] * b, self.device, [self._block_mask] * b):
            hidden = self.draft(ids.reshape(-1).to(self.device), positions.to(self.device))  # [b * n, hidden]
        rows = hidden.view(b, n, -1)[:, 1:].reshape(b * (n - 1), -1)
        return self.draft.compute_logits(rows).view(b, n - 1, -1)
