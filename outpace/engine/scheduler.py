"""Continuous batching with chunked prefill and preemption by recomputation.

Each step: running requests first (in arrival order), each scheduled for the tokens it has not
computed yet (1 for a decoding request, the rest of its prompt for one in prefill), within the
token budget; then waiting requests join while budget, request rows and free blocks allow.
When a running request cannot get a block, the most recently admitted running request is
preempted: its blocks return to the pool and it goes back to the front of the queue, to be
recomputed from its prompt plus the tokens it already produced.

With a prefix cache (cache/prefix_cache.py) a request joining starts from the longest run of published
blocks of its tokens (never its last token, which must be forwarded to sample the next one; for a request
recomputed after preemption, never the token before it either, which decoding resumes after; none for a
request asking for prompt log-probabilities), and after
every step each running request publishes its full blocks whose rows are settled: computed, and past the
drafter's ``unsettled_rows``.

A hybrid target's prefix also needs its recurrent state (cache/state_checkpoints.py): with ``checkpoints``, a
request joins from the longest run of published blocks that ends where a checkpoint was saved, whose state its
row loads; a prefill chunk that ends on a block boundary saves a checkpoint there, and a chunk ends early at two
boundaries (``_cut_at_checkpoint``): where its tokens leave the published blocks of other requests (so the
second request sharing a system prompt leaves a checkpoint at its end, for the third and later ones), and its
last boundary before its last token (a repeated prompt, a chat's next turn); the rest forwards in the next step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from outpace.cache.block_pool import BlockPool
from outpace.cache.state_checkpoints import StateCheckpoints
from outpace.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    num_reused_tokens: int = (
        0  # joining now: rows 0 .. num_reused_tokens - 1 came from the prefix cache
    )
    # hybrid targets (cache/state_checkpoints.py): the checkpoint a joining request's state row starts from,
    # and the one the chunk's state is saved to after its forward
    load_checkpoint: int | None = None
    save_checkpoint: int | None = None

    @property
    def completes_sequence(self) -> bool:
        """True when this chunk reaches the request's last token, so a new token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens

    @property
    def decodes_next(self) -> bool:
        """True when the request decodes after this chunk (``is_decoding``): it completes the sequence,
        or, recomputing a preempted request, stops just before its last token, which then decodes."""
        end, req = self.request.num_computed_tokens + self.num_new_tokens, self.request
        return end == req.num_tokens or (end == req.num_tokens - 1 and req.num_output_tokens > 0)


def is_decoding(req: Request, computed: int | None = None) -> bool:
    """Past its prefill: one uncomputed token (the last sampled one). ``computed``: the tokens with KV
    (default: ``num_computed_tokens``)."""
    computed = req.num_computed_tokens if computed is None else computed
    tokens = req.token_ids
    return len(tokens) - computed == 1 and len(tokens) > len(
        req.prompt_token_ids
    )  # (some output token)


