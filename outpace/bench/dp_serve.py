"""``bench multi`` part dp: requests/s and output tokens/s of the served model at ``dp_streams`` concurrent
streams (bench serve's client, server/bench.py): one replica (``outpace serve`` on one GPU) against
``outpace serve --data-parallel-size 2`` (server/replicas.py: one replica per GPU behind the one server).
"""
from __future__ import annotations

from outpace.bench.local_server import LocalServer
from outpace.server.bench import cycled, load_prompts, run_load
from outpace.zoo import zoo_dir


def start_server(model: str, plan, gpus: str | None, *extra: str) -> LocalServer:
    """``outpace serve`` of ``model`` with plain decoding, on the GPUs ``gpus`` (CUDA_VISIBLE_DEVICES)."""
    on_gpu = plan.device.startswith("cuda")
    return LocalServer(
        model, "--device", "cuda" if on_gpu else "cpu", "--dtype", "bfloat16" if on_gpu else "float32",
        "--method", "none", "--max-num-seqs", str(plan.dp_streams), "--num-kv-blocks", str(plan.dp_kv_blocks),
        "--max-num-batched-tokens", "8192", "--max-queued-requests", str(4 * plan.dp_requests),
        "--log-level", "warning", *extra, env=None if gpus is None else {"CUDA_VISIBLE_DEVICES": gpus})


def measure(server: LocalServer, streams: int, requests: int, max_tokens: int, prompts: list[str]) -> dict:
    """``requests`` greedy completions, ``streams`` at a time: server/bench.py's summary."""
    return {**run_load(server.url, cycled(prompts, requests, max_tokens), streams), "streams": streams}


def dp_throughput(plan, model: str, replicas: int = 2) -> dict:
    """One replica against ``replicas`` behind one server (1: the single-GPU figure alone); bf16 on GPUs."""
    prompts = load_prompts(zoo_dir() / "eval_prompts.json")
    on_gpu = plan.device.startswith("cuda")
    result = {"model": model, "streams": plan.dp_streams, "requests": plan.dp_requests,
              "max_tokens": plan.dp_max_tokens, "temperature": 0.0}

    def served(gpus: str, *extra: str) -> dict:
        server = start_server(model, plan, gpus if on_gpu else None, *extra)
        try:
            server.wait_ready(240.0)
            # warm-up: the first requests' prefill shapes and batch buckets
            measure(server, min(16, plan.dp_streams), min(16, plan.dp_requests), 8, prompts)
            return measure(server, plan.dp_streams, plan.dp_requests, plan.dp_max_tokens, prompts)
        finally:
            server.close()

    result["one_replica"] = served("0")
    if replicas > 1:
        result["mode"] = f"outpace serve --data-parallel-size {replicas}"
        result["two_replicas"] = served(",".join(map(str, range(replicas))), "--data-parallel-size", str(replicas))
        one, two = result["one_replica"], result["two_replicas"]
        result["output_tokens_per_s_ratio"] = two["output_tokens_per_s"] / one["output_tokens_per_s"]
        result["requests_per_s_ratio"] = two["requests_per_s"] / one["requests_per_s"]
    return result
