"""The data-parallel replica protocol (server/replicas.py) with the replica's loop on a thread over a fake
engine: the replica steps on its own while it has work and waits for a command when idle (and after a failed
step); submits and aborts only send, an aborted request's last output comes from a later ``step``, a failed
step's error reaches the server after the outputs before it, and a duplicate id is refused on the server's side.
The real engines behind real processes are tests/test_data_parallel.py's."""

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from outpace.server.replicas import RemoteEngine, run_replica


@dataclass
class FakeRequest:
    request_id: str
    tokens: list = field(default_factory=list)
    status: str = "running"
    num_computed_tokens: int = 0


@dataclass
class FakeOutput:
    request_id: str
    token_ids: list
    finished: bool


class FakeEngine:
    """One token per request per step (the step number); a request finishes after ``length`` tokens; the steps
    numbered in ``fail_steps`` raise."""

    max_model_len = 64

    def __init__(self, length: int, fail_steps=()) -> None:
        self.length, self.fail_steps, self.steps = length, set(fail_steps), 0
        self.model_config = SimpleNamespace(vocab_size=10)
        self.pool = SimpleNamespace(num_blocks=8, num_free=8)
        self.scheduler = SimpleNamespace(running=[], waiting=[])
        self.prefix_cache_stats = None
        self.closed = False

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.running)

    def submit(self, req: FakeRequest) -> str:
        self.scheduler.running.append(req)
        return req.request_id

    def abort_request(self, request_id: str):
        for req in self.scheduler.running:
            if req.request_id == request_id:
                self.scheduler.running.remove(req)
                return FakeOutput(request_id, list(req.tokens), True)
        return None

    def step(self) -> list:
        self.steps += 1
        if self.steps in self.fail_steps:
            raise RuntimeError(f"step {self.steps} failed")
        outs = []
        for req in list(self.scheduler.running):
            req.tokens.append(self.steps)
            req.num_computed_tokens += 1
            done = len(req.tokens) >= self.length
            if done:
                self.scheduler.running.remove(req)
            outs.append(FakeOutput(req.request_id, list(req.tokens), done))
        return outs

    def close(self) -> None:
        self.closed = True


class ThreadProcess:
    """The part of ``multiprocessing.Process`` that RemoteEngine uses, for a replica run on a thread."""

    pid = 0

    def __init__(self, target, args) -> None:
        self.thread = threading.Thread(target=target, args=args, daemon=True)
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout=None) -> None:
        self.thread.join(timeout)

    @property
    def exitcode(self):
        return None if self.thread.is_alive() else 0

    def terminate(self) -> None:
        pass


@pytest.fixture
def replica(request):
    engine = FakeEngine(**request.param)
    calls, their_calls = mp.Pipe()
    checks, their_checks = mp.Pipe()
    remote = RemoteEngine(
        0, calls, checks, ThreadProcess(run_replica, (engine, their_calls, their_checks))
    )
    remote.wait_ready(5)
    yield remote, engine
    remote.close(timeout_s=5)
    assert not remote.alive and engine.closed


def _until_done(remote: RemoteEngine) -> list:
    outs = []
    while remote.has_unfinished_requests:
        outs += remote.step()
    return outs


def _steps_after_a_pause(engine: FakeEngine) -> tuple[int, int]:
    before = engine.steps
    time.sleep(0.3)
    return before, engine.steps


@pytest.mark.parametrize("replica", [dict(length=3)], indirect=True)
def test_requests_run_to_the_end_and_the_replica_then_waits(replica):
    remote, engine = replica
    for rid in ("a", "b"):
        remote.submit(FakeRequest(rid))
    assert remote.has_unfinished_requests  # sent, not yet taken: still unfinished here
    outs = _until_done(remote)
    last = {o.request_id: o for o in outs}
    assert set(last) == {"a", "b"} and all(
        o.finished and len(o.token_ids) == 3 for o in last.values()
    )
    for rid in ("a", "b"):  # one output per step the request ran, tokens growing
        mine = [o.token_ids for o in outs if o.request_id == rid]
        assert [len(t) for t in mine] == [1, 2, 3] and mine[-1] == sorted(set(mine[-1]))
    before, after = _steps_after_a_pause(engine)
    assert before == after  # idle: no step without work
    remote.submit(FakeRequest("a"))  # a finished request's id may come again
    assert _until_done(remote)[-1].finished


@pytest.mark.parametrize("replica", [dict(length=10_000)], indirect=True)
def test_an_abort_ends_the_request_through_a_later_step(replica):
    remote, engine = replica
    remote.submit(FakeRequest("a"))
    with pytest.raises(ValueError, match="request id 'a' is already in use"):
        remote.submit(FakeRequest("a"))
    first = remote.step()
    assert first and not first[-1].finished
    assert remote.abort_request("a") is None  # only sent
    outs = _until_done(remote)
    assert outs[-1].request_id == "a" and outs[-1].finished
    assert (
        remote.abort_request("a") is None and not remote.has_unfinished_requests
    )  # gone: nothing sent
    before, after = _steps_after_a_pause(engine)
    assert before == after


@pytest.mark.parametrize("replica", [dict(length=5, fail_steps=(2,))], indirect=True)
def test_a_failed_step_reaches_the_server_and_the_replica_waits_for_its_aborts(replica):
    remote, engine = replica
    remote.submit(FakeRequest("a"))
    outs = remote.step()
    while not outs:
        outs = remote.step()
    assert outs[-1].token_ids == [1]
    with pytest.raises(RuntimeError, match="step 2 failed"):
        while True:
            remote.step()
    before, after = _steps_after_a_pause(engine)
    assert (
        before == after == 2
    )  # "a" is still in the engine, but the replica waits for the server's word
    remote.abort_request("a")  # what AsyncEngine does with a failed step's requests
    outs = _until_done(remote)
    assert outs[-1].request_id == "a" and outs[-1].finished and outs[-1].token_ids == [1]
