"""The whole EAGLE3 chain iteration in one CUDA graph per batch bucket (greedy requests).

One replay runs, for every request of the batch:
1. draft-extend over the rows the previous verify committed (padded to ``k + 1`` rows a request;
   rows past the committed ones write draft KV that the next rows overwrite before anything reads it),
2. ``k`` greedy draft steps,
3. the target's verify forward over ``[last token, draft 1 .. draft k]`` and its greedy tokens,
4. acceptance (the longest prefix of drafts equal to the target's tokens),
5. the next iteration's pending rows: the fused target states of the verified rows and the token
   that follows each (the target's own choice), with the count of committed rows.
The state stays in static device buffers between replays, so consecutive iterations need from the
host only new block-table entries; the host reads back ``k + 2`` integers per request per step.

The state hands over to the eager proposer (``Eagle3Proposer``'s pending rows) whenever the
batch changes or an eager step runs, and back again: ``_export`` / ``_import``.

Oracle acceptance (benchmarks only, ``oracle_rates``): step 4 draws the number of accepted drafts
so that draft position j is accepted with probability ``oracle_rates[j]`` (rates measured on a
real pair), instead of comparing tokens; everything else runs unchanged. Output tokens are then
not the target's greedy output.
"""
from __future__ import annotations

from typing import Sequence

import torch

from outpace.attention import forward_context, uniform_paged_metadata
from outpace.engine.cuda_graphs import CapturedCall, bucket_for
from outpace.engine.request import Request
from outpace.engine.runner import ModelRunner
from outpace.engine.scheduler import ScheduledRequest, StepResult
from outpace.spec.eagle3 import Eagle3Proposer


