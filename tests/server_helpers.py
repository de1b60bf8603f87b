"""Helpers for the server tests: a real ``outpace serve`` process, SSE reading, metrics, offline references."""
from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = json.loads((ROOT / "zoo" / "eval_prompts.json").read_text())["prompts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m outpace serve ARGS`` on 127.0.0.1 and a free port, its output in a log file."""

    def __init__(self, *args: str) -> None:
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="outpace-serve-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "outpace", "serve", "--host", "127.0.0.1",
                                      "--port", str(self.port), *self.args],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.terminate()
        self.log.close()
        os.unlink(self.log.name)


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


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels without model_name): value} from /metrics (which must parse)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


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
    from outpace.cli import _engine_kwargs, parse_args

    a = parse_args(["serve", *serve_args])
    return LLM(a.model, max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len, **_engine_kwargs(a))


def chat_prompt_ids(llm, messages: list[dict]) -> list[int]:
    """How the server turns chat messages into prompt tokens: the chat template, no added specials."""
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)
