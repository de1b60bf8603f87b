"""The whole greedy chain-drafting iteration in one CUDA graph per batch bucket.

A chain drafter proposes ``k`` drafts after a request's last token; the target verifies the chain
``[last token, draft 1 .. draft k]`` of ``k + 1`` rows. Let L be a request's committed length: its
last token sits at position L and has no KV yet; rows and positions coincide. One replay runs, for
every request of the batch:
1. the drafter's part (``_draft``): bring the draft state up to date from the pending rows (the
   ``count`` rows committed since the last draft, start .. L - 1 with L = start + count; the
   buffers pad them to ``k + 1`` rows) and draft ``k`` tokens greedily,
2. the target's verify forward over the chain at rows L .. L + k, and its greedy token per row,
3. acceptance: the longest prefix of drafts equal to the target's tokens (``a`` drafts),
4. the next iteration's state: ``_next_pending`` keeps per-row drafter inputs for all ``k + 1``
   verified rows (rows L .. L + a are the committed ones: count = a + 1, first pending row L), and
   the last token becomes the target's token after row L + a (the bonus, at position L + a + 1).
The state stays in static device buffers between replays, so consecutive iterations need from the
host only new block-table entries; the host reads back ``k + 2`` integers per request per step.
Padding sequences (``valid`` False) restart at row 0 with one pending row each step; their block
tables point at the pool's padding block.

The state hands over to the eager proposer (its ``take_pending`` / ``put_pending``: a request's
pending rows as tensors of ``count`` rows each, plus the first row) whenever a request joins the
batch or an eager step runs, and back again: ``export_state`` / ``_import``; when requests only
leave, the others' rows are compacted on the device instead (``_keep_only``). A request's pending
rows fit the ``k + 1`` buffer rows after any verify; after a prefill they may not, and that step runs
eagerly.

Oracle acceptance (benchmarks only, ``oracle_rates``): step 3 draws the number of accepted drafts
so that draft position j is accepted with probability ``oracle_rates[j]`` (rates measured on a
real pair), instead of comparing tokens; everything else runs unchanged. Output tokens are then
not the target's greedy output.

Run-ahead (the runner's ``run_ahead_limit`` set, as for plain decoding in engine/runner.py): right
after a replay the next one is launched for the same requests, before the host reads the first's
tokens: the state it needs is already on the device. The state it starts from is first copied
aside; if the next step's batch is those requests or some of them (others finished), the replay
serves it; otherwise it is dropped and the copy restored, so the state is again the one after the
tokens the host holds (the KV rows it wrote lie past every committed row, and are rewritten before
anything reads them).

Subclasses (speculative/eagle3_graph.py, speculative/dflash_graph.py) supply ``_pending_buffers``, ``_draft`` and
``_next_pending``; everything inside ``_iteration`` is device work of static shapes (capturable).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from outpace.attention import forward_context, uniform_paged_metadata
from outpace.engine.cuda_graphs import CapturedCall, bucket_for
from outpace.request import Request
from outpace.engine.run_ahead import HostCopy, reserve_rows
from outpace.engine.runner import ModelRunner
from outpace.engine.scheduler import ScheduledRequest, StepResult
from outpace.layers.sampler import is_greedy
from outpace.models.llama import ModelOutput


@dataclass
class _Replay:
    """An iteration in flight: its requests, and their outputs on the way to the host."""
    request_ids: list[str]
    copy: HostCopy                   # [n * (k + 1) + n] int64: tokens per row, then accepted drafts
    starts: list[int] | None = None  # each request's committed length it starts from, once known


class ChainIterationGraph:
    def __init__(self, runner: ModelRunner, proposer, oracle_rates: Sequence[float] | None = None):
        self.runner, self.proposer = runner, proposer
        self.k = proposer.spec.num_steps
        self.buckets = runner.graph_buckets
        self._tables = runner.graph_tables
        dev, max_seqs = runner.device, max(self.buckets)
        self.pending = self._pending_buffers(max_seqs, self.k + 1, dev)                  # each [max_seqs, k + 1, ...]
        self.pend_start = torch.zeros(max_seqs, dtype=torch.int64, device=dev)            # first pending row
        self.pend_count = torch.ones(max_seqs, dtype=torch.int64, device=dev)             # pending rows, >= 1
        self.valid = torch.zeros(max_seqs, dtype=torch.bool, device=dev)                  # False: padding
        self.last = torch.zeros(max_seqs, dtype=torch.int64, device=dev)                  # token at position L
        self.out_tokens = torch.zeros(max_seqs, self.k + 1, dtype=torch.int64, device=dev)  # target's token per row
        self.num_accepted = torch.zeros(max_seqs, dtype=torch.int64, device=dev)
        self.oracle_rates = (None if oracle_rates is None else
                             torch.tensor(oracle_rates, dtype=torch.float32, device=dev).cummin(0).values)
        if self.oracle_rates is not None and self.oracle_rates.numel() != self.k:
            raise ValueError(f"oracle_rates has {self.oracle_rates.numel()} rates, the chain has {self.k} drafts")
        self._resident: list[str] = []     # request ids in buffer order
        self._host_state: list[tuple[int, int]] = []  # (first pending row, pending rows) per resident request
        self._ahead: _Replay | None = None  # the replay run ahead, if any
        self._state = [*self.pending, self.pend_start, self.pend_count, self.last]  # what an iteration advances
        self._saved = [torch.empty_like(t) for t in self._state]  # the state a replay run ahead started from
        self._calls = {b: CapturedCall(lambda b=b: self._iteration(b), dev, runner.graph_memory)
                       for b in sorted(self.buckets, reverse=True)}

    # ---- drafter-specific parts -----------------------------------------------------------------
    def _pending_buffers(self, max_seqs: int, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Static buffers [max_seqs, rows, ...] for the drafter's per-row pending inputs, in the order
        of the proposer's ``take_pending`` / ``put_pending`` tensors."""
        raise NotImplementedError

    def _draft(self, tables: torch.Tensor, start: torch.Tensor, count: torch.Tensor,
               last: torch.Tensor) -> torch.Tensor:
        """Consume the pending rows (rows start .. start + count - 1 of each sequence, padded to k + 1
        in the buffers) and draft greedily after ``last`` (position L = start + count).
        Returns the drafts [bucket, k] (target ids)."""
        raise NotImplementedError

    def _next_pending(self, verified: ModelOutput, choice: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The pending inputs of the verified rows L .. L + k, one tensor per pending buffer, each
        viewable as [bucket, k + 1, ...]; ``choice`` [bucket, k + 1] is the target's token after each row."""
        raise NotImplementedError

    # ---- the captured iteration ---------------------------------------------------------------
    def _context(self, tables: torch.Tensor, first: torch.Tensor, n: int, custom_mask: torch.Tensor | None = None):
        """A forward context in which sequence s's ``n`` new tokens are KV rows first[s] .. first[s] + n - 1."""
        return forward_context(uniform_paged_metadata(tables, first, n, self.runner.pool.block_size, custom_mask),
                               self.runner.backend)

    @staticmethod
    def _positions(first: torch.Tensor, n: int) -> torch.Tensor:
        """[len(first) * n]: positions first[s] .. first[s] + n - 1 of each sequence, concatenated."""
        return (first[:, None] + torch.arange(n, device=first.device)).reshape(-1)

    def _iteration(self, bucket: int) -> None:
        k, target = self.k, self.runner.model
        tables = self._tables.device[:bucket]
        start, count, last = self.pend_start[:bucket], self.pend_count[:bucket], self.last[:bucket]
        with torch.inference_mode():
            drafts = self._draft(tables, start, count, last)                    # 1. [bucket, k]
            length = start + count                                              # L
            chain = torch.cat([last[:, None], drafts], dim=1)                   # [bucket, k + 1]
            with self._context(tables, length, k + 1):                          # 2. verify
                verified = target(chain.reshape(-1), self._positions(length, k + 1))
            choice = target.compute_logits(verified.hidden_states).argmax(-1).view(bucket, k + 1)
            if self.oracle_rates is None:                                       # 3. acceptance
                accepted = (chain[:, 1:] == choice[:, :k]).cumprod(dim=1).sum(dim=1)
            else:
                accepted = (torch.rand(bucket, 1, device=tables.device) < self.oracle_rates).sum(dim=1)
            valid = self.valid[:bucket]                                         # 4. the next state
            for buffer, rows in zip(self.pending, self._next_pending(verified, choice)):
                buffer[:bucket].copy_(rows.view(buffer[:bucket].shape))
            self.pend_start[:bucket].copy_(torch.where(valid, length, 0))
            self.pend_count[:bucket].copy_(torch.where(valid, accepted + 1, 1))
            self.last[:bucket].copy_(choice.gather(1, accepted[:, None])[:, 0])
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
            if not is_greedy(r.params):
                return False
            if r.request_id not in self._resident and not 0 < self.proposer.num_pending_rows(r.request_id) <= self.k + 1:
                return False
        return True

    def run(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        reqs = [s.request for s in batch]
        ids = [r.request_id for r in reqs]
        replay = self._take_ahead(ids, [r.num_computed_tokens for r in reqs])
        bucket = bucket_for(self.buckets, len(reqs))
        if replay is None:
            if ids != self._resident:
                if set(ids) <= set(self._resident):
                    self._keep_only(ids)
                else:
                    self.export_state()
                    self._import(reqs)
            replay = self._replay(ids, bucket)
        elif replay.request_ids != ids:  # requests left while it ran ahead: the others' rows move up
            self._keep_only(ids)
        if self._may_run_ahead(reqs):
            torch._foreach_copy_(self._rows(self._saved, bucket), self._rows(self._state, bucket))
            self._ahead = self._replay(ids, bucket)
        w, ran = self.k + 1, len(replay.request_ids)
        host = replay.copy.tolist()                       # [ran * w] tokens, then [ran] accepted drafts
        rows = [replay.request_ids.index(rid) for rid in ids]
        accepted = [host[ran * w + j] for j in rows]
        self._host_state = [(r.num_computed_tokens, a + 1) for r, a in zip(reqs, accepted)]
        if self._ahead is not None:
            self._ahead.starts = [r.num_computed_tokens + a + 1 for r, a in zip(reqs, accepted)]
        return [StepResult(host[j * w:j * w + a + 1], a + 1, a) for j, a in zip(rows, accepted)]

    def _replay(self, ids: list[str], bucket: int) -> _Replay:
        """Replay the iteration for these resident requests; start copying its outputs to the host."""
        self._tables.update(ids, bucket)
        self._calls[bucket].replay()
        n = len(ids)
        return _Replay(ids, HostCopy(torch.cat([self.out_tokens[:n].reshape(-1), self.num_accepted[:n]])))

    def _take_ahead(self, ids: list[str], starts: list[int]) -> _Replay | None:
        """The replay run ahead if it serves this step (each of the batch's requests was in it, from
        the length the request has now: requests that have left since do not matter); any other is
        dropped and its start state restored."""
        replay, self._ahead = self._ahead, None
        ran = dict(zip(replay.request_ids, replay.starts or ())) if replay is not None else {}
        if replay is not None and (not ids or any(ran.get(rid) != start for rid, start in zip(ids, starts))):
            bucket = bucket_for(self.buckets, len(replay.request_ids))  # after the dropped replay, in stream order
            torch._foreach_copy_(self._rows(self._state, bucket), self._rows(self._saved, bucket))
            replay.copy.wait()  # it has read the block tables before their rows may change owner
            return None
        return replay

    @staticmethod
    def _rows(buffers: list[torch.Tensor], bucket: int) -> list[torch.Tensor]:
        """The first ``bucket`` sequences' rows of each state buffer."""
        return [b[:bucket] for b in buffers]

    def _may_run_ahead(self, reqs: list[Request]) -> bool:
        """Whether to replay the next iteration now (run_ahead.reserve_rows: its rows reserved for any
        acceptance of this one)."""
        limit = self.runner.run_ahead_limit
        if limit is None:
            return False
        rows = [r.num_computed_tokens + 2 * (self.k + 1) + self.proposer.lookahead for r in reqs]
        return reserve_rows(self.runner.pool, reqs, rows, min(limit, self._tables.max_rows))

    def release(self, request_id: str) -> None:
        """A request finished or was preempted: its resident state is dropped."""
        if request_id in self._resident:
            i = self._resident.index(request_id)
            self._resident[i] = ""  # keeps the other requests' buffer rows; never exported

    def _pad_from(self, n: int) -> None:
        """Rows n and after become padding: not valid, restarting at row 0 with one pending row."""
        self.valid[n:].fill_(False)
        self.pend_start[n:].zero_()
        self.pend_count[n:].fill_(1)

    def _keep_only(self, ids: list[str]) -> None:
        """Requests left the batch and none joined: the staying requests' state moves to rows
        0 .. n - 1 on the device (one gather a buffer), the rows after them become padding."""
        order = [self._resident.index(rid) for rid in ids]
        n, index = len(ids), torch.tensor(order, device=self.valid.device)
        for buffer in self._state:
            buffer[:n].copy_(buffer.index_select(0, index))
        self.valid[:n].fill_(True)
        self._pad_from(n)
        self._host_state = [self._host_state[i] for i in order]
        self._resident = list(ids)

    def export_state(self) -> None:
        """Hand every resident request's pending rows back to the eager proposer."""
        self._take_ahead([], [])
        for i, rid in enumerate(self._resident):
            if rid:
                start, count = self._host_state[i]
                self.proposer.put_pending(rid, *(b[i, :count].clone() for b in self.pending), start)
        self._resident, self._host_state = [], []

    def _import(self, reqs: list[Request]) -> None:
        """Take the requests' pending rows from the eager proposer into the buffers (rows 0 .. n - 1)."""
        self._pad_from(0)
        self._host_state = []
        for i, r in enumerate(reqs):
            *rows, start = self.proposer.take_pending(r.request_id)
            count = rows[0].shape[0]
            for buffer, values in zip(self.pending, rows):
                buffer[i, :count].copy_(values)
            self.pend_start[i], self.pend_count[i], self.valid[i] = start, count, True
            self.last[i] = r.token_ids[-1]  # the token at position L = start + count
            self._host_state.append((start, count))
        self._resident = [r.request_id for r in reqs]
