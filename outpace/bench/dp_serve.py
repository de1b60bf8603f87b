"""``bench multi`` part dp: requests/s and output tokens/s of the served model at ``dp_streams`` concurrent
streams (bench serve's client, server/bench.py): one replica (``outpace serve`` on one GPU) against
``outpace serve --data-parallel-size 2`` (server/replicas.py: one replica per GPU behind the one server).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from outpace.distributed.launch import _free_port
from outpace.server.bench import _run, load_prompts, summarize
from outpace.zoo import zoo_dir

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """``python -m outpace serve`` on a free local port, on the GPUs ``gpus`` (CUDA_VISIBLE_DEVICES)."""

    def __init__(self, model: str, plan, gpus: str | None, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="outpace-dp-serve-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        on_gpu = plan.device.startswith("cuda")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "outpace", "serve", model, "--host", "127.0.0.1", "--port", str(self.port),
             "--device", "cuda" if on_gpu else "cpu", "--dtype", "bfloat16" if on_gpu else "float32",
             "--method", "none", "--max-num-seqs", str(plan.dp_streams), "--num-kv-blocks", str(plan.dp_kv_blocks),
             "--max-num-batched-tokens", "8192", "--max-queued-requests", str(4 * plan.dp_requests),
             "--log-level", "warning", *extra],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 240.0) -> Server:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the server was not ready after {timeout_s} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def measure(server: Server, streams: int, requests: int, max_tokens: int, prompts: list[str]) -> dict:
    """``requests`` greedy completions, ``streams`` at a time: server/bench.py's summary."""
    results, wall = asyncio.run(_run(server.url, requests, streams, prompts, max_tokens, 0.0, None, None, False))
    return {**summarize(results, wall), "streams": streams}


def dp_throughput(plan, model: str, replicas: int = 2) -> dict:
    """One replica against ``replicas`` behind one server (1: the single-GPU figure alone); bf16 on GPUs."""
    prompts = load_prompts(zoo_dir() / "eval_prompts.json")
    on_gpu = plan.device.startswith("cuda")
    result = {"model": model, "streams": plan.dp_streams, "requests": plan.dp_requests,
              "max_tokens": plan.dp_max_tokens, "temperature": 0.0}

    def served(gpus: str, *extra: str) -> dict:
        server = Server(model, plan, gpus if on_gpu else None, *extra)
        try:
            server.wait_ready()
            # warm-up: the first requests' prefill shapes and batch buckets
            measure(server, min(16, plan.dp_streams), min(16, plan.dp_requests), 8, prompts)
            return measure(server, plan.dp_streams, plan.dp_requests, plan.dp_max_tokens, prompts)
        finally:
            server.stop()

    result["one_replica"] = served("0")
    if replicas > 1:
        result["mode"] = f"outpace serve --data-parallel-size {replicas}"
        result["two_replicas"] = served(",".join(map(str, range(replicas))), "--data-parallel-size", str(replicas))
        one, two = result["one_replica"], result["two_replicas"]
        result["output_tokens_per_s_ratio"] = two["output_tokens_per_s"] / one["output_tokens_per_s"]
        result["requests_per_s_ratio"] = two["requests_per_s"] / one["requests_per_s"]
    return result
