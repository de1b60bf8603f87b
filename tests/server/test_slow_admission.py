"""A request's admission checks run off the server's event loop: a constraint's first compile can take seconds (an
enum of 10,000 strings took 6 to 8 s on the CPU, 20,000 took 33), and while it ran on the loop every other stream and
/health stalled. Here the compile is held until /health has answered."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

for _dependency in ("fastapi", "uvicorn", "xgrammar"):
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")

from helpers.server_helpers import in_thread  # noqa: E402
from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402

ZOO = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")


def test_health_answers_while_a_constraint_compiles(monkeypatch):
    app = build_app(EngineConfig(model=ZOO, device="cpu", max_num_seqs=2), log_interval=60)
    compiler = app.state.engine.engine.grammars.compiler
    entered, release = threading.Event(), threading.Event()
    compile_ = compiler.compile

    def held(spec):  # the slow compile: until /health has answered (60 s at most)
        entered.set()
        release.wait(timeout=60)
        return compile_(spec)

    monkeypatch.setattr(compiler, "compile", held)
    with in_thread(app) as url:

        async def constrained_and_health():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                body = {"prompt": "x", "max_tokens": 4, "guided_json": {"type": "integer"}}
                constrained = asyncio.create_task(client.post("/v1/completions", json=body))
                assert await asyncio.to_thread(entered.wait, 60)
                try:
                    health = await client.get("/health", timeout=20)
                    answered_while_held = not release.is_set()
                finally:
                    release.set()
                return health, answered_while_held, await constrained

        try:
            health, answered_while_held, constrained = asyncio.run(constrained_and_health())
        finally:
            release.set()
        assert health.status_code == 200 and answered_while_held
        assert constrained.status_code == 200, constrained.text
        assert constrained.json()["choices"][0]["text"].strip().lstrip("-").isdigit()
