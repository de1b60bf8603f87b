"""``outpace bench serve``: load a running server over HTTP and report latency percentiles and tau.

One load level (``run_load``): requests sent over streaming HTTP, ``concurrency`` at a time. Per
request it measures the time to first token (first non-empty text), the gaps between text chunks
(ITL: with speculation a chunk carries every token a step committed), the time per output token
after the first (TPOT) and the end-to-end latency; tau comes from the responses' own
``spec_metrics``. ``run_serve_bench`` cycles through a prompt set (``zoo/eval_prompts.json`` by
default); bench/serve_sweep.py runs levels of a request mix against servers it starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outpace.speculative.metrics import SpecMetrics


@dataclass
class _Result:
    ok: bool
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    spec: dict | None = None


def load_prompts(path: str | Path) -> list[str]:
    data = json.loads(Path(path).read_text())
    prompts = data["prompts"] if isinstance(data, dict) else data
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError(f"{path}: expected a non-empty list of prompts (or {{'prompts': [...]}})")
    return prompts


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{q}": None for q in qs}
    xs = sorted(values)
    out = {}
    for q in qs:  # linear interpolation between closest ranks
        pos = (len(xs) - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[f"p{q}"] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out


async def _one(client, url: str, body: dict, chat: bool) -> _Result:
    start = time.perf_counter()
    first = last = None
    res = _Result(ok=False)
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                return _Result(ok=False, error=f"HTTP {resp.status_code}: {text[:200]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return _Result(ok=False, error=str(chunk["error"].get("message")))
                if chunk.get("usage"):
                    res.completion_tokens = chunk["usage"]["completion_tokens"]
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.spec = chunk.get("spec_metrics")
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if text:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            res.itl.append(now - last)
                        last = now
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        return _Result(ok=False, error=f"{type(e).__name__}: {e}")
    end = time.perf_counter()
    res.ok = True
    res.e2e = end - start
    res.ttft = (first or end) - start
    return res


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    max_tokens: int


def cycled(prompts: list[str], num_requests: int, max_tokens: int) -> list[BenchRequest]:
    """``num_requests`` requests cycling through ``prompts``, each asking for ``max_tokens``."""
    return [BenchRequest(prompts[i % len(prompts)], max_tokens) for i in range(num_requests)]


async def _run(
    base_url: str,
    requests: list[BenchRequest],
    concurrency: int,
    temperature: float,
    api_key: str | None,
    model: str | None,
    chat: bool,
    ignore_eos: bool,
) -> tuple[list[_Result], float, float]:
    """The results, and when the first request was sent and the last finished (``time.perf_counter``, which is
    system-wide on Linux, so client processes' times compare)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(
        max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4
    )
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=httpx.Timeout(None, connect=30.0)
    ) as client:
        if model is None:
            resp = await client.get("/v1/models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
        url = "/v1/chat/completions" if chat else "/v1/completions"
        todo = iter(requests)
        results: list[_Result] = []

        async def worker() -> None:
            for r in todo:
                body: dict[str, Any] = {
                    "model": model,
                    "max_tokens": r.max_tokens,
                    "temperature": temperature,
                    "ignore_eos": ignore_eos,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                if chat:
                    body["messages"] = [{"role": "user", "content": r.prompt}]
                else:
                    body["prompt"] = r.prompt
                results.append(await _one(client, url, body, chat))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(requests))))))
        return results, start, time.perf_counter()


def _run_shard(args: tuple) -> tuple[list[_Result], float, float]:
    return asyncio.run(_run(*args))


def run_load(
    url: str,
    requests: list[BenchRequest],
    concurrency: int,
    temperature: float = 0.0,
    api_key: str | None = None,
    model: str | None = None,
    chat: bool = False,
    ignore_eos: bool = False,
    client_processes: int = 1,
) -> dict:
    """One load level: ``requests`` in order, ``concurrency`` in flight at once; ``summarize``'s figures.

    ``client_processes`` > 1 splits the requests and the concurrency over that many client processes (request i
    to process i mod P), so that at thousands of streamed tokens per second the one Python client is not what
    limits the figures; the wall time runs from the first process's start to the last one's end."""
    if client_processes < 1 or client_processes > concurrency:
        raise ValueError(
            f"client_processes={client_processes} is invalid: must be in [1, concurrency={concurrency}]"
        )
    shards = [
        (
            url.rstrip("/"),
            requests[i::client_processes],
            len(range(i, concurrency, client_processes)),
            temperature,
            api_key,
            model,
            chat,
            ignore_eos,
        )
        for i in range(client_processes)
    ]
    if client_processes == 1:
        runs = [_run_shard(shards[0])]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(client_processes, mp_context=mp.get_context("spawn")) as pool:
            runs = list(pool.map(_run_shard, shards))
    results = [r for shard, _, _ in runs for r in shard]
    wall = max(end for _, _, end in runs) - min(start for _, start, _ in runs)
    return {
        **summarize(results, wall),
        "concurrency": concurrency,
        "client_processes": client_processes,
    }


