"""Continuous batching with chunked prefill and preemption by recomputation.

Each step: running requests first (in arrival order), each scheduled for the tokens it has not
computed yet (1 for a decoding request, the rest of its prompt for one in prefill), within the
token budget; then waiting requests join while budget, sequence slots and free blocks allow.
When a running request cannot get a block, the most recently admitted running request is
preempted: its blocks return to the pool and it goes back to the front of the queue, to be
recomputed from its prompt plus the tokens it already produced.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from outpace.cache.block_pool import BlockPool
from outpace.engine.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def completes_sequence(self) -> bool:
        """True when this chunk reaches the request's last token, so a new token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


class Scheduler:
    def __init__(self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, lookahead: int = 0) -> list[ScheduledRequest]:
        """``lookahead`` extra KV slots are reserved for decoding requests (speculative drafts)."""
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        for req in list(self.running):
            if req.status is not RequestStatus.RUNNING or budget == 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.pool.can_hold(req.request_id, req.num_computed_tokens + n + lookahead):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                continue
            self.pool.grow(req.request_id, req.num_computed_tokens + n + lookahead)
            scheduled.append(ScheduledRequest(req, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.pool.can_hold(req.request_id, req.num_computed_tokens + n + lookahead):
                break
            self.waiting.popleft()
            self.pool.grow(req.request_id, req.num_computed_tokens + n + lookahead)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(ScheduledRequest(req, n))
            budget -= n
        return scheduled

    def preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.free(req.request_id)
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
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
