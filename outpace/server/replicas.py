"""Data parallelism for serving: ``--data-parallel-size M`` runs M engine replicas behind one server.

Each replica is an engine in a process of its own (spawned; a tensor-parallel replica starts its own
ranks from there), as vLLM runs one engine-core process per data-parallel rank and SGLang's
DataParallelController one scheduler process per rank: a replica that dies takes only its own requests
with it. The server process keeps, per replica, the ``AsyncEngine`` of the single-engine server (its
thread, streams, aborts and metrics, unchanged) driving a ``RemoteEngine``.

The replica runs its engine on its own, as vLLM's engine-core busy loop does: while it has unfinished
requests it steps without waiting for the server, taking the commands that arrived (submit, abort) between
steps and sending each step's outputs with its scheduler state; idle, it waits for a command. On the server's
side ``RemoteEngine.submit`` and ``abort_request`` only send (a duplicate id is refused there, from the ids it
has sent), and ``step`` returns the outputs that arrived (an aborted request's last output among them). So
the GPU never waits for the server's thread to take a step's outputs and ask for the next. Each reply says how
many commands the replica has taken, so the server counts a request it has sent but the replica has not yet
seen as unfinished. Request validation (``new_request``, which reads only fixed engine fields, as the single
server calls it from the event loop) is answered by a second thread of the replica over a second pipe.

``DataParallelEngine`` is what the HTTP layer talks to (the ``AsyncEngine`` surface app.py uses): a group
of requests goes to the live replica with the fewest unfinished requests (its queue length); every
replica records into the server's one ``ServerMetrics``, whose gauges become sums over the replicas, so
/metrics aggregates them (plus ``outpace:data_parallel_replicas_alive``). A replica that dies fails its
own requests with an error naming it (the thread's ``EngineError``), is reported by /health and the
gauge, and takes no new requests; the others go on.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from outpace.cache.prefix_cache import PrefixCacheStats
from outpace.config import EngineConfig
from outpace.distributed.launch import exit_reason
from outpace.request import Request, RequestOutput
from outpace.sampling_params import SamplingParams
from outpace.server.async_engine import AsyncEngine, EngineError, EngineStats, GenerationStream
from outpace.server.metrics import ServerMetrics

logger = logging.getLogger("outpace.server")

START_TIMEOUT_S = 600.0  # a replica loads its model within this


class ReplicaDied(RuntimeError):
    """A data-parallel replica's process exited (or its pipe broke)."""


@dataclass(frozen=True)
class _State:
    """The replica engine's state after a round of its loop (``_serve``)."""

    commands_taken: int  # of those the server sent
    has_unfinished: bool
    num_running: int
    num_waiting: int
    num_free_blocks: int
    progress: dict  # request id -> (status, num_computed_tokens) of the requests it holds
    prefix_cache_stats: PrefixCacheStats | None  # None: prefix caching is off


# ---- the replica's process ---------------------------------------------------------------------
def _replica_main(config: EngineConfig, index: int, calls, checks) -> None:
    """The replica process: build the engine, then ``run_replica`` it."""
    from outpace.engine.engine import LLMEngine

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the server's to handle
    try:
        engine = LLMEngine(config, progress=False)
    except BaseException as e:  # noqa: BLE001 - reported to the server, which fails to start
        calls.send(("error", _portable(e)))
        return
    run_replica(engine, calls, checks)


def run_replica(engine, calls, checks) -> None:
    """Say ready, then run ``engine`` (``_serve``) on this thread and answer ``checks`` (new_request) on another,
    until the server closes the pipe or says close; the engine is closed at the end."""
    engine.stream_outputs = True
    calls.send(
        (
            "ready",
            dict(
                max_model_len=engine.max_model_len,
                vocab_size=engine.model_config.vocab_size,
                num_blocks=engine.pool.num_blocks,
                state=_state_of(engine, 0),
            ),
        )
    )
    threading.Thread(target=_answer_checks, args=(engine, checks), daemon=True).start()
    try:
        _serve(engine, calls)
    finally:
        engine.close()


