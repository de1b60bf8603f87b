"""Runs one forward over a scheduled batch and samples the next tokens.

Host work per step: build the flat input tensors and attention metadata once; device work:
one forward, logits only for rows that need them, sampling; one host sync (``tolist``) to hand
the sampled ids back to the engine.
"""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.registry import get_backend
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.engine.scheduler import ScheduledRequest, StepResult
from outpace.layers.sampler import SamplingTensors, sample


class ModelRunner:
    def __init__(self, model: nn.Module, pool: BlockPool, kv_dtype: torch.dtype, device: str,
                 attention_backend: str = "torch") -> None:
        self.model = model
        self.pool = pool
        self.device = torch.device(device)
        self.backend = get_backend(attention_backend)
        # NOTE: only the decoder stack: MTP layers belong to the MTP proposer, which binds their KV.
        self.kv_caches = bind_kv_cache(model.model, pool.num_blocks, pool.block_size, kv_dtype, device)

    def forward(self, token_ids: list[list[int]], positions: list[list[int]], batch: list[ScheduledRequest]):
        """Forward the given new tokens of each scheduled request; returns the model output."""
        meta = build_paged_metadata(
            [self.pool.table(s.request.request_id) for s in batch],
            [s.request.num_computed_tokens for s in batch],
            [len(t) for t in token_ids], self.pool.block_size, self.device)
        ids = torch.tensor([t for seq in token_ids for t in seq], dtype=torch.int64).to(self.device)
        pos = torch.tensor([p for seq in positions for p in seq], dtype=torch.int64).to(self.device)
        with torch.inference_mode(), forward_context(meta, self.backend):
            return self.model(ids, pos)

    def execute(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        """Forward every scheduled chunk; sample a token for each request whose chunk completes its
        sequence (none for the others, still in chunked prefill)."""
        token_ids, positions = [], []
        for s in batch:
            start = s.request.num_computed_tokens
            token_ids.append(s.request.token_ids[start:start + s.num_new_tokens])
            positions.append(list(range(start, start + s.num_new_tokens)))
        out = self.forward(token_ids, positions, batch)
        ends = torch.tensor([len(t) for t in token_ids]).cumsum(0) - 1
        needs = [i for i, s in enumerate(batch) if s.completes_sequence]
        results = [StepResult([], s.num_new_tokens) for s in batch]
        if not needs:
            return results
        with torch.inference_mode():
            logits = self.model.compute_logits(out.hidden_states[ends[needs].to(self.device)])  # [n, vocab]
            reqs = [batch[i].request for i in needs]
            tensors = SamplingTensors.from_params([r.params for r in reqs], self.device)
            tokens = sample(logits, tensors, [r.generator for r in reqs]).tolist()
        for i, t in zip(needs, tokens):
            results[i].new_token_ids.append(t)
        return results
