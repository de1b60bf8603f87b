"""Runs a scheduled batch: prefill chunks through the prefill step (engine/prefill.py), decoding requests
through the decode step (engine/decode_step.py), captured per batch bucket on CUDA, one of them possibly
launched a step ahead (engine/run_ahead.py).

The runner owns the device state a step reads (the request table, recurrent states, KV caches) and
dispatches; the engine builds the parts it is given (the drafter, the draft-shape choosers, the grammar
table) and reads the runner only through its public methods and properties.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import compress, repeat
from operator import attrgetter, sub

import torch
from torch import nn
from tqdm.auto import tqdm

from outpace.attention.context import forward_settings
from outpace.attention.registry import get_backend
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import CacheRows, bind_kv_cache, bound_caches
from outpace.cache.recurrent_states import RecurrentStates
from outpace.engine.cuda_graphs import bucket_for
from outpace.engine.decode_step import DecodeStep
from outpace.engine.launch import DecodeLaunch, HostCopy, SpareCopies, StepTimer
from outpace.engine.prefill import PrefillStep
from outpace.engine.prefill_graphs import PrefillGraphs
from outpace.engine.request_table import RequestTable
from outpace.engine.run_ahead import RunAhead, goes_on, length_after
from outpace.engine.scheduler import ScheduledRequest, is_decoding
from outpace.engine.step_key import HoldRule, LogitsFeatures, SamplingMode, StepKey
from outpace.engine.step_results import StepResults
from outpace.request import Request, position_logprobs
from outpace.sampling_params import SamplingParams
from outpace.speculative.adaptive import DraftLengthChooser
from outpace.speculative.proposer import Drafts, DraftShape, Proposer
from outpace.structured import GrammarTable

logger = logging.getLogger("outpace.engine")

_request_id, _num_computed = attrgetter("request_id"), attrgetter("num_computed_tokens")
_max_tokens, _tokens, _prompt = (
    attrgetter("params.max_tokens"),
    attrgetter("token_ids"),
    attrgetter("prompt_token_ids"),
)


def _remaining(reqs: list[Request]) -> list[int]:
    """The most tokens each request may still generate (at least the one its step is for): max_tokens less its
    output tokens, in C (no call per request: the chooser asks at every step of a closed batch)."""
    lengths, prompts = map(len, map(_tokens, reqs)), map(len, map(_prompt, reqs))
    return list(map(max, repeat(1), map(sub, map(_max_tokens, reqs), map(sub, lengths, prompts))))


class ModelRunner:
    def __init__(
        self,
        model: nn.Module,
        pool: BlockPool,
        kv_dtype: torch.dtype,
        device: str,
        attention_backend: str,
        max_seqs: int,
        max_rows: int,
        proposer: Proposer | None = None,
        shapes: tuple[DraftShape, ...] = (DraftShape(0),),
        choosers: dict[SamplingMode, DraftLengthChooser] | None = None,
        grammars: GrammarTable | None = None,
        batch_invariant: bool = False,
        state_dtype: torch.dtype | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        """``kv_dtype``: the target's paged cache (float8_e4m3fn: an FP8 cache, attention/kv_quant.py);
        ``state_dtype``: hybrid models' recurrent state where a layer declares none (None: ``kv_dtype``),
        which stays in the model's precision under an FP8 cache.
        ``proposer``: the drafter (None: plain decoding), built for ``max_seqs`` requests; ``shapes``
        what it may draft: one shape (fixed), or several, chosen step by step by ``choosers`` (one per
        sampling mode, speculative/adaptive.py); ``grammars``: the structured-output table; ``max_rows``:
        the KV rows a request may reach (its block-table row covers them); ``batch_invariant``: every
        forward in deterministic mode (a forward-context setting, attention/context.py); ``eos_token_ids``: the
        model's end-of-sequence ids, which a request's ``min_tokens`` bans (engine/request_table.py)."""
        self.model, self.pool, self.proposer, self.grammars = model, pool, proposer, grammars
        self.device = torch.device(device)
        self.batch_invariant = batch_invariant
        self.backend = get_backend(attention_backend)
        # NOTE: only the decoder stack: MTP layers belong to the MTP proposer, which binds their KV.
        self.kv_caches = bind_kv_cache(model.model, pool, kv_dtype, device)
        self.req_table = RequestTable(
            pool,
            max_seqs,
            pool.blocks_needed(max_rows),
            self.device,
            model.config.vocab_size,
            eos_token_ids,
        )
        # hybrid models: each request's recurrent state, with a snapshot row per verified node
        self.states = RecurrentStates(
            model.model,
            max_seqs + 1,
            max(s.num_nodes for s in shapes),
            state_dtype or kv_dtype,
            device,
        )
        self.shapes, self.choosers = shapes, choosers or {}
        self.holds = HoldRule(proposer)  # whether a zero-draft step holds (engine/step_key.py)
        self.closed_batch = False  # no request waiting (execute's ``closed``)
        self.decode_step = DecodeStep(
            model, self.backend, self.kv_caches, self.req_table, proposer, max_seqs, self.states
        )
        if grammars is not None:
            nodes = max(s.num_nodes for s in shapes)
            self.decode_step.use_grammar_masks(nodes, grammars.mask_words)
        self.prefill_graphs = PrefillGraphs(
            model, self.backend, self.req_table, max_rows, self.states, proposer
        )
        self.prefill_step = PrefillStep(
            model,
            pool,
            self.backend,
            self.req_table,
            self.states,
            self.prefill_graphs,
            proposer,
            grammars,
        )
        self.graph_buckets: tuple[int, ...] = ()
        self._graph_pool = None  # the captured steps' memory pool (CUDA), which late captures share
        self._uncapturable: set[StepKey] = set()  # keys whose late capture ran out of memory
        self.run_ahead: RunAhead | None = None
        # rows of requests released while the step run ahead for them was in flight, with that step (``release``)
        self._retired: list[tuple[int, DecodeLaunch]] = []
        self._spare_copies: SpareCopies = {}  # host tensors of decode steps' read outputs (launch.py)
        # Each decoding request's kind: the params of the first request seen whose own params gave the same
        # SamplingMode and LogitsFeatures (a step's mode and features depend only on the set of its kinds)
        self._kind_of: dict[str, SamplingParams] = {}
        self._kinds: dict[tuple[SamplingMode, LogitsFeatures], SamplingParams] = {}
        # a set of kinds (their params' ids) -> the mode and features of a step of requests of those kinds
        self._step_kinds: dict[frozenset[int], tuple[SamplingMode, LogitsFeatures]] = {}
        # requests whose kind counts their min_tokens, and how many output tokens end it (``_step_kind``)
        self._min_tokens_ahead: dict[str, int] = {}

    @property
    def has_recurrent_state(self) -> bool:
        """Whether the target keeps a recurrent state per request (hybrid models)."""
        return self.states.has_state

    # ---- set-up ----------------------------------------------------------------------------------
    def release_graphs(self) -> None:
        """Free every captured decode step and prefill forward (engine/cuda_graphs.py ``release``: done
        before a multi-rank engine's process group is destroyed); later steps would run eagerly."""
        prefill = self.prefill_graphs
        for call in (
            *self.decode_step.graphs.values(),
            *prefill.graphs.values(),
            *prefill.absorbs.values(),
        ):
            call.release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def capture(self, buckets: tuple[int, ...], prefill_buckets: tuple[int, ...] = ()) -> None:
        """Capture the decode step for every bucket, draft shape (zero drafts: held and flushing, where the
        drafter holds) and sampling mode, and the forward of up to 32 prefill chunks for the prefill buckets
        the model allows (engine/prefill_graphs.py); on CUDA, elsewhere the replays run the same code
        eagerly. With adaptive speculation, profile each decode step on the GPU (zero drafts: the held
        step, the usual one; the flushes among them are timed as they run)."""
        memory = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.graph_buckets, self._graph_pool = buckets, memory
        keys = [
            StepKey(b, shape, mode, hold=hold, narrow=narrow)
            for b in sorted(buckets, reverse=True)
            for shape in self.shapes
            for hold, narrow in self._window_variants(shape)
            for mode in SamplingMode
        ]
        with forward_settings(self.batch_invariant):
            for key in tqdm(keys, desc="capturing decode steps", disable=len(keys) < 8):
                self.decode_step.capture(key, memory)
            self.prefill_graphs.capture(prefill_buckets, memory)
            if self.choosers and self.device.type == "cuda":
                # the usual step of each shape: held, or drafting over narrow windows
                for key in keys:
                    if (key.hold or not self.holds.may_hold(key.shape)) and key.narrow == (
                        self.holds.narrow_variants(key.shape)[-1]
                    ):
                        cost = self.profile(key)
                        self.choosers[key.mode].record_cost(key.bucket, key.shape, cost)

    def _capture_late(self, key: StepKey) -> None:
        """Capture the step of a key with logits features the first time a batch needs it (``capture`` takes
        those without: penalties, biases and log-probability widths multiply the keys past what start-up
        should capture, and an eager step would cost every request of its batch the launches of a whole
        iteration). The capture's warm-up runs the step over idle rows and leaves every request's state as
        it was (``probe_replays``). A key whose capture ran out of GPU memory stays eager (the memory plan sized
        the KV pool before any such step: engine/memory.py); the engine goes on serving."""
        if key in self._uncapturable:
            return
        try:
            with self.probe_replays(key):
                self.decode_step.capture(key, self._graph_pool)
        except torch.OutOfMemoryError as error:
            self._uncapturable.add(key)
            torch.cuda.empty_cache()
            logger.warning(
                "decode steps of %s run eagerly: capturing one ran out of memory (%s)", key, error
            )

    def _window_variants(self, shape: DraftShape) -> list[tuple[bool, bool]]:
        """The (hold, narrow) flags of the captured steps of ``shape`` (engine/step_key.py)."""
        holds = (False, True) if self.holds.may_hold(shape) else (False,)
        return [
            (hold, narrow)
            for hold in holds
            for narrow in ((False,) if hold else self.holds.narrow_variants(shape))
        ]

    def profile(self, key: StepKey, repeats: int = 5) -> float:
        """Seconds one run of the key's step takes (its graph where captured; on CUDA the GPU's time, elsewhere
        the wall time: ``StepTimer``), over idle rows that each forward a token of their own
        (``probe_replays``): the median of ``repeats`` runs after a first."""
        times = []
        with self.probe_replays(key) as replay:
            for _ in range(repeats + 1):
                timer = StepTimer(self.device)
                replay()
                timer.stop()
                times.append(timer.seconds())
        return sorted(times[1:])[repeats // 2]

    @contextmanager
    def probe_replays(self, key: StepKey) -> Iterator[Callable[[], torch.Tensor]]:
        """Yields a function that runs the key's step for no request (a profile's replays, benchmarks'
        timelines): over rows no request holds (``RequestTable.idle_rows``), each starting from KV length 0
        with a token of its own (a fixed draw), so a mixture routes them apart as it would real requests. On
        the padding row alone every row forwarded one token and the drafts repeated it (tinyds's 4-draft
        verify read 0, 0, 0, 0, 8): the rows met the same few experts, and a MoE's deeper verifies and larger
        batches profiled cheaper than they run. Idle rows' tables point at the padding block, so their KV
        lands where no request reads; every per-request buffer the step advances (``state_buffers``) is
        restored afterwards."""
        table, b = self.req_table, key.bucket
        rows = torch.tensor(table.idle_rows(b), device=table.device)
        draw = torch.Generator().manual_seed(0)
        tokens = torch.randint(table.vocab_size, (b,), generator=draw).to(table.device)
        saved = [t.clone() for t in self.decode_step.state_buffers(key)]
        table.lengths[rows] = 0
        table.last_tokens[rows] = tokens
        self.decode_step.batch_indices.fill_(table.padding_index)
        self.decode_step.batch_indices[:b] = rows
        try:
            yield lambda: self.decode_step.run(key)
        finally:
            for buffer, old in zip(self.decode_step.state_buffers(key), saved):
                buffer.copy_(old)

    def rebind_kv(self) -> None:
        """The pool was resized and its caches reallocated (kv_cache.rebind_kv_caches; start-up, before any
        capture): take the target's new tensors."""
        self.kv_caches = bound_caches(self.model.model)
        self.decode_step.kv_rows = CacheRows(self.kv_caches)

    def enable_run_ahead(self, max_model_len: int) -> None:
        """Run decode steps ahead (engine/run_ahead.py); positions stay below ``max_model_len``."""
        lookahead = self.proposer.lookahead if self.proposer is not None else 0
        self.run_ahead = RunAhead(
            self.pool,
            self.req_table,
            self.decode_step,
            self.shapes[-1].num_nodes,
            lookahead,
            max_model_len,
            self.holds,
            recurrent=self.states.state_bytes_per_request > 0,
        )

    def release(self, request_id: str) -> None:
        """The request finished or was preempted: its row is free, once no step in flight reads it. Where the
        step run ahead ran for the request, the row is retired (held by no one, given to no one) and freed after
        that step has run (``_free_retired``), without waiting for it here, so the host's work after a step goes
        on while the GPU runs the next. The wait this replaces put each tail step of a closed batch (requests
        ending on different steps) after the next one: those steps' wall time beyond the GPU's was 8.5 to 33.8
        ms a closed batch of 64 tokens on an H100 (benchmarks/results/gpu_2026-12-06e, closed_batch_tail.py;
        what this returns is not yet measured)."""
        ahead = self.run_ahead
        if ahead is not None and ahead.ran_for([request_id]):
            ahead.forget(request_id)
            row = self.req_table.retire(request_id)
            if row is not None:
                self._retired.append((row, ahead.launch))
        else:
            self.req_table.release(request_id)
        if self._retired and not self.req_table.held_by:
            # no request left for a step that would free them: the engine idles
            self._free_retired(wait=True)
        self.holds.forget(request_id)
        self._kind_of.pop(request_id, None)
        self._min_tokens_ahead.pop(request_id, None)
        if self.grammars is not None:
            self.grammars.release(request_id)
        for chooser in self.choosers.values():
            chooser.forget(request_id)

    def _free_retired(self, wait: bool) -> None:
        """Free the retired rows (``release``) that no step in flight reads: those whose step has since been
        read or dropped, and with ``wait`` those of the step in flight too, once it has run."""
        in_flight = self.run_ahead.launch if self.run_ahead is not None else None
        kept = []
        for row, launch in self._retired:
            if launch is in_flight:
                if not wait:
                    kept.append((row, launch))
                    continue
                launch.copy.wait()
            self.req_table.free_row(row)
        self._retired = kept

    # ---- a step ----------------------------------------------------------------------------------
    def execute(self, batch: list[ScheduledRequest], closed: bool = False) -> StepResults:
        """Prefill chunks (a token sampled for each that completes its prompt), then one decode step
        for the decoding requests. ``closed``: no request is waiting, so the draft shape is chosen for the
        time until the batch's last token (speculative/adaptive.py)."""
        self.closed_batch = closed
        decoding = [is_decoding(s.request) for s in batch]
        prefill = [s for s, d in zip(batch, decoding) if not d]
        decode = [s.request for s, d in zip(batch, decoding) if d]
        for s in prefill:  # (absorbing its chunk resets the drafter's pending rows)
            self.holds.forget(s.request.request_id)
        if self._retired and prefill:
            # rows for new requests: a retired row waits for its step only where the free ones run short
            self._free_retired(wait=len(prefill) > self.req_table.num_free)
        with forward_settings(self.batch_invariant):
            prefilled = self.prefill_step.run(prefill) if prefill else None
            joining = [s for s in prefill if s.decodes_next]
            decoded = self._decode(decode, joining) if decode else None
        results = StepResults.interleave(decoding, prefilled, decoded)
        self._advance_grammars(batch, results)
        return results

    def _decode(self, reqs: list[Request], joining: list[ScheduledRequest]) -> StepResults:
        """One decode step for ``reqs``; the step after it may be run ahead for them and for the requests whose
        prefill this step completed (``joining``: their rows were written by the prefill, queued before)."""
        ids, starts = tuple(map(_request_id, reqs)), tuple(map(_num_computed, reqs))
        ahead = self.run_ahead
        launch = (ahead.take(ids, starts) if ahead is not None else None) or self._launch(reqs)
        if ahead is not None:
            # a request that surely ends with this step stays out of the step run ahead (``goes_on``)
            going_on = list(map(goes_on, reqs))
            staying = list(compress(reqs, going_on))
            batch = staying + [s.request for s in joining]
            captured = bucket_for(self.graph_buckets, len(batch)) is not None
            if ahead.may_launch(staying, launch.key.shape, joining, captured):
                ahead.launch = self._launch(batch, ahead=True)
        tokens, accepted, depths, entries = self.decode_step.unpack(
            launch.copy.tolist(), launch.key, len(launch.request_ids)
        )
        if self._retired:
            # this step has run (its outputs read): the rows retired while it was in flight are free
            self._free_retired(wait=False)
        chooser = self.choosers.get(launch.key.mode)
        if chooser is not None:
            if launch.timer is not None:
                chooser.record_cost(launch.key.bucket, launch.key.shape, launch.timer.seconds())
            chooser.observe(launch.key.shape, accepted, launch.request_ids)
        order = launch.row_of(ids)
        counts = [accepted[i] + 1 for i in order]
        if (
            ahead is not None and ahead.launch is not None
        ):  # each request's length once this step is committed
            ahead.launch.starts = tuple(
                compress((a + c for a, c in zip(starts, counts)), going_on)
            ) + tuple(map(length_after, joining))
        logprobs = None
        if entries is not None:
            logprobs = [
                position_logprobs(r.params.logprobs or 0, t, *lp)
                for r, i in zip(reqs, order)
                for t, lp in zip(tokens[i], entries[i])
            ]
        n, shape = len(ids), launch.key.shape
        speculative = self.proposer is not None
        return StepResults(
            new_token_ids=[t for i in order for t in tokens[i]],
            num_new_tokens=counts,
            num_committed=counts if speculative else [1] * n,
            num_accepted_drafts=[accepted[i] for i in order] if speculative else [None] * n,
            draft_depths=[None] * n
            if depths is None or not speculative
            else [depths[i] for i in order],
            num_drafts=[shape.num_nodes - 1] * n if speculative else [0] * n,
            max_depth=[shape.num_steps] * n if speculative else [0] * n,
            logprobs=logprobs,
        )

    def _launch(self, reqs: list[Request], ahead: bool = False) -> DecodeLaunch:
        """Write the batch into the decode step's input and run it (captured when a bucket holds it).
        ``ahead``: the step after the one just launched, whose request state it starts from is saved."""
        ids, n = tuple(map(_request_id, reqs)), len(reqs)
        mode, features = self._step_kind(reqs, ids)
        bucket = bucket_for(self.graph_buckets, n)
        shape = self.shapes[0]
        if self.choosers:
            remaining = _remaining(reqs) if self.closed_batch else None
            shape = self.choosers[mode].choose(bucket or n, ids, remaining)
        hold = self.holds.holds(ids, shape)
        narrow = not hold and self.holds.narrow(ids, shape)
        key = StepKey(bucket or n, shape, mode, features, hold, narrow)
        if bucket is not None and features.any and key not in self.decode_step.graphs:
            self._capture_late(key)
        held_before = self.holds.advance(ids, key)
        self.req_table.sync_tables(ids)
        if key.features.penalties and not ahead:
            for r in reqs:
                if r.params.penalized:
                    self.req_table.load_history(r, r.num_computed_tokens)
        req_indices = list(map(self.req_table.index_of, ids))
        self.decode_step.set_rows(req_indices, key.bucket)
        saved = self.run_ahead.saved_state(key, req_indices) if ahead else None
        width = None if bucket is not None else max(len(self.pool.table(rid)) for rid in ids)
        starts = () if ahead else tuple(map(_num_computed, reqs))
        # adaptive: a step's time is measured where it replays its key, or where no graph holds its batch (every step
        # of that size eager). An eager step of a captured bucket (a key whose capture failed) would charge its
        # launches to the replays' cost of its shape, which a shape no longer chosen keeps until a probe: after a
        # run of eager steps (logits features uncaptured) adaptive EAGLE3 decoded plainly for every later batch,
        # 1559 tok/s against 4551 before at batch 8 (benchmarks/results/gpu_2026-12-07c, call 4).
        timed = self.choosers and (bucket is None or key in self.decode_step.graphs)
        timer = StepTimer(self.device) if timed else None
        masks = None
        if key.features.grammar and shape.num_steps:
            masks = lambda drafts: self._grammar_masks(reqs, drafts)  # noqa: E731
        elif key.features.grammar:
            self._write_node_masks(reqs, key.bucket)
        out = self.decode_step.run(key, width, masks)
        if timer is not None:
            timer.stop()
        copy = HostCopy(out, self._spare_copies)
        return DecodeLaunch(key, ids, starts, copy, req_indices, saved, timer, held_before)

    def _step_kind(
        self, reqs: list[Request], ids: tuple[str, ...]
    ) -> tuple[SamplingMode, LogitsFeatures]:
        """The step's SamplingMode and LogitsFeatures, which depend only on the set of its requests' kinds (each
        request's kind found at its first decode step; each set's mode and features once). A request with
        ``min_tokens`` changes kind once its output holds them: the stop ids' mask has no position left to hold,
        so its params without them give its kind, and a batch of it no longer processes its logits for it (before,
        every step of its batch did for the request's whole life)."""
        if self._min_tokens_ahead:
            for r in reqs:
                held = self._min_tokens_ahead.get(r.request_id)
                if held is not None and r.num_output_tokens >= held:
                    del self._min_tokens_ahead[r.request_id], self._kind_of[r.request_id]
        kinds = list(map(self._kind_of.get, ids))
        if None in kinds:
            for r in reqs:
                if r.request_id not in self._kind_of:
                    params = r.params
                    if params.min_tokens > r.num_output_tokens:
                        self._min_tokens_ahead[r.request_id] = params.min_tokens
                    elif params.min_tokens:
                        params = params.replace(min_tokens=0)
                    kind = (SamplingMode.of([params]), LogitsFeatures.of([params]))
                    self._kind_of[r.request_id] = self._kinds.setdefault(kind, params)
            kinds = list(map(self._kind_of.__getitem__, ids))
        distinct = frozenset(map(id, kinds))  # (the kinds' params live in _kinds for good)
        step = self._step_kinds.get(distinct)
        if step is None:
            params = list({id(k): k for k in kinds}.values())
            step = self._step_kinds[distinct] = (SamplingMode.of(params), LogitsFeatures.of(params))
        return step

    def _write_node_masks(self, reqs: list[Request], bucket: int) -> None:
        """Before a zero-draft step with a grammar: each row's bitmask after its committed tokens (padding
        rows: none) into ``DecodeStep.grammar_masks``, which the step reads, captured or not."""
        self.grammars.next_token_masks(reqs, self.decode_step.grammar_masks[:bucket, :1])

    def _grammar_masks(self, reqs: list[Request], drafts: Drafts) -> torch.Tensor:
        """The host's part of a grammar step (``TokenMasks``): each row's bitmask at every draft node, from its
        grammar state after the committed tokens, written into ``DecodeStep.grammar_masks`` [b, n, words]."""
        read = torch.stack([drafts.token_ids, drafts.parents]).cpu()  # [2, b, n]: one read back
        tokens, parents = read
        out = self.decode_step.grammar_masks[: tokens.shape[0], : tokens.shape[1]]
        return self.grammars.tree_masks(reqs, tokens, parents, out)

    def _advance_grammars(self, batch: list[ScheduledRequest], results: StepResults) -> None:
        """Each constrained request's grammar accepts the tokens its step committed."""
        if self.grammars is None:
            return
        at = 0
        for s, n in zip(batch, results.num_new_tokens):
            if s.request.params.structured_outputs is not None:
                self.grammars.get(s.request).accept(results.new_token_ids[at : at + n])
            at += n