def _serve(engine, calls) -> None:
    """Step the engine while it has work, taking the server's commands between steps; after each round send
    ("outputs", (outputs, state)), or ("error", (e, outputs, state)) when the step failed (the server then aborts
    the step's requests, as the single server does). The state counts the commands taken so far. Idle, block
    until a command comes."""
    taken, failed = 0, False
    while True:
        outputs: list[RequestOutput] = []
        try:
            if (
                failed or not engine.has_unfinished_requests
            ):  # (after a failed step: wait for the aborts)
                calls.poll(None)
            while calls.poll(0):
                kind, arg = calls.recv()
                taken += 1
                if kind == "close":
                    return
                if kind == "submit":
                    engine.submit(arg)
                else:  # abort
                    out = engine.abort_request(arg)
                    if out is not None:
                        outputs.append(out)
        except (EOFError, OSError):  # the server is gone
            return
        failed = False
        try:
            if engine.has_unfinished_requests:
                outputs += engine.step()
        except Exception as e:  # noqa: BLE001 - the step's error, raised again in the server
            failed = True
            calls.send(("error", (_portable(e), outputs, _state_of(engine, taken))))
            continue
        calls.send(("outputs", (outputs, _state_of(engine, taken))))


def _answer_checks(engine, checks) -> None:
    while True:
        try:
            prompt, params, request_id = checks.recv()
        except (EOFError, OSError):
            return
        try:
            checks.send(("ok", engine.new_request(prompt, params, request_id)))
        except Exception as e:  # noqa: BLE001 - a ValueError naming the problem, answered 400
            checks.send(("error", _portable(e)))


def _state_of(engine, taken: int) -> _State:
    s = engine.scheduler
    return _State(
        taken,
        engine.has_unfinished_requests,
        len(s.running),
        len(s.waiting),
        engine.pool.num_free,
        {r.request_id: (r.status, r.num_computed_tokens) for r in (*s.running, *s.waiting)},
        engine.prefix_cache_stats,
    )


def _portable(e: BaseException) -> BaseException:
    """``e`` if it pickles, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")


# ---- the server's side -------------------------------------------------------------------------
class _Counts:
    """What ``AsyncEngine._publish`` reads of ``engine.scheduler``: the lengths of running and waiting."""

    def __init__(self) -> None:
        self.running: Sequence = ()
        self.waiting: Sequence = ()


@dataclass
class _Pool:
    num_free: int
    num_blocks: int


@dataclass(frozen=True)
class _ModelConfig:
    vocab_size: int


class RemoteEngine:
    """The ``LLMEngine`` calls ``AsyncEngine`` makes, answered by replica ``index``'s process."""

    def __init__(self, index: int, calls, checks, process) -> None:
        """``calls`` and ``checks``: this side's ends of the replica's two pipes; ``process``: what runs it (a
        ``multiprocessing.Process``, from ``spawn``)."""
        self.index, self._calls, self._checks, self.process = index, calls, checks, process
        self._check_lock = threading.Lock()
        self.stream_outputs = True
        self.scheduler, self.pool = _Counts(), _Pool(0, 0)
        self._requests: dict[
            str, Request
        ] = {}  # submitted here, not yet finished: their progress is mirrored
        self._replica_unfinished = False
        self._sent = self._taken = (
            0  # commands sent, and taken by the replica as its latest state says
        )
        self._step_error: BaseException | None = (
            None  # a failed step's, raised by the next ``step``
        )
        self.prefix_cache_stats: PrefixCacheStats | None = None

    @classmethod
    def spawn(cls, config: EngineConfig, index: int, own_gpus: bool = True) -> RemoteEngine:
        """Replica ``index`` of ``config`` started in a process of its own, on its GPUs (``_visible_devices``;
        without ``own_gpus``, on those this process sees, where ``config.device`` picks one, as in-process)."""
        context = mp.get_context("spawn")
        calls, their_calls = context.Pipe()
        checks, their_checks = context.Pipe()
        # NOTE: not a daemon: a tensor-parallel replica starts its ranks as its own children
        process = context.Process(
            target=_replica_main,
            args=(config, index, their_calls, their_checks),
            name=f"outpace-replica-{index}",
        )
        with _visible_devices(config, index) if own_gpus else contextlib.nullcontext():
            process.start()
        their_calls.close()
        their_checks.close()
        return cls(index, calls, checks, process)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if not self._calls.poll(timeout_s):
            raise ReplicaDied(
                f"data-parallel replica {self.index} did not start within {timeout_s:.0f} s"
            )
        kind, info = self._receive(self._calls)
        if kind == "error":
            raise RuntimeError(
                f"data-parallel replica {self.index} failed to start: {info}"
            ) from info
        self.max_model_len, self.model_config = (
            info["max_model_len"],
            _ModelConfig(info["vocab_size"]),
        )
        self.pool = _Pool(0, info["num_blocks"])
        self._apply(info["state"])

    # ---- what AsyncEngine calls ------------------------------------------------------------------
    def new_request(self, prompt, params: SamplingParams, request_id: str) -> Request:
        with self._check_lock:
            self._send(self._checks, (prompt, params, request_id))
            return self._result(self._checks)

    def submit(self, req: Request) -> str:
        """Sent to the replica, which queues it at its next round (an id in use is refused here, as
        ``LLMEngine.submit`` refuses it)."""
        if req.request_id in self._requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self._command("submit", req)
        self._requests[req.request_id] = req
        return req.request_id

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Sent to the replica; the request's last output (finish reason "abort") comes from a later ``step``."""
        if request_id in self._requests:
            self._command("abort", request_id)
        return None

    def step(self) -> list[RequestOutput]:
        """The outputs the replica has sent since the last call, waiting for its next round if none have come.
        A failed step's error is raised by the call after the one that returns the outputs before it."""
        if self._step_error is not None:
            error, self._step_error = self._step_error, None
            raise error
        outputs: list[RequestOutput] = []
        while True:
            kind, value = self._receive(self._calls)
            if kind == "error":
                self._step_error, value = value[0], value[1:]
            outs, state = value
            outputs += outs
            self._apply(state)
            if self._step_error is not None or not self._poll():
                break
        for out in outputs:
            if out.finished:
                self._requests.pop(out.request_id, None)
        if self._step_error is not None and not outputs:
            error, self._step_error = self._step_error, None
            raise error
        return outputs

    @property
    def has_unfinished_requests(self) -> bool:
        """The replica's latest state says so, or it has not yet taken every command sent."""
        return self._replica_unfinished or self._sent > self._taken

    def close(self, timeout_s: float = 30.0) -> None:
        try:
            self._calls.send(("close", None))
        except OSError:
            pass
        self.process.join(timeout_s)
        if self.process.exitcode is None:
            self.process.terminate()
            self.process.join(5.0)

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    # ---- the pipe ----------------------------------------------------------------------------------
    def _command(self, kind: str, arg) -> None:
        self._send(self._calls, (kind, arg))
        self._sent += 1

    def _poll(self) -> bool:
        """Whether another round's message is waiting."""
        try:
            return self._calls.poll(0)
        except (EOFError, OSError) as e:
            raise self._died(e) from None

    def _send(self, conn, message) -> None:
        try:
            conn.send(message)
        except OSError as e:
            raise self._died(e) from None

    def _result(self, conn):
        kind, value = self._receive(conn)
        if kind == "error":
            raise value
        return value

    def _receive(self, conn):
        try:
            return conn.recv()
        except (EOFError, OSError) as e:
            raise self._died(e) from None

    def _died(self, e: BaseException) -> ReplicaDied:
        self.process.join(2.0)
        code = self.process.exitcode
        how = "is not answering" if code is None else f"exited with {exit_reason(code)}"
        return ReplicaDied(
            f"data-parallel replica {self.index} (pid {self.process.pid}) {how}: "
            f"{type(e).__name__}: {e}".rstrip(": ")
        )

    def _apply(self, state: _State) -> None:
        self._taken, self._replica_unfinished = state.commands_taken, state.has_unfinished
        self.scheduler.running = range(state.num_running)
        self.scheduler.waiting = range(state.num_waiting)
        self.pool.num_free = state.num_free_blocks
        self.prefix_cache_stats = state.prefix_cache_stats
        for request_id, (status, computed) in state.progress.items():
            req = self._requests.get(request_id)
            if req is not None:  # (AsyncEngine reads them to time the queue)
                req.status, req.num_computed_tokens = status, computed


