"""Runs a scheduled batch: prefill chunks through one eager forward, decoding requests through the
decode iteration (iteration.py), captured per batch bucket on CUDA.

Host work per step: for prefill chunks, flat inputs and attention metadata built from lists, one
forward, the first tokens sampled, the drafter told what was committed (``Proposer.absorb``);
for decoding requests, the batch's slots written into the iteration's input and new block-table
entries copied; then one host sync for the step's tokens.

Run-ahead (``enable_run_ahead``): right after a decode step the next one is launched for the same
requests, before the host reads the first one's tokens: everything it needs is already in the slot
state on the device. While the GPU runs it, the engine appends tokens, checks stop conditions and
schedules. If the next step's batch is those requests (or some of them, others having finished), at
the lengths the step run ahead started from, its results serve it; otherwise it is dropped and the
slot state it advanced is restored, so the state is again the one after the tokens the host holds
(the KV rows it wrote lie past every committed row, and are rewritten before anything reads them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.registry import get_backend
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.engine.cuda_graphs import bucket_for, pinned
from outpace.engine.iteration import DecodeIteration, StepKey
from outpace.engine.run_ahead import HostCopy, reserve_rows
from outpace.engine.scheduler import ScheduledRequest, StepResult, is_decoding
from outpace.engine.slots import RequestSlots
from outpace.layers.sampler import SamplingTensors, is_greedy, sample
from outpace.request import SAMPLE, Request, request_keys
from outpace.speculative.proposer import DraftShape, PrefillRows, Proposer


@dataclass
class _Launch:
    """A decode step in flight."""
    key: StepKey
    request_ids: tuple[str, ...]
    starts: tuple[int, ...]          # each request's length L when the step started
    copy: HostCopy                   # its packed outputs on their way to the host
    saved: list[torch.Tensor] | None = None  # for a step run ahead: the slot state it started from


class ModelRunner:
    def __init__(self, model: nn.Module, pool: BlockPool, kv_dtype: torch.dtype, device: str, attention_backend: str,
                 max_seqs: int, max_rows: int, proposer_factory=None, shape: DraftShape = DraftShape(0)) -> None:
        """``proposer_factory(max_slots)`` builds the drafter (None: plain decoding); ``shape`` what it drafts;
        ``max_rows``: the KV rows a request may reach (its slot's block table covers them)."""
        self.model, self.pool = model, pool
        self.device = torch.device(device)
        self.backend = get_backend(attention_backend)
        # NOTE: only the decoder stack: MTP layers belong to the MTP proposer, which binds their KV.
        self.kv_caches = bind_kv_cache(model.model, pool, kv_dtype, device)
        self.slots = RequestSlots(pool, max_seqs, pool.blocks_needed(max_rows), self.device)
        self.proposer: Proposer | None = proposer_factory(max_seqs) if proposer_factory is not None else None
        if self.proposer is not None:
            model.set_aux_hidden_state_layers(self.proposer.aux_layer_ids)
        self.shape = shape
        self.iteration = DecodeIteration(model, self.backend, self.kv_caches, self.slots, self.proposer, max_seqs)
        self.graph_buckets: tuple[int, ...] = ()
        self.run_ahead_limit: int | None = None  # max_model_len when run-ahead is on
        self._ahead: _Launch | None = None

    # ---- set-up ----------------------------------------------------------------------------------
    def capture(self, buckets: tuple[int, ...]) -> None:
        """Capture the decode step for every bucket, greedy and sampling (on CUDA; elsewhere the
        replays run the same step eagerly)."""
        memory = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.graph_buckets = buckets
        for bucket in sorted(buckets, reverse=True):
            for greedy in (True, False):
                self.iteration.capture(StepKey(bucket, self.shape, greedy), memory)

    def enable_run_ahead(self, max_model_len: int) -> None:
        """Run decode steps ahead (module docstring); positions stay below ``max_model_len``."""
        self.run_ahead_limit = max_model_len

    def release(self, request_id: str) -> None:
        """The request finished or was preempted: its slot is free (after any step still reading it)."""
        if self._ahead is not None and request_id in self._ahead.request_ids:
            self._drop_ahead()
        self.slots.release(request_id)

    # ---- a step ----------------------------------------------------------------------------------
    def execute(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        """Prefill chunks (a token sampled for each that completes its prompt), then one decode step
        for the decoding requests."""
        prefill = [s for s in batch if not is_decoding(s.request)]
        decode = [s.request for s in batch if is_decoding(s.request)]
        if prefill:
            self._drop_ahead()
        results = {}
        if prefill:
            results.update(zip((id(s.request) for s in prefill), self._prefill(prefill)))
        if decode:
            results.update(zip(map(id, decode), self._decode(decode)))
        return [results[id(s.request)] for s in batch]

    def _prefill(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        reqs = [s.request for s in batch]
        slot_ids = [self.slots.assign(r) for r in reqs]
        starts = [r.num_computed_tokens for r in reqs]
        counts = [s.num_new_tokens for s in batch]
        tables = [self.pool.table(r.request_id) for r in reqs]
        meta = build_paged_metadata(tables, starts, counts, self.pool.block_size, self.device)
        ids = [t for r, a, c in zip(reqs, starts, counts) for t in r.token_ids[a:a + c]]
        pos = [p for a, c in zip(starts, counts) for p in range(a, a + c)]
        final = [s.completes_sequence for s in batch]
        with torch.inference_mode():
            with forward_context(meta, self.backend):
                out = self.model(torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device))
            ends = torch.tensor(counts).cumsum(0) - 1
            done = [i for i, f in enumerate(final) if f]
            sampled = self._sample_first([reqs[i] for i in done], out.hidden_states[ends[done].to(self.device)]) \
                if done else torch.empty(0, dtype=torch.int64, device=self.device)
            if done:
                self.slots.start_decoding([slot_ids[i] for i in done], [starts[i] + counts[i] for i in done], sampled)
            if self.proposer is not None:
                self.proposer.absorb(PrefillRows(slot_ids, starts, counts, final,
                                                 torch.arange(len(ids), device=self.device),
                                                 _next_tokens(reqs, starts, counts, sampled), out.hidden_states,
                                                 out.aux_hidden_states, tables))
            tokens = sampled.tolist()
        it = iter(tokens)
        return [StepResult([next(it)] if f else [], c) for f, c in zip(final, counts)]

    def _sample_first(self, reqs: list[Request], hidden: torch.Tensor) -> torch.Tensor:
        """The token after each completed prompt, from its last row's hidden state [n, hidden]: [n]."""
        logits = self.model.compute_logits(hidden)
        if all(is_greedy(r.params) for r in reqs):
            return logits.argmax(dim=-1)
        st = SamplingTensors.from_params([r.params for r in reqs], self.device)
        return sample(logits, st, request_keys(reqs, [r.num_tokens for r in reqs], SAMPLE, self.device))

    def _decode(self, reqs: list[Request]) -> list[StepResult]:
        ids, starts = tuple(r.request_id for r in reqs), tuple(r.num_computed_tokens for r in reqs)
        launch = self._take_ahead(ids, starts)
        if launch is None:
            launch = self._launch(reqs, ids, starts)
        if self._may_run_ahead(reqs, launch.key):
            self._ahead = self._launch_ahead(launch)
        rows = self.iteration.unpack(launch.copy.tolist(), launch.key, len(launch.request_ids))
        by_id = dict(zip(launch.request_ids, rows))
        speculative = self.proposer is not None
        if self._ahead is not None:  # each request's length once this step is committed
            self._ahead.starts = tuple(s + by_id[i][1] + 1 for i, s in zip(ids, starts))
        return [StepResult(tokens, accepted + 1, accepted if speculative else None, depths)
                for tokens, accepted, depths in (by_id[i] for i in ids)]

    def _launch(self, reqs: list[Request], ids: tuple[str, ...], starts: tuple[int, ...]) -> _Launch:
        """Write the batch into the iteration's input and run its step (captured when a bucket holds it)."""
        n = len(reqs)
        bucket = bucket_for(self.graph_buckets, n)
        key = StepKey(bucket or n, self.shape, all(is_greedy(r.params) for r in reqs))
        self.slots.sync_tables(ids)
        slot_ids = [self.slots.slot(i) for i in ids] + [self.slots.padding_slot] * (key.bucket - n)
        self.iteration.batch_slots[:key.bucket].copy_(pinned(slot_ids, self.device), non_blocking=True)
        width = None if bucket is not None else max(len(self.pool.table(i)) for i in ids)
        return _Launch(key, ids, starts, HostCopy(self.iteration.run(key, width)))

    # ---- run-ahead -------------------------------------------------------------------------------
    def _launch_ahead(self, launch: _Launch) -> _Launch:
        """The step after ``launch``, for the same rows, launched now (its rows reserved by ``_may_run_ahead``)."""
        slot_ids = self.iteration.batch_slots[:launch.key.bucket]
        saved = [t.index_select(0, slot_ids) for t in self._state()]
        ahead = _Launch(launch.key, launch.request_ids, (), HostCopy(self.iteration.run(launch.key)), saved)
        return ahead

    def _state(self) -> list[torch.Tensor]:
        """Every per-slot buffer a step advances."""
        return [self.slots.lengths, self.slots.last_tokens] + (self.proposer.state() if self.proposer else [])

    def _take_ahead(self, ids: tuple[str, ...], starts: tuple[int, ...]) -> _Launch | None:
        """The step run ahead if it serves this batch (each request was in it, from the length it has
        now: requests that have left since do not matter); any other is dropped."""
        launch = self._ahead
        if launch is None:
            return None
        ran = dict(zip(launch.request_ids, launch.starts))
        if ids and all(ran.get(i) == s for i, s in zip(ids, starts)):
            self._ahead = None
            return launch
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        """Undo the step run ahead: wait for it (it read block tables whose rows may change owner now),
        then restore the slot state it started from."""
        launch, self._ahead = self._ahead, None
        if launch is None:
            return
        launch.copy.wait()
        slot_ids = self.iteration.batch_slots[:launch.key.bucket]
        for buffer, saved in zip(self._state(), launch.saved):
            buffer.index_copy_(0, slot_ids, saved)
        self.slots.lengths[self.slots.padding_slot] = 0

    def _may_run_ahead(self, reqs: list[Request], key: StepKey) -> bool:
        """Whether to launch the step after this one now: captured, and its rows reserved for any
        acceptance of this one (run_ahead.reserve_rows)."""
        if self.run_ahead_limit is None or bucket_for(self.graph_buckets, len(reqs)) != key.bucket:
            return False
        per_step = self.shape.num_steps + 1
        lookahead = self.proposer.lookahead if self.proposer is not None else 0
        rows = [r.num_computed_tokens + 2 * per_step + lookahead + 1 for r in reqs]
        return reserve_rows(self.pool, reqs, rows, min(self.run_ahead_limit, self.slots.max_rows))


def _next_tokens(reqs: list[Request], starts: list[int], counts: list[int], sampled: torch.Tensor) -> torch.Tensor:
    """[sum(counts)] the token after each prefill row: the prompt's next one, or for the last row of a
    completed prompt the token just ``sampled`` ([completed prompts] on the device, in batch order)."""
    tokens, tails = [], []
    for r, a, c in zip(reqs, starts, counts):
        known = r.token_ids[a + 1:a + c + 1]
        tokens += known + [0] * (c - len(known))  # one row short exactly when the chunk completes the prompt
        if len(known) < c:
            tails.append(len(tokens) - 1)
    next_ids = torch.tensor(tokens, dtype=torch.int64, device=sampled.device)
    if tails:
        next_ids[torch.tensor(tails, device=sampled.device)] = sampled
    return next_ids