def summarize(results: list[_Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    spec = SpecMetrics.total(
        SpecMetrics(
            r.spec["num_verifies"], r.spec["num_draft_tokens"], r.spec["num_accepted_drafts"]
        )
        for r in ok
        if r.spec
    )
    out_tokens = sum(r.completion_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.completion_tokens - 1) for r in ok if r.completion_tokens > 1]
    return {
        "num_requests": len(results),
        "num_failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "wall_s": wall,
        "requests_per_s": len(ok) / wall if wall else None,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall if wall else None,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "ttft_s": percentiles([r.ttft for r in ok]),
        "tpot_s": percentiles(tpot),
        "itl_s": percentiles([x for r in ok for x in r.itl]),
        "e2e_s": percentiles([r.e2e for r in ok]),
        "spec_verifies": spec.num_verifies,
        "tau": spec.acceptance_length if spec.num_verifies else None,
    }


def run_serve_bench(
    url: str,
    num_requests: int = 96,
    concurrency: int = 8,
    prompts: str | Path | None = None,
    max_tokens: int = 64,
    temperature: float = 0.0,
    api_key: str | None = None,
    model: str | None = None,
    chat: bool = False,
    out_json: str | None = None,
) -> dict:
    if prompts is None:
        from outpace.zoo import zoo_dir

        prompts = zoo_dir() / "eval_prompts.json"
    summary = run_load(
        url,
        cycled(load_prompts(prompts), num_requests, max_tokens),
        concurrency,
        temperature,
        api_key,
        model,
        chat,
    )
    summary.update(
        url=url,
        max_tokens=max_tokens,
        temperature=temperature,
        endpoint="chat" if chat else "completions",
    )
    print(format_summary(summary))
    if out_json:
        Path(out_json).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def scrape_metrics(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels without model_name): value} from the server's /metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.rstrip("/") + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[
                (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))
            ] = s.value
    return out


def prefix_cache_hit_rate(before: dict, after: dict) -> float | None:
    """Prompt tokens served from the prefix cache over those looked up, between two ``scrape_metrics``
    (None: caching off, or nothing looked up)."""
    hits, queries = (
        (
            after.get((f"outpace:prefix_cache_{n}_total", ()), 0.0)
            - before.get((f"outpace:prefix_cache_{n}_total", ()), 0.0)
        )
        for n in ("hits", "queries")
    )
    return hits / queries if queries else None


def format_summary(s: dict) -> str:
    def ms(p: dict) -> str:
        return " ".join(f"{k} {v * 1000:.1f}" if v is not None else f"{k} -" for k, v in p.items())

    lines = [
        (
            f"requests: {s['num_requests'] - s['num_failed']}/{s['num_requests']} ok, concurrency {s['concurrency']}, "
            f"wall {s['wall_s']:.2f} s, {s['requests_per_s']:.2f} requests/s"
        ),
        (
            f"output: {s['output_tokens']} tokens, {s['output_tokens_per_s']:.1f} tokens/s "
            f"(prompt tokens {s['prompt_tokens']})"
        ),
        f"TTFT ms: {ms(s['ttft_s'])}",
        f"TPOT ms: {ms(s['tpot_s'])}",
        f"ITL  ms: {ms(s['itl_s'])}",
        f"E2E  ms: {ms(s['e2e_s'])}",
        f"tau: {s['tau']:.2f} over {s['spec_verifies']} verifies"
        if s["tau"]
        else "tau: - (no speculation)",
    ]
    if s["errors"]:
        lines.append("errors: " + "; ".join(s["errors"]))
    return "\n".join(lines)