class _visible_devices:
    """Replica ``index`` of a GPU engine sees its own world_size GPUs (of those visible here) while
    its process starts."""

    def __init__(self, config: EngineConfig, index: int) -> None:
        self.config, self.index = config, index
        self.saved: tuple[str | None] | None = None

    def __enter__(self) -> None:
        if not self.config.device.startswith("cuda"):
            return
        import torch

        tp = self.config.world_size  # (each of its ranks' GPU: tensor- or expert-parallel)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = (
            visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        )
        mine = devices[self.index * tp : (self.index + 1) * tp]
        if len(mine) < tp:
            raise ValueError(
                f"data-parallel replica {self.index} needs GPUs {self.index * tp} .. "
                f"{(self.index + 1) * tp - 1}, but {len(devices)} are visible"
            )
        self.saved = (visible,)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)

    def __exit__(self, *exc) -> None:
        if self.saved is None:
            return
        if self.saved[0] is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = self.saved[0]


class DataParallelEngine:
    """M replicas behind one server, with the ``AsyncEngine`` surface app.py uses (module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        size: int,
        metrics: ServerMetrics | None = None,
        log_interval: float = 10.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"data_parallel_size={size} is invalid: must be >= 1")
        self.config, self.metrics = config, metrics
        remotes = [RemoteEngine.spawn(config, i, own_gpus=size > 1) for i in range(size)]
        try:
            for remote in remotes:
                remote.wait_ready()
        except BaseException:
            for remote in remotes:
                remote.close(timeout_s=5.0)
            raise
        self.replicas = [
            AsyncEngine(config, metrics, log_interval=log_interval, engine=r) for r in remotes
        ]
        first = self.replicas[0]
        self.tokenizer, self.max_model_len, self.vocab_size = (
            first.tokenizer,
            first.max_model_len,
            first.vocab_size,
        )
        self.max_num_seqs = config.max_num_seqs * size
        if (
            metrics is not None
        ):  # the gauges each replica bound to its own stats: their sums instead
            for name in ("num_running", "num_waiting", "kv_blocks_free", "kv_blocks_total"):
                gauge = (
                    "outpace:num_requests_" + name.removeprefix("num_")
                    if name.startswith("num_")
                    else f"outpace:{name}"
                )
                metrics.bind_gauge(gauge, lambda a=name: getattr(self.stats, a))
            from prometheus_client import Gauge

            Gauge(
                "outpace:data_parallel_replicas_alive",
                "Data-parallel replicas serving requests.",
                registry=metrics.registry,
            ).set_function(lambda: sum(self._alive(r) for r in self.replicas))
        self._round = 0
        self.routed = [0] * size  # requests sent to each replica

    # ---- the AsyncEngine surface -------------------------------------------------------------------
    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    @property
    def alive(self) -> bool:
        """Some replica serves."""
        return any(self._alive(r) for r in self.replicas)

    @property
    def error(self) -> BaseException | None:
        return next((r.error for r in self.replicas if r.error is not None), None)

    @property
    def num_unfinished(self) -> int:
        return sum(r.num_unfinished for r in self.replicas)

    @property
    def stats(self) -> EngineStats:
        live = [r.stats for r in self.replicas if self._alive(r)]
        return EngineStats(
            sum(s.num_running for s in live),
            sum(s.num_waiting for s in live),
            sum(s.kv_blocks_free for s in live),
            sum(s.kv_blocks_total for s in live),
        )

    def new_request(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> Request:
        """Validated by a live replica (any: they are built alike), taken in turn."""
        live = self._live()
        self._round += 1
        return live[self._round % len(live)].new_request(prompt_token_ids, params, request_id)

    def open_stream(
        self, requests: Sequence[Request], max_queued: int | None = None
    ) -> GenerationStream:
        """The group goes to the live replica with the fewest unfinished requests (``max_queued``: per replica)."""
        replica = min(self._live(), key=lambda r: r.num_unfinished)
        stream = replica.open_stream(requests, max_queued)
        self.routed[self.replicas.index(replica)] += len(requests)
        return stream

    def stop(self, timeout: float | None = None) -> None:
        threads = [threading.Thread(target=r.stop, args=(timeout,)) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in self.replicas:
            r.engine.close()

    def health(self) -> dict:
        """Each replica's state, for /health."""
        return {
            "data_parallel_replicas": [
                {
                    "replica": i,
                    "status": "ok" if self._alive(r) else "error",
                    "pid": r.engine.process.pid,
                    "num_requests_unfinished": r.num_unfinished,
                    "num_requests_routed": self.routed[i],
                    **(
                        {
                            "error": str(
                                r.error
                                or f"process exited with {exit_reason(r.engine.process.exitcode)}"
                            )
                        }
                        if not self._alive(r)
                        else {}
                    ),
                }
                for i, r in enumerate(self.replicas)
            ]
        }

    # ---- helpers ---------------------------------------------------------------------------------------
    @staticmethod
    def _alive(replica: AsyncEngine) -> bool:
        return replica.alive and replica.engine.alive

    def _live(self) -> list[AsyncEngine]:
        live = [r for r in self.replicas if self._alive(r)]
        if not live:
            raise EngineError(
                "every data-parallel replica has stopped: "
                + "; ".join(str(r.error) for r in self.replicas if r.error is not None)
            )
        return live


def serving_engine(
    config: EngineConfig,
    metrics: ServerMetrics | None,
    log_interval: float,
    data_parallel_size: int = 1,
    engine_process: bool = False,
):
    """The engine behind the HTTP layer: one ``AsyncEngine`` in the server's process, or a
    ``DataParallelEngine`` of ``data_parallel_size`` replicas, each in a process of its own (also for one
    replica with ``engine_process``: the HTTP event loop and the engine's host work then no longer share one
    interpreter, as vLLM's API server and engine-core process do not)."""
    if data_parallel_size == 1 and not engine_process:
        return AsyncEngine(config, metrics, log_interval=log_interval)
    return DataParallelEngine(config, data_parallel_size, metrics, log_interval)
