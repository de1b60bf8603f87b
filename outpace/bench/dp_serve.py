"""``bench multi`` part dp: requests/s and output tokens/s of the served model at ``dp_streams`` concurrent
streams (bench serve's client, server/bench.py): one replica (``outpace serve`` on one GPU) against
``outpace serve --data-parallel-size 2`` (server/replicas.py: one replica per GPU behind the one server).

Data parallelism multiplies throughput only where one replica is saturated. Decode of an 8B shape is bound by
reading the weights, so one replica at 64 streams runs a step over 64 rows in little more time than two
replicas each run one over 32; the second level, ``dp_saturated_streams`` (256), is where one replica's step
costs in proportion to its rows (on two H100s its host work, not the GPU, bounds it there). Both levels run on
the same servers, each after a warm-up at its own stream count (a batch size met for the first time captures
its graphs).

Two baselines of one replica: the single server as users run it (the engine in the server's process) and
``--engine-process`` (the engine in a process of its own, as each of the two replicas runs), so the two-replica
ratio can be read against either: at 256 streams one replica's tokens/s stayed where they were at 64 while
two replicas' rose 2.7x (benchmarks/results/multi_gpu/dp_ab_h200_run), which points at the host work the in-process
engine shares with the HTTP event loop.

Each stream sends ``dp_requests / dp_streams`` requests one after another (8): with 3, a level lasted 3-4 s, of
which the ramp (every stream's prefill at once) and the drain (the last streams' tails) were a large part, and
the wall-clock throughput diluted what per-token times showed (dp_ab_h200_run: EAGLE3 at 64 streams, 2.1x lower
time per output token with two replicas, 1.40x the tokens/s).
"""

from __future__ import annotations

from outpace.bench.local_server import LocalServer
from outpace.server.bench import cycled, load_prompts, run_load
from outpace.zoo import zoo_dir


def start_server(
    model: str, plan, gpus: str | None, drafter: tuple[str, ...], *extra: str
) -> LocalServer:
    """``outpace serve`` of ``model`` with the ``drafter`` flags (``--method ...``), on the GPUs ``gpus``
    (CUDA_VISIBLE_DEVICES)."""
    on_gpu = plan.device.startswith("cuda")
    return LocalServer(
        model,
        "--device",
        "cuda" if on_gpu else "cpu",
        "--dtype",
        "bfloat16" if on_gpu else "float32",
        *drafter,
        "--max-num-seqs",
        str(max(_levels(plan))),
        "--num-kv-blocks",
        str(plan.dp_kv_blocks),
        "--max-num-batched-tokens",
        "8192",
        "--max-queued-requests",
        str(4 * max(_levels(plan).values())),
        "--log-level",
        "warning",
        *extra,
        env=None if gpus is None else {"CUDA_VISIBLE_DEVICES": gpus},
    )


def _levels(plan) -> dict[int, int]:
    """{concurrent streams: requests} of each level: ``dp_streams``, and ``dp_saturated_streams`` with as many
    requests per stream."""
    levels = {plan.dp_streams: plan.dp_requests}
    if plan.dp_saturated_streams:
        levels[plan.dp_saturated_streams] = (
            plan.dp_requests * plan.dp_saturated_streams // plan.dp_streams
        )
    return levels


def measure(
    server: LocalServer,
    streams: int,
    requests: int,
    max_tokens: int,
    prompts: list[str],
    client_processes: int,
) -> dict:
    """``requests`` greedy completions, ``streams`` at a time, sent by ``client_processes`` client processes:
    server/bench.py's summary."""
    return {
        **run_load(
            server.url,
            cycled(prompts, requests, max_tokens),
            streams,
            client_processes=min(client_processes, streams),
        ),
        "streams": streams,
    }


def dp_throughput(
    plan, model: str, drafter: tuple[str, ...] = ("--method", "none"), replicas: int = 2
) -> dict:
    """One replica against ``replicas`` behind one server (1: the single-GPU figures alone), at each level,
    every server with the ``drafter`` flags; bf16 on GPUs. The top-level rows are the ``dp_streams`` level's,
    ``saturated`` holds the other's."""
    prompts = load_prompts(zoo_dir() / "eval_prompts.json")
    on_gpu = plan.device.startswith("cuda")
    levels = _levels(plan)

    def served(gpus: str, *extra: str) -> dict[int, dict]:
        server = start_server(model, plan, gpus if on_gpu else None, drafter, *extra)
        try:
            server.wait_ready(240.0)
            rows = {}
            for streams, requests in levels.items():
                # warm-up: this level's batch sizes. Its figures are dropped, so one client process sends it
                # (asyncio holds every stream in flight) instead of starting dp_client_processes for it
                measure(server, streams, streams, 8, prompts, 1)
                rows[streams] = measure(
                    server, streams, requests, plan.dp_max_tokens, prompts, plan.dp_client_processes
                )
            return rows
        finally:
            server.close()

    one = served("0")
    own = served("0", "--engine-process") if plan.dp_engine_process else {}
    two = (
        served(",".join(map(str, range(replicas))), "--data-parallel-size", str(replicas))
        if replicas > 1
        else {}
    )
    by_level = []
    for streams, requests in levels.items():
        row = {"streams": streams, "requests": requests, "one_replica": one[streams]}
        if own:
            row["one_replica_own_process"] = own[streams]
        if two:
            row["two_replicas"] = two[streams]
            for suffix, base in (("", one), ("_own_process", own)):
                if base:
                    row[f"output_tokens_per_s_ratio{suffix}"] = (
                        two[streams]["output_tokens_per_s"] / base[streams]["output_tokens_per_s"]
                    )
                    row[f"requests_per_s_ratio{suffix}"] = (
                        two[streams]["requests_per_s"] / base[streams]["requests_per_s"]
                    )
        by_level.append(row)
    first, *rest = by_level
    result = {
        "model": model,
        "drafter": " ".join(drafter),
        "max_tokens": plan.dp_max_tokens,
        "temperature": 0.0,
        **first,
    }
    if two:
        result["mode"] = f"outpace serve --data-parallel-size {replicas}"
    if rest:
        result["saturated"] = rest[0]
    return result
