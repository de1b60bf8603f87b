"""Runs a scheduled batch: prefill chunks through one forward (the forward captured for their count and
token bucket when one holds them, prefill_graphs.py; others eagerly), decoding requests through the
decode iteration (iteration.py), captured per batch bucket on CUDA.

Host work per step: for prefill chunks, flat inputs and (eager) attention metadata built from lists,
one forward, the first tokens sampled, the drafter told what was committed (``Proposer.absorb``);
for decoding requests, the batch's indices written into the iteration's input and new block-table
entries copied; then one host sync for the step's tokens.

Run-ahead (``enable_run_ahead``): right after a decode step the next one is launched for the same
requests and for those whose prefill the step completed, before the host reads the first one's tokens:
everything it needs is already in the request state on the device (a prefill's writes are queued before
it). While the GPU runs it, the engine appends tokens, checks stop conditions and schedules. If the next
step's batch is those requests (or some of them, others having finished), at the lengths the step run
ahead started from, its results serve it, whatever new prompts that step also prefills; otherwise it is
dropped and the request state it advanced is restored, so the state is again the one after the tokens the
host holds (the KV rows it wrote lie past every committed row, and are rewritten before anything reads
them). Under a server's load requests end and join at most steps, so a step run ahead that a join
dropped would be a step computed twice (benchmarks/diag_closed_loop.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from operator import add, attrgetter

import torch
from torch import nn
from tqdm.auto import tqdm

from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.context import forward_settings
from outpace.attention.registry import get_backend
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import CacheRows, bind_kv_cache, bound_caches
from outpace.cache.recurrent_states import RecurrentStates
from outpace.config import SamplingParams
from outpace.engine.cuda_graphs import bucket_for, pinned
from outpace.engine.decode_step import DecodeStep, LogitsFeatures, SamplingMode, StepKey
from outpace.engine.prefill_graphs import PrefillGraphs
from outpace.engine.run_ahead import HostCopy, reserve_rows
from outpace.engine.scheduler import ScheduledRequest, StepResults, is_decoding
from outpace.engine.request_table import RequestTable
from outpace.layers.logits_processing import apply_token_bitmask, token_logprobs
from outpace.layers.sampler import SamplingTensors, is_greedy, sample
from outpace.request import SAMPLE, Request, position_logprobs, request_keys
from outpace.speculative.adaptive import DraftLengthChooser
from outpace.speculative.proposer import DraftShape, Drafts, PrefillRows, Proposer
from outpace.structured import GrammarTable


_request_id, _num_computed = attrgetter("request_id"), attrgetter("num_computed_tokens")


def _length_after(chunk: ScheduledRequest) -> int:
    """A prefilled request's KV rows once its chunk is committed."""
    return chunk.request.num_computed_tokens + chunk.num_new_tokens


class _StepTimer:
    """A step's time: on CUDA the GPU's, between events around its launch (read once its outputs are on
    the host, so without a sync of its own); elsewhere the wall time of the (synchronous) call."""

    def __init__(self, device: torch.device) -> None:
        self.events = None
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.events is not None:
            self.events[1].record()
        self.elapsed = time.perf_counter() - self.t0

    def seconds(self) -> float:
        if self.events is None:
            return self.elapsed
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1]) / 1e3


@dataclass
class _Launch:
    """A decode step in flight."""
    key: StepKey
    request_ids: tuple[str, ...]
    starts: tuple[int, ...]          # each request's length L when the step started
    copy: HostCopy                   # its packed outputs on their way to the host
    req_indices: list[int]              # each request's row
    saved: list[torch.Tensor] | None = None  # for a step run ahead: its rows' request state before it
    timer: _StepTimer | None = None  # the step's time, for the adaptive chooser


