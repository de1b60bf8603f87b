"""A request's life through the server, found by fuzzing it: a stream's log-probabilities carry the same
``text_offset`` as the whole answer where a stop string's prefix is held back; a ``logit_bias`` key that
``str.isdigit`` takes but ``int`` refuses is a 400 naming the field; a failure while a stream is under way
ends it with an error event and ``[DONE]`` (as vLLM's), the engine freeing its blocks and serving on;
clients leaving streams of every shape (n > 1, echo with prompt log-probabilities over a chunked prefill,
log-probabilities in a chat, a constraint, a seed) leave no request or KV block behind, and the requests
beside them give the tokens they give alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

for _dependency in ("fastapi", "uvicorn"):
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from helpers.server_helpers import PROMPTS, in_thread, sse_events  # noqa: E402
from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402
from outpace.server.responses import Job  # noqa: E402

TINYPY = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")
PROMPT = "def fibonacci(n):"


def config(**kwargs) -> EngineConfig:
    return EngineConfig(TINYPY, device="cpu", dtype="float32", max_num_seqs=4, **kwargs)


@pytest.fixture(scope="module")
def http():
    with TestClient(build_app(config(), log_interval=1e9)) as client:
        yield client


def streamed(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.iter_lines())


def joined_logprobs(events: list[dict]) -> dict[str, list]:
    parts = [c["logprobs"] for e in events for c in e["choices"] if c["logprobs"]]
    return {k: [x for p in parts for x in p[k]] for k in ("tokens", "text_offset")}


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_text_offsets_equal_the_whole_answer_where_text_is_held_back(http, echo):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 1, "echo": echo}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    text = whole["text"][len(PROMPT) :] if echo else whole["text"]
    assert len(text) > 12
    # stops that never match, each a prefix of which the text holds: the stream holds that text back a while
    for start in (0, 4, 9):
        stop = text[start : start + 3] + "\x07"
        events = streamed(http, "/v1/completions", {**body, "stop": [stop]})
        assert "".join(c["text"] for e in events for c in e["choices"]) == whole["text"]
        got = joined_logprobs(events)
        assert got["tokens"] == whole["logprobs"]["tokens"], stop
        assert got["text_offset"] == whole["logprobs"]["text_offset"], stop


@pytest.mark.parametrize("key", ["²", "٣", "-1", " 5", "5.0"])
def test_a_logit_bias_key_that_is_not_a_token_id_is_refused_by_name(http, key):
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "logit_bias": {key: 1}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias"


def test_a_failure_mid_stream_ends_it_with_an_error_and_done(http, monkeypatch):
    chunk = Job.chunk

    def failing(self, index, text, *args, finish=None, **kwargs):
        if finish is not None:  # the chunk that ends a choice: after the stream is under way
            raise KeyError("an unexpected failure")
        return chunk(self, index, text, *args, finish=finish, **kwargs)

    monkeypatch.setattr(Job, "chunk", failing)
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "n": 2, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2][6:])["error"]
    assert error["type"] == "server_error" and error["message"] == "internal server error: KeyError"
    monkeypatch.undo()
    health = http.get("/health").json()  # the stream's requests were aborted (or had finished)
    assert health["num_requests_unfinished"] == 0
    assert health["kv_blocks_free"] == health["kv_blocks_total"]
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200, r.text


LEFT = [  # (path, body): streams a client leaves after a few events
    ("/v1/completions", {"prompt": PROMPTS[2][:50], "n": 3}),
    ("/v1/completions", {"prompt": PROMPTS[0][:600], "echo": True, "logprobs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}),
    ("/v1/completions", {"prompt": PROMPTS[4][:40], "guided_regex": "[a-z ]{200,400}", "seed": 1}),
    ("/v1/completions", {"prompt": PROMPTS[5][:40], "seed": 3, "temperature": 1}),
    ("/v1/completions", {"prompt": PROMPTS[1][:700]}),
]


async def leave(client: httpx.AsyncClient, path: str, body: dict, events: int) -> int:
    # (a constraint's grammar ends with the end-of-sequence token, so ignore_eos is refused with it)
    body = {"max_tokens": 300, "ignore_eos": "guided_regex" not in body, **body, "stream": True}
    seen = 0
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= events:
                break  # leaving the block closes the connection mid-stream
    return seen


async def until_idle(client: httpx.AsyncClient, timeout: float = 60.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        h = (await client.get("/health")).json()
        if h["num_requests_unfinished"] == 0 and h["kv_blocks_free"] == h["kv_blocks_total"]:
            return h
        assert loop.time() < deadline, f"not idle: {h}"
        await asyncio.sleep(0.05)


def test_streams_left_midway_free_everything_and_leave_the_others_as_alone():
    pytest.importorskip("xgrammar")
    # (a small token budget per step: the long prompts are left during their chunked prefill too)
    app = build_app(config(num_kv_blocks=128, max_num_batched_tokens=32), log_interval=1e9)
    kept = {"prompt": PROMPTS[6][:60], "max_tokens": 24, "temperature": 0, "ignore_eos": True}

    async def run():
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

            async def kept_text() -> str:
                r = await client.post("/v1/completions", json=kept)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            alone = await kept_text()
            left = [leave(client, p, b, k) for k in (1, 2, 5) for p, b in LEFT]
            *seen, beside1, beside2 = await asyncio.gather(*left, kept_text(), kept_text())
            assert seen == [k for k in (1, 2, 5) for _ in LEFT]
            assert beside1 == beside2 == alone
            await until_idle(client)
            assert await kept_text() == alone

    with in_thread(app) as url:
        asyncio.run(run())
    engine = app.state.engine.engine
    assert not engine.has_unfinished_requests
    assert engine.pool.num_free == engine.pool.num_blocks
