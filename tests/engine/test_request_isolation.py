"""One request's failure is that request's alone (issue 42): whatever goes wrong while scheduling or running
one request ends it with an error (finish_reason "error", ``RequestOutput.error``), and every other request,
the KV blocks, the request rows and the engine go on as if it had never come."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from helpers.server_helpers import in_thread
from outpace import LLM, SamplingParams
from outpace.config import EngineConfig, SpeculativeConfig
from outpace.server.app import build_app

ZOO = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")
PROMPTS = [
    "def fibonacci(n):",
    "class Stack:",
    "import os\n",
    "def quicksort(xs):",
    "for i in range(10):",
]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(ZOO, device="cpu", max_num_seqs=4)


@pytest.fixture(scope="module")
def expected(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def _poison(monkeypatch, owner, name: str, prompt_ids: list[int], after_tokens: int = 0):
    """Make ``owner.name`` raise whenever the request with these prompt ids has ``after_tokens`` output
    tokens or more and is among its arguments (a request, a list of requests or of scheduled requests)."""
    real = getattr(owner, name)

    def poisoned(*args, **kwargs):
        for arg in args:
            items = arg if isinstance(arg, list) else [arg]
            for item in items:
                req = getattr(item, "request", item)
                if (
                    getattr(req, "prompt_token_ids", None) == prompt_ids
                    and req.num_output_tokens >= after_tokens
                ):
                    raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, poisoned)


def _assert_clean(llm):
    engine = llm.engine
    assert engine.pool.num_free == engine.pool.num_blocks
    assert not engine.runner.req_table.held_by
    assert not engine.has_unfinished_requests


@pytest.mark.parametrize(
    "where, after", [("execute", 0), ("execute", 5), ("schedule", 0), ("append", 3)]
)
def test_a_failing_request_fails_alone(llm, expected, monkeypatch, where, after):
    """A failure injected into one request of a running batch (in its prefill or mid-decode, in the
    runner, while scheduling it, or while appending its tokens): it alone ends with an error, every other
    request's tokens equal a clean run's, nothing leaks, and the engine keeps serving."""
    engine = llm.engine
    bad = engine.tokenizer.encode(PROMPTS[2])
    if where == "execute":
        _poison(monkeypatch, engine.runner, "execute", bad, after)
    elif where == "schedule":
        _poison(monkeypatch, engine.scheduler, "_cached_prefix", bad)
    else:
        _poison(monkeypatch, engine, "_append_token", bad, after)
    outs = llm.generate(PROMPTS, GREEDY)
    assert outs[2].finish_reason == "error" and "injected failure" in outs[2].error
    for i, out in enumerate(outs):
        if i != 2:
            assert out.error is None and out.token_ids == expected[i], i
    _assert_clean(llm)
    monkeypatch.undo()
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    _assert_clean(llm)


def test_a_short_prompt_with_mtp_and_prefix_caching_is_served():
    """A prompt shorter than the drafter's reads-ahead (2 tokens, MTP) asked the prefix cache for the
    keys of 0 blocks, which raised and failed every later step; it is served like any other."""
    plain = LLM(ZOO, device="cpu").generate([[5, 6]], GREEDY)[0].token_ids
    llm = LLM(ZOO, device="cpu", speculative=SpeculativeConfig("mtp", num_steps=3))
    assert llm.engine.pool.prefix_cache is not None
    assert llm.generate([[5, 6]], GREEDY)[0].token_ids == plain
    assert llm.generate([[5, 6, 7]], GREEDY)[0].finish_reason == "length"


def test_a_failing_request_fails_alone_through_the_server(expected, monkeypatch):
    """Through the server: the failing request gets HTTP 500, the 4 others in flight their tokens."""
    app = build_app(EngineConfig(model=ZOO, device="cpu", max_num_seqs=4), log_interval=60)
    engine = app.state.engine.engine
    _poison(monkeypatch, engine.runner, "execute", engine.tokenizer.encode(PROMPTS[2]), 4)
    with in_thread(app) as url:

        async def ask_all():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                bodies = [
                    {"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
                    for p in PROMPTS
                ]
                return await asyncio.gather(
                    *(client.post("/v1/completions", json=b) for b in bodies)
                )

        answers = asyncio.run(ask_all())
        assert answers[2].status_code == 500 and "injected failure" in answers[2].text
        tokenizer = engine.tokenizer
        for i, answer in enumerate(answers):
            if i != 2:
                assert answer.status_code == 200, answer.text
                text = answer.json()["choices"][0]["text"]
                assert text == tokenizer.decode(expected[i], skip_special_tokens=True), i
        health = httpx.get(url + "/health", timeout=10).json()
        assert (
            health["num_requests_unfinished"] == 0
            and health["kv_blocks_free"] == health["kv_blocks_total"]
        )