class Scheduler:
    """``decode_tokens``: tokens one decoding request puts in a forward (1, or the verified tree
    size with speculation); ``lookahead``: KV rows reserved past a decoding request's last token
    (draft and verify rows). ``on_free`` is told about every request whose blocks are freed;
    ``unsettled_rows``: the drafter's (speculative/proposer.py), 0 without one; ``checkpoints``: a hybrid
    target's recurrent-state checkpoints (module docstring), with the pool's prefix cache."""

    def __init__(
        self,
        pool: BlockPool,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        decode_tokens: int = 1,
        lookahead: int = 0,
        on_free: Callable[[Request], None] = lambda req: None,
        unsettled_rows: int = 0,
        checkpoints: StateCheckpoints | None = None,
    ) -> None:
        if checkpoints is not None and pool.prefix_cache is None:
            raise ValueError("state checkpoints serve a prefix cache: the pool has none")
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.decode_tokens = decode_tokens
        self.lookahead = lookahead
        self.on_free = on_free
        self.unsettled_rows = unsettled_rows
        self.checkpoints = checkpoints
        # request id -> the checkpoint slot its scheduled chunk saves, confirmed by ``settle``
        self._saving: dict[str, int] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.failed: list[
            Request
        ] = []  # failed while being scheduled, not yet reported (the engine drains it)
        self.suspects: dict[
            str, int
        ] = {}  # request id -> computed tokens when its batch's step failed

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _demand(self, req: Request, budget: int, computed: int) -> tuple[int, int, int]:
        """(new tokens to schedule, forward tokens they cost, KV rows needed) within ``budget``, the request
        having KV for its first ``computed`` tokens."""
        if is_decoding(req, computed):
            return 1, self.decode_tokens, computed + 1 + self.lookahead
        n = min(req.num_tokens - computed, budget)
        if self.checkpoints is not None:
            n = self._cut_at_checkpoint(req, computed, n)
        return n, n, computed + n

    def _cut_at_checkpoint(self, req: Request, computed: int, n: int) -> int:
        """A prefill chunk [computed, computed + n) of a hybrid target cut at the first of two block boundaries
        inside it, each saving a checkpoint: where the request's tokens leave the published blocks (another
        request's prefix, e.g. a shared system prompt: the next request sharing it then starts there), and its
        last boundary before its last token (a repeated prompt, a chat's next turn)."""
        bs, ahead = self.pool.block_size, self.pool.prefix_cache.reads_ahead
        shared = len(self.pool.cached_blocks(req.request_id, req.token_ids, req.num_tokens - 1))
        last = (req.num_tokens - max(1, ahead)) // bs
        cuts = [b * bs for b in (shared, last) if computed < b * bs < computed + n]
        return min(cuts) - computed if cuts else n

    def schedule(self) -> list[ScheduledRequest]:
        """The next step's batch. While suspects remain (``isolate``), the first of them runs alone."""
        if self.checkpoints is not None:  # (saves of a step that failed: never confirmed)
            self.checkpoints.release_pending()
            self._saving.clear()
        suspect = None
        if self.suspects:  # (after a failed step only)
            suspect = next(
                (r for r in [*self.running, *self.waiting] if r.request_id in self.suspects), None
            )
        if suspect is None:
            return self._schedule(list(self.running), self.max_num_seqs)
        if suspect in self.running:
            return self._schedule([suspect], 0)
        self.waiting.remove(suspect)
        self.waiting.appendleft(suspect)
        return self._schedule([], 1)

    def _schedule(self, running: list[Request], max_joining: int) -> list[ScheduledRequest]:
        """``running`` requests first, then up to ``max_joining`` waiting ones. A request whose scheduling
        raises is failed alone (``failed``)."""
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        for req in running:
            try:
                chunk = self._continue(req, budget)
            except Exception as error:  # noqa: BLE001 - this request's failure is its own
                self.fail(req, error)
                continue
            if chunk is not None:
                scheduled.append(chunk[0])
                budget -= chunk[1]
        joined = 0
        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and joined < max_joining
        ):
            req = self.waiting[0]
            try:
                chunk = self._join(req, budget)
            except Exception as error:  # noqa: BLE001 - this request's failure is its own
                self.fail(req, error)
                continue
            if chunk is None:
                break
            scheduled.append(chunk[0])
            budget -= chunk[1]
            joined += 1
        return scheduled

    def _continue(self, req: Request, budget: int) -> tuple[ScheduledRequest, int] | None:
        """A running request's chunk within ``budget`` and its forward cost (None: none now), its blocks
        grown, preempting the most recently admitted requests (itself included) while the pool cannot hold
        them."""
        if req.status is not RequestStatus.RUNNING:
            return None
        n, cost, rows = self._demand(req, budget, req.num_computed_tokens)
        if n == 0 or cost > budget:
            return None
        while not self.pool.try_grow(req.request_id, rows):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is req:
                break
        if req.status is not RequestStatus.RUNNING:
            return None
        return self._with_checkpoint(ScheduledRequest(req, n)), cost

    def _join(self, req: Request, budget: int) -> tuple[ScheduledRequest, int] | None:
        """Admit the first waiting request, from its cached prefix, if budget and free blocks allow: its
        chunk and forward cost."""
        reused, load = self._cached_prefix(req)
        computed = len(reused) * self.pool.block_size
        n, cost, rows = self._demand(req, budget, computed)
        needed = self.pool.blocks_needed(rows) - len(reused) + self.pool.blocks_taken(reused)
        if cost > budget or needed > self.pool.num_free:
            return None
        self.waiting.popleft()
        self.pool.reuse(req.request_id, reused)
        req.num_computed_tokens = computed
        if self.pool.prefix_cache is not None:
            stats = self.pool.prefix_cache.stats
            stats.queries += req.num_tokens
            stats.hits += computed
        self.pool.grow(req.request_id, rows)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return self._with_checkpoint(ScheduledRequest(req, n, computed, load_checkpoint=load)), cost

    def _with_checkpoint(self, chunk: ScheduledRequest) -> ScheduledRequest:
        """``chunk`` with a checkpoint slot to save to when it is a prefill chunk ending on a block boundary
        whose key can be formed (its read-ahead tokens known) and has no checkpoint yet."""
        req, start = chunk.request, chunk.request.num_computed_tokens
        if self.checkpoints is None or is_decoding(req, start):
            return chunk
        end, bs = start + chunk.num_new_tokens, self.pool.block_size
        if end % bs or end + self.pool.prefix_cache.reads_ahead > req.num_tokens:
            return chunk
        key = self.pool.prefix_cache.keys(req.request_id, req.token_ids, end // bs)[-1]
        chunk.save_checkpoint = self.checkpoints.reserve(key, self.pool.prefix_cache.has_key)
        if chunk.save_checkpoint is not None:
            self._saving[req.request_id] = chunk.save_checkpoint
        return chunk

    def decode_chunk(self, req: Request) -> ScheduledRequest | None:
        """A decode step for a running, decoding request that ``schedule`` left out (its token budget spent),
        which a hybrid's step run ahead has advanced and so must decode now (engine/run_ahead.py ``reconcile``):
        its rows grown (already reserved by the step run ahead), else it is preempted (None: recomputed later)."""
        _, _, rows = self._demand(req, self.decode_tokens, req.num_computed_tokens)
        if self.pool.try_grow(req.request_id, rows):
            return ScheduledRequest(req, 1)
        self.preempt(req)
        return None

    def isolate(self, batch: list[Request]) -> None:
        """A step of ``batch`` failed and the fault cannot be told apart: every running request is preempted
        (recomputed later: outputs so far are kept) and the batch's requests become suspects, each then run
        alone until it gets past the point where the step failed (``cleared``); one that fails alone is
        failed alone."""
        for req in batch:
            self.suspects[req.request_id] = req.num_computed_tokens
        for req in reversed(self.running):
            self.preempt(req)

    def cleared(self, req: Request) -> None:
        """After a step that ran for ``req``: a suspect past the point where its batch failed is one no more."""
        mark = self.suspects.get(req.request_id)
        if mark is not None and req.num_computed_tokens > mark:
            del self.suspects[req.request_id]

    def fail(self, req: Request, error: BaseException) -> None:
        """End one request with ``error`` (finish_reason "error"), returning whatever it holds (nothing
        when it failed while finishing: its blocks are back already); the engine reports it from
        ``failed``."""
        req.error = f"{type(error).__name__}: {error}"
        if req.status is RequestStatus.FINISHED:
            req.finish_reason = "error"
        else:
            self.finish(req, "error")
        self.failed.append(req)

    def _cached_prefix(self, req: Request) -> tuple[list[int], int | None]:
        """The published blocks a joining request starts from (module docstring), and with checkpoints the one
        its state row loads (None: no blocks, or no checkpoints)."""
        if (
            self.pool.prefix_cache is None or req.params.prompt_logprobs is not None
        ):  # (every prompt row's logits)
            return [], None
        keep = 2 if req.num_output_tokens > 0 else 1  # rows the request must still forward
        blocks = self.pool.cached_blocks(req.request_id, req.token_ids, req.num_tokens - keep)
        if self.checkpoints is None or not blocks:
            return blocks, None
        keys = self.pool.prefix_cache.keys(req.request_id, req.token_ids, len(blocks))
        for n in range(len(blocks), 0, -1):
            if self.checkpoints.lookup(keys[n - 1]) is not None:
                return blocks[:n], self.checkpoints.use(keys[n - 1])
        return [], None

    def settle(self, req: Request) -> None:
        """After a step: publish the request's blocks whose rows are settled (module docstring), and confirm
        the checkpoint its chunk saved."""
        slot = self._saving.pop(req.request_id, None)
        if slot is not None:
            self.checkpoints.confirm(slot)
        self.pool.publish(
            req.request_id, req.token_ids, req.num_computed_tokens - self.unsettled_rows
        )

    def preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.free(req.request_id)
        self.on_free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.metrics.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request, reason: str) -> None:
        """Remove a request (finished or aborted) wherever it is and return its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.pool.free(req.request_id)
        self.pool.forget(req.request_id)
        self.on_free(req)
        self.suspects.pop(req.request_id, None)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
