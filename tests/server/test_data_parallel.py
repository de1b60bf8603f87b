"""Data parallelism for serving (server/replicas.py): ``outpace serve --data-parallel-size 2`` as a real
process with the zoo target and its EAGLE3 draft (the default), two engine replicas in processes of their
own: 200 concurrent streams give the greedy texts of one engine (the offline ``LLM`` of the same config),
spread over both replicas by queue length; /metrics adds the replicas up; a client that leaves mid-stream has
its request aborted in its replica (which runs on its own and takes the abort between steps); killing one replica's process
fails only its requests, with an error naming it, while the other's finish unchanged and new requests
keep being served."""

import asyncio
import json
import os
import signal
import time

import pytest

for _dependency in ("fastapi", "uvicorn", "prometheus_client"):  # the server extra
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")

from helpers.server_helpers import (  # noqa: E402
    PROMPTS,
    leave_after,
    metrics,
    offline_llm,
    serving,
    sse_events,
    stream_text,
    wait_idle,
)
from outpace import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def server():
    yield from serving("--data-parallel-size", "2", "--log-interval", "2")


@pytest.fixture(scope="module")
def llm():
    return offline_llm()


def _prompt(i: int) -> str:
    return PROMPTS[i % len(PROMPTS)][: 24 + (i * 13) % 70]


def offline(llm, prompts, max_tokens: int) -> list[str]:
    outs = llm.generate(list(prompts), SamplingParams(temperature=0, max_tokens=max_tokens))
    return [o.text for o in outs]


async def _stream(client, body: dict) -> tuple[str, str | None]:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, await resp.aread()
        return stream_text(sse_events([line async for line in resp.aiter_lines()]))


def _client(url: str):
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
    return httpx.AsyncClient(base_url=url, limits=limits, timeout=300)


def test_200_concurrent_streams_equal_one_replica(server, llm):
    unique = [_prompt(i) for i in range(50)]
    expected = dict(zip(unique, offline(llm, unique, max_tokens=8)))
    prompts = [unique[i % len(unique)] for i in range(200)]
    before = httpx.get(server.url + "/health").json()

    async def run():
        async with _client(server.url) as c:
            return await asyncio.gather(
                *(_stream(c, {"prompt": p, "temperature": 0, "max_tokens": 8}) for p in prompts)
            )

    results = asyncio.run(run())
    mismatches = [
        (p, text, expected[p]) for p, (text, _) in zip(prompts, results) if text != expected[p]
    ]
    assert not mismatches, mismatches[:3]
    after = wait_idle(server.url, timeout=30)
    assert after["kv_blocks_free"] == before["kv_blocks_free"] == before["kv_blocks_total"]
    routed = [
        r["num_requests_routed"] - b["num_requests_routed"]
        for r, b in zip(after["data_parallel_replicas"], before["data_parallel_replicas"])
    ]
    assert sum(routed) == 200 and min(routed) >= 50, routed  # both replicas served


def test_metrics_add_the_replicas_up(server, llm):
    one = llm.engine.pool.num_blocks
    before = metrics(server.url)
    prompts = [_prompt(i) for i in range(60, 72)]

    async def run():
        async with _client(server.url) as c:
            return await asyncio.gather(
                *(_stream(c, {"prompt": p, "temperature": 0, "max_tokens": 6}) for p in prompts)
            )

    asyncio.run(run())
    wait_idle(server.url, timeout=30)
    after = metrics(server.url)

    def grew(name, labels=()):
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert grew("outpace:request_success_total", (("finished_reason", "length"),)) == len(prompts)
    assert grew("outpace:generation_tokens_total") == 6 * len(prompts)
    assert (
        after[("outpace:kv_blocks_total", ())] == after[("outpace:kv_blocks_free", ())] == 2 * one
    )
    assert after[("outpace:data_parallel_replicas_alive", ())] == 2
    assert grew("outpace:time_to_first_token_seconds_count") == len(prompts)


def test_streams_left_midway_are_aborted_in_their_replicas(server, llm):
    """Eight clients leave after 3 events of 1000-token streams while four others run: each leaver's replica
    aborts it (its blocks come back, finish reason "abort"), the others' texts are unchanged."""
    keep = [_prompt(i) for i in range(80, 84)]
    expected = offline(llm, keep, max_tokens=12)
    m0 = metrics(server.url)

    async def run():
        async with _client(server.url) as c:
            return await asyncio.gather(
                *(leave_after(c, _prompt(i)) for i in range(84, 92)),
                *(_stream(c, {"prompt": p, "temperature": 0, "max_tokens": 12}) for p in keep),
            )

    results = asyncio.run(run())
    assert results[:8] == [3] * 8
    assert [text for text, _ in results[8:]] == expected
    health = wait_idle(server.url, timeout=30)  # every block of both replicas back
    assert all(r["num_requests_unfinished"] == 0 for r in health["data_parallel_replicas"])
    m1 = metrics(server.url)
    aborts = (("finished_reason", "abort"),)
    assert (
        m1[("outpace:request_success_total", aborts)]
        - m0.get(("outpace:request_success_total", aborts), 0)
        == 8
    )
    generated = (
        m1[("outpace:generation_tokens_total", ())] - m0[("outpace:generation_tokens_total", ())]
    )
    assert generated < 8 * 1000 / 2  # aborted long before their 1000 tokens


async def _stream_until_error(client, body: dict, started: asyncio.Event | None = None) -> dict:
    """-> {"text", "finish", "error"} of one stream (``error``: an error event's message)."""
    text, finish, error = "", None, None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]["message"]
            for c in event.get("choices", []):
                text += c["text"]
                finish = c.get("finish_reason") or finish
            if started is not None and text:
                started.set()
    return {"text": text, "finish": finish, "error": error}


def test_a_replica_that_dies_fails_only_its_requests(server, llm):
    """Runs last: replica 1's process is killed while both replicas run long streams."""
    prompts = [_prompt(i) for i in range(100, 116)]
    body = dict(temperature=0, max_tokens=160, ignore_eos=True)
    expected = [o.text for o in llm.generate(prompts, SamplingParams(**body))]
    victim = httpx.get(server.url + "/health").json()["data_parallel_replicas"][1]["pid"]

    async def run():
        started = [asyncio.Event() for _ in prompts]
        async with _client(server.url) as c:
            tasks = [
                asyncio.ensure_future(_stream_until_error(c, {"prompt": p, **body}, s))
                for p, s in zip(prompts, started)
            ]
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), timeout=240)
            os.kill(victim, signal.SIGKILL)
            return await asyncio.gather(*tasks)

    start = time.monotonic()
    results = asyncio.run(run())
    assert time.monotonic() - start < 300
    failed = [r for r in results if r["error"] is not None]
    finished = [(r, e) for r, e in zip(results, expected) if r["error"] is None]
    assert failed and finished, results
    for r in failed:
        assert "data-parallel replica 1" in r["error"] and "SIGKILL" in r["error"], r["error"]
    for r, e in finished:
        assert r["text"] == e and r["finish"] == "length"
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok"
    assert [r["status"] for r in health["data_parallel_replicas"]] == ["ok", "error"]
    assert "replica 1" in health["data_parallel_replicas"][1]["error"]
    assert metrics(server.url)[("outpace:data_parallel_replicas_alive", ())] == 1

    async def again():  # the survivor takes every new request
        async with _client(server.url) as c:
            return await asyncio.gather(
                *(_stream(c, {"prompt": p, "temperature": 0, "max_tokens": 8}) for p in prompts[:4])
            )

    assert [t for t, _ in asyncio.run(again())] == offline(llm, prompts[:4], max_tokens=8)
