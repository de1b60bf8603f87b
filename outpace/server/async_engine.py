"""The engine behind the HTTP layer: one thread owns the ``LLMEngine``; asyncio handlers talk to it.

The engine is not thread-safe, so exactly one thread (``outpace-engine``) calls ``submit``,
``abort_request`` and ``step``. Handlers hand it commands through a thread-safe queue (add a
group of requests, abort some, stop) and get each request's outputs back on an asyncio queue
through ``loop.call_soon_threadsafe``. When nothing is unfinished the thread blocks on the
command queue (no busy spin); otherwise it drains commands between steps, so a new request joins
the running batch at the next step and an abort frees its KV blocks before the next step. A step's
outputs reach the event loop in one wake-up (``_flush``), not one per request.

The thread also records the Prometheus metrics and logs a throughput / tau line every
``log_interval`` seconds while busy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from outpace.config import EngineConfig
from outpace.engine.engine import LLMEngine
from outpace.engine.start_up import load_tokenizer
from outpace.request import Request, RequestOutput, RequestStatus
from outpace.sampling_params import SamplingParams
from outpace.server.metrics import ServerMetrics
from outpace.speculative.metrics import SpecMetrics

logger = logging.getLogger("outpace.server")


class EngineError(RuntimeError):
    """The engine failed while running a request (answered 500), or is not running (503)."""


class QueueFull(RuntimeError):
    """Too many requests are waiting (answered 429)."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after every step and command batch."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_free: int = 0
    kv_blocks_total: int = 0


@dataclass
class _Tracked:
    """Engine-thread bookkeeping for one request."""

    request: Request
    stream: GenerationStream
    index: int
    num_tokens: int = 0
    last_token_time: float = 0.0
    scheduled: bool = False
    seen: SpecMetrics = field(default_factory=SpecMetrics)