class ModelRunner:
    def __init__(self, model: nn.Module, pool: BlockPool, kv_dtype: torch.dtype, device: str, attention_backend: str,
                 max_seqs: int, max_rows: int, proposer_factory=None, shapes: tuple[DraftShape, ...] = (DraftShape(0),),
                 batch_invariant: bool = False) -> None:
        """``proposer_factory(max_requests)`` builds the drafter (None: plain decoding); ``shapes`` what it may
        draft: one shape (fixed), or several, chosen step by step (speculative/adaptive.py); ``max_rows``:
        the KV rows a request may reach (its row's block table covers them); ``batch_invariant``: every
        forward in deterministic mode (a forward-context setting, attention/context.py)."""
        self.model, self.pool = model, pool
        self.device = torch.device(device)
        self.batch_invariant = batch_invariant
        self.backend = get_backend(attention_backend)
        # NOTE: only the decoder stack: MTP layers belong to the MTP proposer, which binds their KV.
        self.kv_caches = bind_kv_cache(model.model, pool, kv_dtype, device)
        self.req_table = RequestTable(pool, max_seqs, pool.blocks_needed(max_rows), self.device, model.config.vocab_size)
        self.grammars: GrammarTable | None = None  # the engine's, once it knows the tokenizer and eos ids
        # hybrid models: each request row's recurrent state, with a snapshot row per verified node
        self.states = RecurrentStates(model.model, max_seqs + 1, max(s.num_nodes for s in shapes), kv_dtype, device)
        self.proposer: Proposer | None = proposer_factory(max_seqs) if proposer_factory is not None else None
        if self.proposer is not None:
            model.set_aux_hidden_state_layers(self.proposer.aux_layer_ids)
        self.shapes = shapes
        # adaptive: one chooser per sampling mode (acceptance and step costs differ between them)
        self.choosers = {mode: DraftLengthChooser(list(shapes)) for mode in SamplingMode} if len(shapes) > 1 else {}
        self.decode_step = DecodeStep(model, self.backend, self.kv_caches, self.req_table, self.proposer, max_seqs,
                                         self.states)
        self.graph_buckets: tuple[int, ...] = ()
        self.prefill_graphs = PrefillGraphs(model, self.backend, self.req_table, max_rows, self.states.has_state)
        self.run_ahead_limit: int | None = None  # max_model_len when run-ahead is on
        self._ahead: _Launch | None = None
        # Each decoding request's kind: the params of the first request seen whose own params gave the same
        # SamplingMode and LogitsFeatures (a step's mode and features depend only on the set of its requests' kinds)
        self._kind_of: dict[str, SamplingParams] = {}
        self._kinds: dict[tuple[SamplingMode, LogitsFeatures], SamplingParams] = {}

    # ---- set-up ----------------------------------------------------------------------------------
    def capture(self, buckets: tuple[int, ...], prefill_buckets: tuple[int, ...] = ()) -> None:
        """Capture the decode step for every bucket, draft shape and sampling mode, and the forward of up to
        8 prefill chunks for the prefill buckets the model allows (engine/prefill_graphs.py); on CUDA,
        elsewhere the replays run the same code eagerly. With adaptive
        speculation, profile each decode step on the GPU."""
        memory = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.graph_buckets = buckets
        keys = [StepKey(b, shape, mode) for b in sorted(buckets, reverse=True) for shape in self.shapes
                for mode in SamplingMode]
        with forward_settings(self.batch_invariant):
            for key in tqdm(keys, desc="capturing decode steps", disable=len(keys) < 8):
                self.decode_step.capture(key, memory)
            self.prefill_graphs.capture(prefill_buckets, memory)
            if self.choosers and self.device.type == "cuda":
                for key in keys:
                    self.choosers[key.mode].record_cost(key.bucket, key.shape, self.profile(key))

    def profile(self, key: StepKey, repeats: int = 5) -> float:
        """Seconds one replay of the key's graph takes on the GPU (rows of the padding row)."""
        self.decode_step.batch_indices.fill_(self.req_table.padding_index)
        saved = [t.clone() for t in self._state(key)]
        times = []
        for _ in range(repeats + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.decode_step.run(key)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        for buffer, old in zip(self._state(key), saved):
            buffer.copy_(old)
        return sorted(times[1:])[repeats // 2]

    def rebind_kv(self) -> None:
        """The pool was resized and its caches reallocated (kv_cache.rebind_kv_caches; start-up, before any
        capture): take the target's new tensors."""
        self.kv_caches = bound_caches(self.model.model)
        self.decode_step.kv_rows = CacheRows(self.kv_caches)

    def enable_run_ahead(self, max_model_len: int) -> None:
        """Run decode steps ahead (module docstring); positions stay below ``max_model_len``."""
        self.run_ahead_limit = max_model_len

    def release(self, request_id: str) -> None:
        """The request finished or was preempted: its row is free, once the step run ahead (if it ran for
        the request) has finished reading the row's table row, which may change owner now."""
        if self._ahead is not None and request_id in self._ahead.request_ids:
            self._ahead.copy.wait()
        self.req_table.release(request_id)
        self._kind_of.pop(request_id, None)
        if self.grammars is not None:
            self.grammars.release(request_id)
        for chooser in self.choosers.values():
            chooser.forget(request_id)

    # ---- a step ----------------------------------------------------------------------------------
    def execute(self, batch: list[ScheduledRequest]) -> StepResults:
        """Prefill chunks (a token sampled for each that completes its prompt), then one decode step
        for the decoding requests."""
        decoding = [is_decoding(s.request) for s in batch]
        prefill = [s for s, d in zip(batch, decoding) if not d]
        decode = [s.request for s, d in zip(batch, decoding) if d]
        if self._ahead is not None and any(s.request.request_id in self._ahead.request_ids for s in prefill):
            # a request the step run ahead ran for is recomputed (it was preempted): dropped later, the step's
            # restore would write the old state over what this prefill writes, should the request get its row back
            self._drop_ahead()
        with forward_settings(self.batch_invariant):
            prefilled = self._prefill(prefill) if prefill else None
            joining = [s for s in prefill if s.decodes_next]
            decoded = self._decode(decode, joining) if decode else None
        results = StepResults.interleave(decoding, prefilled, decoded)
        self._advance_grammars(batch, results)
        return results

    def _prefill(self, batch: list[ScheduledRequest]) -> StepResults:
        reqs = [s.request for s in batch]
        req_indices = self.req_table.assign(reqs)
        starts = [r.num_computed_tokens for r in reqs]
        counts = [s.num_new_tokens for s in batch]
        tables = [self.pool.table(r.request_id) for r in reqs]
        ids = [t for r, a, c in zip(reqs, starts, counts) for t in r.token_ids[a:a + c]]
        final = [s.completes_sequence for s in batch]  # a token is sampled
        decodes = [s.decodes_next for s in batch]      # the row's decode state starts
        with torch.inference_mode():
            input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
            out = self._prefill_forward(reqs, req_indices, starts, counts, tables, input_ids)
            ends = torch.tensor(counts).cumsum(0) - 1
            done = [i for i, f in enumerate(final) if f]
            if any(r.prompt_logprobs is not None for r in reqs):
                self._record_prompt_logprobs(reqs, starts, counts, out.hidden_states)
            sampled, first_logprobs = self._sample_first(
                [reqs[i] for i in done], [req_indices[i] for i in done], out.hidden_states[ends[done].to(self.device)]) \
                if done else (torch.empty(0, dtype=torch.int64, device=self.device), None)
            if any(decodes):  # the last token: just sampled, or (recomputing) the one the request has
                sampled_at = dict(zip(done, sampled.unbind(0)))
                last = [sampled_at[i] if i in sampled_at else torch.tensor(reqs[i].token_ids[-1], device=self.device)
                        for i in range(len(batch)) if decodes[i]]
                self.req_table.start_decoding([s for s, d in zip(req_indices, decodes) if d],
                                          [a + c for a, c, d in zip(starts, counts, decodes) if d], torch.stack(last))
            if self.proposer is not None:
                self.proposer.absorb(PrefillRows(req_indices, starts, counts, decodes,
                                                 torch.arange(len(ids), device=self.device), input_ids,
                                                 _next_tokens(reqs, starts, counts, sampled), out.hidden_states,
                                                 out.aux_hidden_states, tables,
                                                 [r.token_ids[:s.num_reused_tokens] for r, s in zip(reqs, batch)]))
            tokens = sampled.tolist()  # the completed prompts', in batch order
        n = len(batch)
        return StepResults(tokens, [int(f) for f in final], counts, [None] * n, [None] * n, [0] * n, [0] * n,
                           first_logprobs)

    def _prefill_forward(self, reqs: list[Request], req_indices: list[int], starts: list[int], counts: list[int],
                         tables: list[list[int]], input_ids: torch.Tensor):
        """The target's forward over the chunks (``input_ids`` [sum(counts)]): chunks that a prefill key holds
        replay its captured forward, others run eagerly."""
        key = self.prefill_graphs.bucket(counts, starts)
        if key is not None:
            self.req_table.sync_tables(list(map(_request_id, reqs)))
            return self.prefill_graphs.run(key, req_indices, starts, counts, input_ids)
        meta = build_paged_metadata(tables, starts, counts, self.pool.block_size, self.device)
        pos = torch.tensor([p for a, c in zip(starts, counts) for p in range(a, a + c)], device=self.device)
        with forward_context(meta, self.backend, recurrent=self.states.prefill(req_indices, starts)):
            return self.model(input_ids, pos)

    def _sample_first(self, reqs: list[Request], req_indices: list[int],
                      hidden: torch.Tensor) -> tuple[torch.Tensor, list | None]:
        """The token after each completed prompt, from its last row's hidden state [n, hidden]: ([n] tokens,
        each one's log-probabilities when some request wants them). Penalties, logit biases and grammars
        apply as in a decode step (the functions it uses, on one position)."""
        raw = self.model.compute_logits(hidden)                                        # [n, vocab]
        features = LogitsFeatures.of([r.params for r in reqs])
        logits = raw
        if features.penalties:  # the output so far is counted (all of it precedes the token sampled)
            for r in reqs:
                if r.params.penalized:
                    self.req_table.load_history(r, r.num_tokens)
            rows = torch.tensor(req_indices, device=self.device)
            logits = self.req_table.penalties(rows).apply(logits[:, None, :])[:, 0]
        if features.grammar:
            no_drafts = torch.zeros(len(reqs), 1, dtype=torch.int64)
            masks = self.grammars.tree_masks(reqs, no_drafts, no_drafts - 1).to(self.device)  # [n, 1, words]
            logits = apply_token_bitmask(logits, masks[:, 0])
        if all(is_greedy(r.params) for r in reqs):
            tokens = logits.argmax(dim=-1)
        else:
            st = SamplingTensors.from_params([r.params for r in reqs], self.device)
            tokens = sample(logits, st, request_keys(reqs, [r.num_tokens for r in reqs], SAMPLE, self.device))
        if features.logprobs is None:
            return tokens, None
        rows = token_logprobs(raw, tokens, features.logprobs).host_rows()
        return tokens, [position_logprobs(t, *row) for t, row in zip(tokens.tolist(), rows)]

    def _record_prompt_logprobs(self, reqs: list[Request], starts: list[int], counts: list[int],
                                hidden: torch.Tensor) -> None:
        """Requests with ``prompt_logprobs``: the entry of every prompt token this chunk's rows predict (the
        row at position p predicts token p + 1), unless a run before preemption recorded it already."""
        offset = 0
        for r, a, c in zip(reqs, starts, counts):
            if r.prompt_logprobs is not None:
                first = max(a, len(r.prompt_logprobs) - 1)       # the first row whose entry is missing
                last = min(a + c, r.num_prompt_tokens - 1)        # rows up to the one predicting the last prompt token
                if first < last:
                    rows = hidden[offset + first - a:offset + last - a]
                    targets = torch.tensor(r.prompt_token_ids[first + 1:last + 1], device=self.device)
                    lp = token_logprobs(self.model.compute_logits(rows), targets, r.params.prompt_logprobs)
                    r.prompt_logprobs += [position_logprobs(t, *row) for t, row in zip(targets.tolist(), lp.host_rows())]
            offset += c

    def _decode(self, reqs: list[Request], joining: list[ScheduledRequest] = ()) -> StepResults:
        """One decode step for ``reqs``; the step after it may be run ahead for them and for the requests whose
        prefill this step completed (``joining``: their indices were written by the prefill, queued before)."""
        ids, starts = tuple(map(_request_id, reqs)), tuple(map(_num_computed, reqs))
        launch = self._take_ahead(ids, starts) or self._launch(reqs)
        if self._may_run_ahead(reqs, launch.key.shape, joining):
            self._ahead = self._launch(reqs + [s.request for s in joining], ahead=True)
        rows = self.decode_step.unpack(launch.copy.tolist(), launch.key, len(launch.request_ids))
        chooser = self.choosers.get(launch.key.mode)
        if chooser is not None:
            chooser.record_cost(launch.key.bucket, launch.key.shape, launch.timer.seconds())
            chooser.observe(launch.key.shape, rows.accepted, launch.request_ids)
        shape, n = launch.key.shape, len(ids)
        tokens, accepted, depths, entries = rows
        order = range(n)  # each request's row of the launch, which may also hold requests gone since
        if launch.request_ids != ids:
            order = list(map(dict(zip(launch.request_ids, range(len(launch.request_ids)))).__getitem__, ids))
        counts = [accepted[i] + 1 for i in order]
        if self._ahead is not None:  # each request's length once this step is committed
            self._ahead.starts = tuple(map(add, starts, counts)) + tuple(map(_length_after, joining))
        new_token_ids = [t for i in order for t in tokens[i]]
        logprobs = None if entries is None else [position_logprobs(t, *lp) for i in order
                                                 for t, lp in zip(tokens[i], entries[i])]
        if self.proposer is None:
            return StepResults(new_token_ids, counts, [1] * n, [None] * n, [None] * n, [0] * n, [0] * n, logprobs)
        return StepResults(new_token_ids, counts, counts, [accepted[i] for i in order],
                           [None] * n if depths is None else [depths[i] for i in order], [shape.num_nodes - 1] * n,
                           [shape.num_steps] * n, logprobs)

    def _launch(self, reqs: list[Request], ahead: bool = False) -> _Launch:
        """Write the batch into the iteration's input and run its step (captured when a bucket holds it).
        ``ahead``: the step after the one just launched, whose request state it starts from is saved."""
        ids, n = tuple(map(_request_id, reqs)), len(reqs)
        kinds = self._kinds_of(reqs, ids)
        bucket = bucket_for(self.graph_buckets, n)
        mode = SamplingMode.of(kinds)
        shape = self.choosers[mode].choose(bucket or n, ids) if self.choosers else self.shapes[0]
        key = StepKey(bucket or n, shape, mode, LogitsFeatures.of(kinds))
        self.req_table.sync_tables(ids)
        if key.features.penalties and not ahead:
            for r in reqs:
                if r.params.penalized:
                    self.req_table.load_history(r, r.num_computed_tokens)
        req_indices = list(map(self.req_table.index_of, ids))
        self.decode_step.batch_indices[:key.bucket].copy_(
            pinned(req_indices + [self.req_table.padding_index] * (key.bucket - n), self.device), non_blocking=True)
        saved = None
        if ahead:
            index = self.decode_step.batch_indices[:n]
            saved = [t.index_select(0, index) for t in self._state(key)]
        width = None if bucket is not None else max(map(len, map(self.pool.table, ids)))
        starts = () if ahead else tuple(map(_num_computed, reqs))
        timer = _StepTimer(self.device) if self.choosers else None  # adaptive: every step's time is measured
        masks = (lambda drafts: self._grammar_masks(reqs, drafts)) if key.features.grammar else None
        out = self.decode_step.run(key, width, masks)
        if timer is not None:
            timer.stop()
        return _Launch(key, ids, starts, HostCopy(out), req_indices, saved, timer)

    def _kinds_of(self, reqs: list[Request], ids: tuple[str, ...]) -> list[SamplingParams]:
        """The params of each kind of request in the batch, once: all a step's SamplingMode and LogitsFeatures read
        (each request's kind found at its first decode step)."""
        kinds = list(map(self._kind_of.get, ids))
        if None in kinds:
            for r in reqs:
                if r.request_id not in self._kind_of:
                    kind = (SamplingMode.of([r.params]), LogitsFeatures.of([r.params]))
                    self._kind_of[r.request_id] = self._kinds.setdefault(kind, r.params)
            kinds = list(map(self._kind_of.__getitem__, ids))
        return list(dict(zip(map(id, kinds), kinds)).values())  # (distinct, by identity)

    def _grammar_masks(self, reqs: list[Request], drafts: Drafts) -> torch.Tensor:
        """The host's part of a grammar step: each row's bitmask at every draft node ([b, n, words] on the
        device), from its grammar state after the committed tokens."""
        masks = self.grammars.tree_masks(reqs, drafts.token_ids.cpu(), drafts.parents.cpu())
        return masks.to(self.device, non_blocking=True)

    def _advance_grammars(self, batch: list[ScheduledRequest], results: StepResults) -> None:
        """Each constrained request's grammar accepts the tokens its step committed."""
        if self.grammars is None:
            return
        at = 0
        for s, n in zip(batch, results.num_new_tokens):
            if s.request.params.structured_outputs is not None:
                self.grammars.get(s.request).accept(results.new_token_ids[at:at + n])
            at += n

    # ---- run-ahead -------------------------------------------------------------------------------
    def _state(self, key: StepKey) -> list[torch.Tensor]:
        """Every per-request buffer a step of this key advances."""
        counts = [self.req_table.output_counts] if key.features.penalties else []
        return ([self.req_table.lengths, self.req_table.last_tokens] + self.states.tensors() + counts
                + (self.proposer.state() if self.proposer else []))

    def _take_ahead(self, ids: tuple[str, ...], starts: tuple[int, ...]) -> _Launch | None:
        """The step run ahead if it serves this batch (each request was in it, from the length it has
        now: requests that have left since do not matter); any other is dropped."""
        launch = self._ahead
        if launch is None:
            return None
        ran = dict(zip(launch.request_ids, launch.starts))
        if ids and tuple(map(ran.get, ids)) == starts:
            self._ahead = None
            return launch
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        """Undo the step run ahead: wait for it, then restore the request state it started from, for the
        indices still held by the requests it ran for."""
        launch, self._ahead = self._ahead, None
        if launch is None:
            return
        launch.copy.wait()
        rows = [i for i, (rid, row) in enumerate(zip(launch.request_ids, launch.req_indices))
                if self.req_table.holds(rid, row)]
        if rows:
            index = torch.tensor(rows, device=self.device)
            req_indices = torch.tensor([launch.req_indices[i] for i in rows], device=self.device)
            for buffer, saved in zip(self._state(launch.key), launch.saved):
                buffer.index_copy_(0, req_indices, saved.index_select(0, index))

    def _may_run_ahead(self, reqs: list[Request], shape: DraftShape, joining: list[ScheduledRequest]) -> bool:
        """Whether to launch the step after this one (which drafts ``shape``) now, for ``reqs`` and ``joining``:
        captured, and its rows reserved for any acceptance of this one (run_ahead.reserve_rows)."""
        ahead = reqs + [s.request for s in joining]
        if self.run_ahead_limit is None or bucket_for(self.graph_buckets, len(ahead)) is None:
            return False
        if any(r.params.structured_outputs is not None for r in ahead):  # its masks need this step's tokens
            return False
        per_step = self.shapes[-1].num_nodes
        lookahead = self.proposer.lookahead if self.proposer is not None else 0
        rows = [r.num_computed_tokens + 2 * per_step + lookahead + 1 for r in reqs] \
            + [_length_after(s) + per_step + lookahead + 1 for s in joining]
        limit = min(self.run_ahead_limit, self.req_table.max_rows)
        return reserve_rows(self.pool, ahead, rows, limit, committed=shape.num_steps + 1)


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
