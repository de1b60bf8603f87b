"""Prometheus metrics of one server (its own registry), named in the ``outpace:`` namespace like vLLM's.

The engine thread records into these (prometheus-client is thread-safe); /metrics renders them.
Counters: requests by finish reason, prompt and generated tokens, speculative drafts (verify
steps), draft tokens, accepted draft tokens (overall and per draft position). Histograms: time
to first token, inter-token latency (per generated token), queue time, end-to-end latency.
Gauges: running and waiting requests, free and total KV blocks.
Prefix cache (cache/prefix_cache.py), read from the engine when /metrics renders: queried and hit
tokens (counters, as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``), their ratio, and whether
caching is on (0 on hybrid targets and recurrent drafts, or when turned off).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from outpace.cache.prefix_cache import PrefixCacheStats

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        lab = {"model_name": model_name}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, m, registry=r).labels(**lab)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, m, buckets=buckets, registry=r).labels(**lab)

        self._gauges = {
            name: Gauge(name, doc, m, registry=r).labels(**lab)
            for name, doc in (
                ("outpace:num_requests_running", "Requests in the running batch."),
                ("outpace:num_requests_waiting", "Requests accepted and waiting to run."),
                ("outpace:kv_blocks_free", "Free blocks of the paged KV cache."),
                ("outpace:kv_blocks_total", "Blocks of the paged KV cache."),
            )
        }
        self.prompt_tokens = counter("outpace:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("outpace:generation_tokens", "Tokens generated.")
        self.ttft = histogram(
            "outpace:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "outpace:inter_token_latency_seconds",
            "Time between generated tokens (a step's gap divided by its tokens).",
            ITL_BUCKETS,
        )
        self.queue_time = histogram(
            "outpace:request_queue_time_seconds",
            "Time from arrival to first being scheduled.",
            LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "outpace:e2e_request_latency_seconds", "Time from arrival to finish.", LATENCY_BUCKETS
        )
        self.spec_drafts = counter(
            "outpace:spec_decode_num_drafts", "Speculative verify steps (one draft proposal each)."
        )
        self.spec_draft_tokens = counter(
            "outpace:spec_decode_num_draft_tokens", "Draft tokens verified."
        )
        self.spec_accepted = counter(
            "outpace:spec_decode_num_accepted_tokens",
            "Draft tokens accepted (bonus tokens not included).",
        )
        self._spec_per_pos = Counter(
            "outpace:spec_decode_num_accepted_tokens_per_pos",
            "Verify steps whose draft at this position (0-based depth) was accepted.",
            m + ["position"],
            registry=r,
        )
        self._success = Counter(
            "outpace:request_success",
            "Finished requests by finish reason.",
            m + ["finished_reason"],
            registry=r,
        )
        self._lab = lab
        self._prefix_cache: _PrefixCacheCollector | None = None

    def bind_gauge(self, name: str, read: Callable[[], float]) -> None:
        self._gauges[name].set_function(read)

    def watch_prefix_cache(self, read: Callable[[], PrefixCacheStats | None]) -> None:
        """Expose the prefix cache statistics ``read()`` returns at each render (None: caching is off); with
        several engines (data-parallel replicas) each watches its own and /metrics shows their sums."""
        if self._prefix_cache is None:
            self._prefix_cache = _PrefixCacheCollector(self._lab)
            self.registry.register(self._prefix_cache)
        self._prefix_cache.readers.append(read)

    def accepted_at(self, position: int) -> Counter:
        return self._spec_per_pos.labels(position=str(position), **self._lab)

    def finished(self, reason: str | None) -> None:
        self._success.labels(finished_reason=str(reason), **self._lab).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PrefixCacheCollector:
    """Prometheus collector over the engines' prefix cache statistics (their counts live in the engines)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.readers: list[Callable[[], PrefixCacheStats | None]] = []
        self.labels = labels

    def collect(self):
        stats = [s for s in (read() for read in self.readers) if s is not None]
        names, values = list(self.labels), list(self.labels.values())
        enabled = GaugeMetricFamily(
            "outpace:prefix_cache_enabled", "1 when prefix caching is on.", labels=names
        )
        enabled.add_metric(values, 1.0 if stats else 0.0)
        yield enabled
        if not stats:
            return
        total = PrefixCacheStats(sum(s.queries for s in stats), sum(s.hits for s in stats))
        for name, doc, value in (
            (
                "outpace:prefix_cache_queries",
                "Tokens of admitted requests looked up in the prefix cache.",
                total.queries,
            ),
            (
                "outpace:prefix_cache_hits",
                "Tokens whose KV came from the prefix cache.",
                total.hits,
            ),
        ):
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(values, float(value))
            yield counter
        rate = GaugeMetricFamily(
            "outpace:prefix_cache_hit_rate",
            "prefix_cache_hits / prefix_cache_queries.",
            labels=names,
        )
        rate.add_metric(values, total.hit_rate)
        yield rate
