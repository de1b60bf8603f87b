"""``outpace serve --engine-process``: the one engine runs in a process of its own (server/replicas.py
``serving_engine``), as a data-parallel replica does, with the single server's behaviour: concurrent greedy
streams give the offline ``LLM``'s texts, /health names the engine's process (not the server's), and every KV
block is free again afterwards."""

import asyncio

import pytest

for _dependency in ("fastapi", "uvicorn", "prometheus_client"):  # the server extra
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")

from helpers.server_helpers import PROMPTS, offline_llm, serving, sse_events, stream_text, wait_idle  # noqa: E402
from outpace import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def server():
    yield from serving("--engine-process")


def test_streams_equal_the_offline_engine_and_free_their_blocks(server):
    prompts = [PROMPTS[i % len(PROMPTS)][: 20 + 7 * i] for i in range(12)]
    expected = [
        o.text for o in offline_llm().generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    ]

    async def stream(client, prompt: str) -> str:
        body = {"prompt": prompt, "temperature": 0, "max_tokens": 8, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            return stream_text(sse_events([line async for line in resp.aiter_lines()]))[0]

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(stream(client, p) for p in prompts))

    assert asyncio.run(run()) == expected
    health = wait_idle(server.url, timeout=30)
    (replica,) = health["data_parallel_replicas"]
    assert replica["status"] == "ok" and replica["pid"] != server.proc.pid
    assert replica["num_requests_routed"] == len(prompts)
    assert health["kv_blocks_free"] == health["kv_blocks_total"]
