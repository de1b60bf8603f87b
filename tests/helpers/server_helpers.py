"""Helpers for the server tests: a real ``outpace serve`` process, SSE reading, metrics, offline references."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import time
from pathlib import Path

import httpx

from outpace.bench.local_server import LocalServer as ServerProcess  # noqa: F401 - the tests' server process
from outpace.server.bench import scrape_metrics as metrics  # noqa: F401 - {(sample, labels): value} of /metrics

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = json.loads((ROOT / "zoo" / "eval_prompts.json").read_text())["prompts"]


def sse_events(lines) -> list:
    """The JSON payloads of ``data:`` lines up to ``[DONE]`` (which must come)."""
    events = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return events
        events.append(json.loads(line[6:]))
    raise AssertionError(f"stream ended without [DONE] after {len(events)} events")


def stream_text(events, chat: bool = False) -> tuple[str, str | None]:
    """Concatenated text of choice 0 and its finish reason."""
    text, finish = "", None
    for e in events:
        for c in e.get("choices", []):
            text += (c["delta"].get("content") or "") if chat else c["text"]
            finish = c.get("finish_reason") or finish
    return text, finish


async def leave_after(client: httpx.AsyncClient, prompt: str, events: int = 3) -> int:
    """Stream a greedy 1000-token completion and close the connection after ``events`` events (a client that
    goes away mid-stream); returns the events seen."""
    body = {
        "prompt": prompt,
        "max_tokens": 1000,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    seen = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= events:
                break  # leaving the block closes the connection mid-stream
    return seen


def wait_idle(url: str, timeout: float = 60.0) -> dict:
    """Wait until no request is unfinished and every KV block is free; returns /health."""
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(url + "/health", timeout=10).json()
        if h["num_requests_unfinished"] == 0 and h["kv_blocks_free"] == h["kv_blocks_total"]:
            return h
        if time.monotonic() > deadline:
            raise AssertionError(f"server not idle after {timeout} s: {h}")
        time.sleep(0.1)


@functools.cache
def offline_llm(*serve_args: str):
    """The offline LLM with exactly the engine config ``outpace serve SERVE_ARGS`` builds."""
    from outpace import LLM
    from outpace.cli import parse_args
    from outpace.cli.engine_args import engine_kwargs

    a = parse_args(["serve", *serve_args])
    return LLM(
        a.model, max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len, **engine_kwargs(a)
    )


def serving(*serve_args: str, log_says: str | None = None):
    """The body of a module fixture: ``outpace serve SERVE_ARGS`` for the module's tests (the offline reference
    model loads while it starts); at teardown SIGTERM must end it with exit code 0, its log holding
    ``log_says``."""
    proc = ServerProcess(*serve_args)
    try:
        offline_llm()
        yield proc.wait_ready()
        assert proc.terminate() == 0, proc.output()
        assert log_says is None or log_says in proc.output(), proc.output()
    finally:
        proc.close()


def chat_prompt_ids(llm, messages: list[dict]) -> list[int]:
    """How the server turns chat messages into prompt tokens: the chat template, no added specials."""
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


@contextlib.contextmanager
def in_thread(app):
    """Serve the app (server/app.py ``build_app``) with uvicorn on a thread of this process, on a free port: yields
    its URL, stops it after. Where a test patches the engine in this process."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