class Eagle3ChainGraph:
    def __init__(self, runner: ModelRunner, proposer: Eagle3Proposer, oracle_rates: Sequence[float] | None = None):
        self.runner, self.proposer = runner, proposer
        self.k = proposer.spec.num_steps
        self.buckets = runner.graph_buckets
        self._tables = runner.graph_tables
        dev, max_seqs, rows = runner.device, max(self.buckets), self.k + 1
        hidden = proposer.draft.config.layer.hidden_size
        dtype = proposer.draft.fc.weight.dtype
        self.pend_hidden = torch.zeros(max_seqs, rows, hidden, dtype=dtype, device=dev)  # fused target states
        self.pend_tokens = torch.zeros(max_seqs, rows, dtype=torch.int64, device=dev)     # token after each row
        self.pend_start = torch.zeros(max_seqs, dtype=torch.int64, device=dev)            # first pending row
        self.pend_count = torch.ones(max_seqs, dtype=torch.int64, device=dev)             # pending rows, >= 1
        self.valid = torch.zeros(max_seqs, dtype=torch.bool, device=dev)                  # False: padding
        self.out_tokens = torch.zeros(max_seqs, rows, dtype=torch.int64, device=dev)      # target's token per row
        self.num_accepted = torch.zeros(max_seqs, dtype=torch.int64, device=dev)
        self.oracle_rates = (None if oracle_rates is None else
                             torch.tensor(oracle_rates, dtype=torch.float32, device=dev).cummin(0).values)
        if self.oracle_rates is not None and self.oracle_rates.numel() != self.k:
            raise ValueError(f"oracle_rates has {self.oracle_rates.numel()} rates, the chain has {self.k} drafts")
        self._resident: list[str] = []     # request ids in buffer order
        self._host_state: list[tuple[int, int]] = []  # (first pending row, pending rows) per resident request
        self._calls = {b: CapturedCall(lambda b=b: self._iteration(b), dev, runner.graph_memory)
                       for b in sorted(self.buckets, reverse=True)}

    # ---- the captured iteration ---------------------------------------------------------------
    def _iteration(self, bucket: int) -> None:
        k, draft, target = self.k, self.proposer.draft, self.runner.model
        block_size, backend = self.runner.pool.block_size, self.runner.backend
        tables = self._tables.device[:bucket]
        dev = tables.device
        seqs, steps = torch.arange(bucket, device=dev), torch.arange(k + 1, device=dev)
        start, count = self.pend_start[:bucket], self.pend_count[:bucket]
        with torch.inference_mode():
            # 1. draft-extend over the pending rows
            with forward_context(uniform_paged_metadata(tables, start, k + 1, block_size), backend):
                out = draft(self.pend_tokens[:bucket].reshape(-1), (start[:, None] + steps).reshape(-1),
                            self.pend_hidden[:bucket].reshape(bucket * (k + 1), -1))
            hidden = out.view(bucket, k + 1, -1)[seqs, count - 1]               # [bucket, hidden]
            last = self.pend_tokens[:bucket][seqs, count - 1]                   # [bucket] token at position L
            length = start + count                                              # L
            # 2. k greedy draft steps; the row reading draft j sits at position L + j - 1
            drafts = []
            for j in range(1, k + 1):
                drafts.append(self.proposer.target_ids[draft.compute_logits(hidden).argmax(-1)])
                if j < k:
                    row = length + j - 1
                    with forward_context(uniform_paged_metadata(tables, row, 1, block_size), backend):
                        hidden = draft(drafts[-1], row, hidden)
            # 3. verify
            tree = torch.stack([last, *drafts], dim=1)                          # [bucket, k + 1]
            with forward_context(uniform_paged_metadata(tables, length, k + 1, block_size), backend):
                verified = target(tree.reshape(-1), (length[:, None] + steps).reshape(-1))
            choice = target.compute_logits(verified.hidden_states).argmax(-1).view(bucket, k + 1)
            # 4. acceptance
            if self.oracle_rates is None:
                accepted = (tree[:, 1:] == choice[:, :k]).cumprod(dim=1).sum(dim=1)
            else:
                accepted = (torch.rand(bucket, 1, device=dev) < self.oracle_rates).sum(dim=1)
            # 5. state for the next iteration (padding rows stay at row 0)
            valid = self.valid[:bucket]
            self.pend_hidden[:bucket].copy_(draft.fuse_aux(verified.aux_hidden_states).view(bucket, k + 1, -1))
            self.pend_tokens[:bucket].copy_(choice)
            self.pend_start[:bucket].copy_(torch.where(valid, length, 0))
            self.pend_count[:bucket].copy_(torch.where(valid, accepted + 1, 1))
            self.out_tokens[:bucket].copy_(choice)
            self.num_accepted[:bucket].copy_(accepted)

    # ---- host side ------------------------------------------------------------------------------
    def accepts(self, batch: list[ScheduledRequest]) -> bool:
        """Whether this decode batch can run as one replay: greedy, within the buckets, and each
        request's pending rows (resident here, or the proposer's) fit the k + 1 rows of a request."""
        if bucket_for(self.buckets, len(batch)) is None:
            return False
        for s in batch:
            r = s.request
            if r.params.temperature != 0:
                return False
            if r.request_id not in self._resident and not 0 < self.proposer.num_pending_rows(r.request_id) <= self.k + 1:
                return False
        return True

    def run(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        reqs = [s.request for s in batch]
        ids = [r.request_id for r in reqs]
        if ids != self._resident:
            self.export_state()
            self._import(reqs)
        bucket = bucket_for(self.buckets, len(reqs))
        self._tables.update(ids, bucket)
        self._calls[bucket].replay()
        n, w = len(reqs), self.k + 1
        host = torch.cat([self.out_tokens[:n].reshape(-1), self.num_accepted[:n]]).tolist()  # the one sync
        tokens, accepted = host[:n * w], host[n * w:]
        self._host_state = [(r.num_computed_tokens, a + 1) for r, a in zip(reqs, accepted)]
        return [StepResult(tokens[i * w:i * w + a + 1], a + 1, a) for i, a in enumerate(accepted)]

    def release(self, request_id: str) -> None:
        """A request finished or was preempted: its resident state is dropped."""
        if request_id in self._resident:
            i = self._resident.index(request_id)
            self._resident[i] = ""  # keeps the other requests' buffer rows; never exported

    def export_state(self) -> None:
        """Hand every resident request's pending rows back to the eager proposer."""
        for i, rid in enumerate(self._resident):
            if rid:
                start, count = self._host_state[i]
                self.proposer.put_pending(rid, self.pend_hidden[i, :count].clone(),
                                          self.pend_tokens[i, :count].clone(), start)
        self._resident, self._host_state = [], []

    def _import(self, reqs: list[Request]) -> None:
        """Take the requests' pending rows from the eager proposer into the buffers (rows 0 .. n - 1)."""
        self.valid.zero_()
        self.pend_start.zero_()
        self.pend_count.fill_(1)
        self._host_state = []
        for i, r in enumerate(reqs):
            hidden, tokens, start = self.proposer.take_pending(r.request_id)
            count = tokens.shape[0]
            self.pend_hidden[i, :count].copy_(hidden)
            self.pend_tokens[i, :count].copy_(tokens)
            self.pend_start[i], self.pend_count[i], self.valid[i] = start, count, True
            self._host_state.append((start, count))
        self._resident = [r.request_id for r in reqs]
