"""``max_queued_requests`` bounds the requests that wait for a place in the running batch (429 beyond, naming the
limit); a request the batch has a free place for does not wait, even where it came in a burst before the engine's
next step, and a request that ends while waiting (aborted, its client gone) frees its place; one refused as invalid
never takes one. The engine's steps are held at a gate so that what counts as waiting is known exactly."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

for _dependency in ("fastapi", "uvicorn"):
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")

from helpers.server_helpers import in_thread  # noqa: E402
from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402

TINYPY = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")
SHORT = {"prompt": "def f():", "max_tokens": 4, "ignore_eos": True, "temperature": 0}
LONG = {**SHORT, "max_tokens": 200, "stream": True}
INVALID = {**SHORT, "max_tokens": 10**6}  # (400: beyond the server's max_tokens limit)


class StepGate:
    """The engine's steps, each held at the gate until let through (``allow``); ``open`` lets every later step
    through."""

    def __init__(self, engine) -> None:
        self.permits, self.opened, self.step = threading.Semaphore(0), False, engine.step
        self.arrived = self.allowed = 0  # steps that came to the gate, and that were let through
        engine.step = self

    def __call__(self):
        if not self.opened:
            self.arrived += 1
            self.permits.acquire(timeout=60)
        return self.step()

    async def allow(self) -> None:
        """Let one step through, and wait until it is done (the next one is at the gate)."""
        self.allowed += 1
        self.permits.release()
        await until(lambda: self.arrived > self.allowed)

    def open(self) -> None:
        self.opened = True
        self.permits.release(1000)

    def close(self) -> None:
        """Hold the steps again (while the engine is idle: no step is at the gate)."""
        self.permits, self.opened = threading.Semaphore(0), False


def served(max_num_seqs: int, max_queued_requests: int):
    config = EngineConfig(
        TINYPY, device="cpu", dtype="float32", num_kv_blocks=128, max_num_seqs=max_num_seqs
    )
    app = build_app(config, log_interval=60, max_queued_requests=max_queued_requests)
    return app, app.state.engine, StepGate(app.state.engine.engine)


async def until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def assert_queue_full(r: httpx.Response, limit: int) -> None:
    assert r.status_code == 429, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == "queue_full", error
    assert f"max_queued_requests={limit} " in error["message"], error


def test_a_burst_fills_the_free_seats_before_it_waits():
    """4 places in the running batch and 2 to wait: of a burst of 7 that comes before the first step, 4 take the
    batch's places, 2 wait and the 7th is refused (the 2 invalid ones take no place); the same again once all
    have finished (nothing stays counted)."""
    app, engine, gate = served(max_num_seqs=4, max_queued_requests=2)
    with in_thread(app) as url:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                bodies = [SHORT] * 7 + [INVALID] * 2
                tasks = [
                    asyncio.create_task(client.post("/v1/completions", json=b)) for b in bodies
                ]
                # (the first step waits at the gate: nothing is scheduled, nothing finishes)
                await until(lambda: engine.num_unfinished + sum(t.done() for t in tasks) == 9)
                gate.open()
                return await asyncio.gather(*tasks)

        for _ in range(2):
            gate.close()
            responses = asyncio.run(burst())
            codes = sorted(r.status_code for r in responses)
            assert codes == [200] * 6 + [400] * 2 + [429], [r.text for r in responses]
            assert_queue_full(next(r for r in responses if r.status_code == 429), 2)
            asyncio.run(until(lambda: engine.num_unfinished == 0))


def test_requests_beyond_a_full_batch_wait_until_theirs_end():
    """2 places in the running batch and 1 to wait: with A and B running, C waits and D is refused, before and after
    a step has held C back; C's client leaving frees its place, and D is then taken."""
    app, engine, gate = served(max_num_seqs=2, max_queued_requests=1)
    with in_thread(app) as url:

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                streams = {}

                async def start(name: str) -> httpx.Response:
                    request = client.build_request("POST", "/v1/completions", json=LONG)
                    streams[name] = await client.send(request, stream=True)
                    return streams[name]

                started = await asyncio.gather(start("A"), start("B"))  # (a burst for 2 places)
                assert [r.status_code for r in started] == [200, 200]
                await until(lambda: gate.arrived == 1)
                while engine.stats.num_running < 2:  # (a step at a time until both run)
                    await gate.allow()
                assert (await start("C")).status_code == 200
                assert_queue_full(await client.post("/v1/completions", json=SHORT), 1)
                await gate.allow()  # a step that holds C back: every place is taken
                assert engine.stats.num_waiting == 1
                assert_queue_full(await client.post("/v1/completions", json=SHORT), 1)
                # C's client leaves: its abort is taken between steps
                await streams.pop("C").aclose()
                while engine.num_unfinished > 2:
                    await gate.allow()
                d = asyncio.create_task(client.post("/v1/completions", json=SHORT))
                await until(lambda: engine.num_unfinished == 3 or d.done())
                for s in streams.values():
                    await s.aclose()
                gate.open()
                assert (await d).status_code == 200, (await d).text

        asyncio.run(scenario())
        asyncio.run(until(lambda: engine.num_unfinished == 0))