class GenerationStream:
    """The outputs of a group of requests (an HTTP request's prompts x n), as ``(index, output)``.

    Unfinished outputs carry the text so far; each request ends with one ``finished`` output.
    ``abort()`` (idempotent) aborts whatever has not finished; call it when the client goes away.
    NOTE: unfinished outputs are cumulative, so a newer one replaces an unread older one: a slow
    reader holds at most one pending unfinished output per request, however long it lags.
    """

    def __init__(
        self, engine: AsyncEngine, requests: Sequence[Request], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.requests = list(requests)
        self._pending = {r.request_id for r in requests}
        self._latest: dict[
            int, tuple[int, RequestOutput]
        ] = {}  # unread unfinished output per index
        self._aborted = False

    @property
    def finished(self) -> bool:
        return not self._pending

    def _put(self, item) -> None:  # engine thread
        _post(self._loop, [(self, item)])

    def _deliver(self, item) -> None:  # event loop
        if isinstance(item, tuple) and not item[1].finished:
            index = item[0]
            queued = index in self._latest
            self._latest[index] = item
            if queued:
                return
            item = ("latest", index)
        self._queue.put_nowait(item)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        if not self._pending:
            raise StopAsyncIteration
        while True:
            try:
                item = (
                    self._queue.get_nowait()
                    if not self._queue.empty()
                    else await asyncio.wait_for(self._queue.get(), timeout=1.0)
                )
                break
            except asyncio.TimeoutError:
                if not self._engine._thread.is_alive() and self._queue.empty():
                    self._pending.clear()
                    raise EngineError("the engine stopped before the request finished") from None
        if isinstance(item, BaseException):
            self._pending.clear()
            raise item
        if item[0] == "latest":
            item = self._latest.pop(item[1])
        index, out = item
        if out.finished:
            self._pending.discard(out.request_id)
        return index, out

    def abort(self) -> None:
        if self._pending and not self._aborted:
            self._aborted = True
            self._engine._commands.put(("abort", list(self._pending)))


def _post(loop: asyncio.AbstractEventLoop, items: list[tuple[GenerationStream, object]]) -> None:
    """Deliver ``items`` (stream, output or error) on ``loop``, in order, in one wake-up (engine thread)."""

    def deliver() -> None:
        for stream, item in items:
            stream._deliver(item)

    try:
        loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


class AsyncEngine:
    def __init__(
        self,
        config: EngineConfig,
        metrics: ServerMetrics | None = None,
        log_interval: float = 10.0,
        progress: bool = False,
        engine=None,
    ) -> None:
        """``engine``: the engine to drive (default: a new ``LLMEngine``); a data-parallel replica's is a
        ``RemoteEngine`` answering the same calls from its own process (server/replicas.py)."""
        self.config = config
        self.engine = engine if engine is not None else LLMEngine(config, progress=progress)
        self.engine.stream_outputs = True
        # NOTE: the HTTP side tokenizes with its own tokenizer instance, never the engine's.
        self.tokenizer = load_tokenizer(
            config.tokenizer or config.model, given=bool(config.tokenizer)
        )
        self.max_model_len = self.engine.max_model_len
        self.vocab_size = self.engine.model_config.vocab_size
        self.max_num_seqs = config.max_num_seqs
        self.metrics = metrics
        self.log_interval = log_interval
        self.stats = EngineStats(
            kv_blocks_free=self.engine.pool.num_free, kv_blocks_total=self.engine.pool.num_blocks
        )
        self.error: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # NOTE: reentrant: the engine thread holds it across the requests a step (or an abort) ends
        # and the places they free, so open_stream sees both or neither (``_done`` nests); never
        # across a call into the engine, which may wait on a replica's pipe.
        self._lock = threading.RLock()
        self._num_unfinished = 0  # submitted (or about to be) and not yet finished; under _lock
        # the running batch as the last step left it, and the requests it held back (both less
        # those ended since): the places open_stream counts on (``_num_waiting``); under _lock
        self._num_running = self._num_held_back = 0
        self._stopping = False
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._outbox: list[
            tuple[GenerationStream, object]
        ] = []  # engine thread: outputs not yet flushed
        self._thread = threading.Thread(target=self._run, name="outpace-engine", daemon=True)
        self._interval = _Interval(time.perf_counter())
        if metrics is not None:
            for name, attr in (
                ("num_requests_running", "num_running"),
                ("num_requests_waiting", "num_waiting"),
                ("kv_blocks_free", "kv_blocks_free"),
                ("kv_blocks_total", "kv_blocks_total"),
            ):
                metrics.bind_gauge(f"outpace:{name}", lambda a=attr: getattr(self.stats, a))
            metrics.watch_prefix_cache(lambda: self.engine.prefix_cache_stats)

    # ---- event-loop side ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def num_unfinished(self) -> int:
        return self._num_unfinished

    def new_request(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> Request:
        """Validate one request (ValueError naming the problem). Called from a worker thread (server/app.py): with
        token ids and an explicit id, ``LLMEngine.new_request`` reads only immutable engine fields, and compiles the
        request's constraint (xgrammar's compiler is thread-safe; ``GrammarCompiler`` builds it under a lock)."""
        return self.engine.new_request(prompt_token_ids, params, request_id)

    def open_stream(
        self, requests: Sequence[Request], max_queued: int | None = None
    ) -> GenerationStream:
        """Queue a group of validated requests and return its output stream.

        Raises QueueFull when requests already wait (``_num_waiting``) and, with this group, more
        than ``max_queued`` would (so with none waiting, one group is taken), EngineError when the
        engine is not running.
        """
        if not self.alive or self._stopping:
            raise EngineError(
                "the engine is not running" if not self.alive else "the server is shutting down"
            )
        with self._lock:
            waiting = self._num_waiting()
            if max_queued is not None and waiting and self._num_waiting(len(requests)) > max_queued:
                raise QueueFull(
                    f"the server is busy: max_queued_requests={max_queued} requests may wait for a "
                    f"place in the running batch (--max-queued-requests) and {waiting} do; retry later"
                )
            self._num_unfinished += len(requests)
        stream = GenerationStream(self, requests, asyncio.get_running_loop())
        self._commands.put(("add", stream))
        return stream

    def _num_waiting(self, joining: int = 0) -> int:
        """The unfinished requests (and ``joining`` more) that wait for a place in the running batch
        (under ``_lock``). Where the last step held requests back (no KV blocks or token budget for
        them, preempted), every later one waits behind them: all beyond the batch it left running
        wait. Otherwise a request finds a free place among the ``max_num_seqs``, also one of a burst
        that came before the engine's next step (not all of it waiting, as a count of the unfinished
        less the running would have it)."""
        seats = self._num_running if self._num_held_back else self.max_num_seqs
        return max(self._num_unfinished + joining - seats, 0)

    def health(self) -> dict:
        """Details /health adds to its body: none for one engine (replicas.py lists its replicas)."""
        return {}

    @property
    def spans_ranks(self) -> bool:
        """The engine is rank 0 of several (tensor or expert parallel: distributed/launch.py)."""
        # (a data-parallel replica's RemoteEngine has none: its process handles its own ranks)
        ranks = getattr(self.engine, "ranks", None)
        return ranks is not None and ranks.group.size > 1

    @property
    def fatal_error(self) -> BaseException | None:
        """What stopped an engine of several ranks for good (a rank died, a collective failed): the server
        stops on it (server/app.py ``run_server``) instead of answering 503 with its other ranks gone."""
        return self.error if self.spans_ranks else None

    def stop(self, timeout: float | None = None) -> None:
        """Finish the in-flight requests, stop the engine thread, then close the engine (blocking; an
        engine of several ranks releases its other ranks, in order, before the process exits)."""
        self._stopping = True
        self._commands.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():  # in-flight work outlived the timeout: abort it
            self._commands.put(("abort_all", None))
            self._thread.join(10)
        if not self._thread.is_alive():  # (a thread still stepping owns the engine: left as it is)
            self.engine.close()

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished_requests
                if not busy and self._stopping:
                    self._maybe_log(time.perf_counter(), force=True)
                    break
                self._handle_commands(block=not busy)
                if self.engine.has_unfinished_requests:
                    self._step()
                else:
                    self._publish()
                self._maybe_log(time.perf_counter())
        except BaseException as e:
            self.error = e
            logger.exception("the engine thread died")
            self._fail_all(EngineError(f"the engine failed: {e}"))
        finally:
            try:
                self._publish()
            except Exception:  # the engine may be broken; the snapshot is best effort
                logger.debug("could not publish the final engine stats", exc_info=True)

    def _handle_commands(self, block: bool) -> None:
        """Run the queued commands; with ``block``, first wait for one (or for the next log line)."""
        while True:
            timeout = None
            if block and not self._interval.idle:
                timeout = max(self._interval.start + self.log_interval - time.perf_counter(), 0.0)
            try:
                kind, arg = self._commands.get(block=block, timeout=timeout)
            except queue.Empty:
                return
            if block and self._interval.idle:  # woken from idle: a new log window starts now
                self._interval = _Interval(time.perf_counter())
            block = False
            if kind == "add":
                self._add(arg)
            elif kind == "abort":
                for request_id in arg:
                    self._abort(request_id)
            elif kind == "abort_all":
                for request_id in list(self._tracked):
                    self._abort(request_id)
            elif kind == "stop":
                self._stopping = True
            self._publish()
            self._flush()

    def _add(self, stream: GenerationStream) -> None:
        for index, req in enumerate(stream.requests):
            try:
                self.engine.submit(req)
            except Exception as e:  # noqa: BLE001 - e.g. a duplicate id: fail this group, keep serving
                for r in stream.requests[:index]:
                    self._abort(r.request_id)
                self._done(len(stream.requests) - index)
                stream._put(EngineError(f"could not queue request {req.request_id}: {e}"))
                return
            self._tracked[req.request_id] = _Tracked(req, stream, index)

    def _abort(self, request_id: str) -> None:
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return
        out = self.engine.abort_request(request_id)
        # (a data-parallel replica's output comes from a later step)
        if out is not None:
            with self._lock:  # (it ended, and its place is free: see _lock)
                self._record(tracked, out, time.perf_counter())
                self._publish()

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as e:
            if self.spans_ranks:  # its ranks cannot go on apart (LLMEngine.step stopped them)
                raise
            logger.exception("engine step failed; aborting its requests")
            error = EngineError(f"the engine failed: {e}")
            for request_id in self._tracked:
                self.engine.abort_request(request_id)  # if this raises too, the thread dies (above)
            with self._lock:  # (see _lock)
                for tracked in self._tracked.values():
                    self._done(1)
                    tracked.stream._put(error)
                self._tracked.clear()
                self._publish()
            return
        now = time.perf_counter()
        for tracked in self._tracked.values():
            if not tracked.scheduled and (
                tracked.request.status is not RequestStatus.WAITING
                or tracked.request.num_computed_tokens > 0
            ):
                tracked.scheduled = True
                if self.metrics is not None:
                    self.metrics.queue_time.observe(
                        max(start - tracked.request.metrics.arrival_time, 0.0)
                    )
        # NOTE: publish before handing outputs out, so a client that saw its last token sees the
        # freed KV blocks in /health and /metrics.
        with self._lock:  # (the requests this step ended, and the places it left: see _lock)
            for out in outputs:
                tracked = self._tracked.get(out.request_id)
                if tracked is not None:
                    self._record(tracked, out, now)
            self._publish(stepped=True)
        self._flush()

    def _record(self, tracked: _Tracked, out: RequestOutput, now: float) -> None:
        """Metrics for one output, then hand it to its stream."""
        m, iv = self.metrics, self._interval
        new = len(out.token_ids) - tracked.num_tokens
        if new > 0:
            if tracked.num_tokens == 0:
                iv.prompt_tokens += len(out.prompt_token_ids)
                if m is not None:
                    m.prompt_tokens.inc(len(out.prompt_token_ids))
                    first = out.metrics.first_token_time or now
                    m.ttft.observe(max(first - out.metrics.arrival_time, 0.0))
            elif m is not None:
                gap = max(now - tracked.last_token_time, 0.0) / new
                for _ in range(new):
                    m.itl.observe(gap)
            iv.generation_tokens += new
            if m is not None:
                m.generation_tokens.inc(new)
            tracked.num_tokens, tracked.last_token_time = len(out.token_ids), now
        self._record_spec(tracked, out.spec_metrics)
        if out.finished:
            self._tracked.pop(out.request_id, None)
            self._done(1)
            if m is not None:
                finished = out.metrics.finished_time or now
                m.e2e.observe(max(finished - out.metrics.arrival_time, 0.0))
                m.finished(out.finish_reason)
            # NOTE: the output shares the request's mutable metrics objects; hand out copies.
            out = dataclasses.replace(
                out,
                metrics=dataclasses.replace(out.metrics),
                spec_metrics=SpecMetrics().merge(out.spec_metrics),
            )
        failure = out.error is not None  # this request alone failed: its client gets the error
        item = (
            EngineError(f"request {out.request_id} failed: {out.error}")
            if failure
            else (tracked.index, out)
        )
        self._outbox.append((tracked.stream, item))

    def _flush(self) -> None:
        """Hand the outputs recorded since the last flush to their streams' event loops, one wake-up each."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, item in self._outbox:
            by_loop.setdefault(stream._loop, []).append((stream, item))
        self._outbox = []
        for loop, items in by_loop.items():
            _post(loop, items)

    def _record_spec(self, tracked: _Tracked, spec: SpecMetrics) -> None:
        seen, m, iv = tracked.seen, self.metrics, self._interval
        verifies = spec.num_verifies - seen.num_verifies
        if verifies <= 0:
            return
        drafts = spec.num_draft_tokens - seen.num_draft_tokens
        accepted = spec.num_accepted_drafts - seen.num_accepted_drafts
        per_pos = [
            a - (seen.accepted_per_position[i] if i < len(seen.accepted_per_position) else 0)
            for i, a in enumerate(spec.accepted_per_position)
        ]
        proposed = [
            p - (seen.proposed_per_position[i] if i < len(seen.proposed_per_position) else 0)
            for i, p in enumerate(spec.proposed_per_position)
        ]
        tracked.seen = SpecMetrics().merge(spec)
        iv.spec = iv.spec.merge(
            SpecMetrics(verifies, drafts, accepted, per_pos, proposed_per_position=proposed)
        )
        if m is not None:
            m.spec_drafts.inc(verifies)
            m.spec_draft_tokens.inc(drafts)
            m.spec_accepted.inc(accepted)
            for pos, n in enumerate(per_pos):
                m.accepted_at(pos).inc(n)

    def _done(self, n: int) -> None:
        with self._lock:
            self._num_unfinished -= n

    def _publish(self, stepped: bool = False) -> None:
        """The stats snapshot, and the places of the running batch (``_num_waiting``): as a step left
        them (``stepped``: the requests still waiting are those its scheduling held back), else less
        the requests ended since (one queued since is not held back: the next step schedules it)."""
        s = self.engine.scheduler
        running, waiting = len(s.running), len(s.waiting)
        self.stats = EngineStats(
            running, waiting, self.engine.pool.num_free, self.engine.pool.num_blocks
        )
        with self._lock:
            self._num_running = running
            self._num_held_back = waiting if stepped else min(self._num_held_back, waiting)

    def _fail_all(self, error: EngineError) -> None:
        self._flush()
        for request_id, tracked in list(self._tracked.items()):
            self._tracked.pop(request_id, None)
            self._done(1)
            tracked.stream._put(error)
        while True:  # groups still in the command queue
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._done(len(arg.requests))
                arg._put(error)

    def _maybe_log(self, now: float, force: bool = False) -> None:
        iv = self._interval
        elapsed = now - iv.start
        if elapsed < self.log_interval and not (force and elapsed > 0):
            return
        if iv.idle:
            self._interval = _Interval(now)
            return
        st = self.stats
        line = (
            f"prompt throughput {iv.prompt_tokens / elapsed:.1f} tokens/s, generation throughput "
            f"{iv.generation_tokens / elapsed:.1f} tokens/s, running {st.num_running}, waiting "
            f"{st.num_waiting}, KV blocks used {st.kv_blocks_total - st.kv_blocks_free}/{st.kv_blocks_total}"
        )
        if iv.spec.num_verifies:
            rates = " ".join(f"{r:.2f}" for r in iv.spec.acceptance_rate_per_position)
            line += (
                f", spec: {iv.spec.num_verifies} verifies, tau {iv.spec.acceptance_length:.2f}, "
                f"acceptance per position {rates}"
            )
        logger.info(line)
        self._interval = _Interval(now)


@dataclass
class _Interval:
    """What happened since the last periodic log line."""

    start: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec: SpecMetrics = field(default_factory=SpecMetrics)

    @property
    def idle(self) -> bool:
        return not (self.prompt_tokens or self.generation_tokens or self.spec.num_verifies)
