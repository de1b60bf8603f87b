"""Microseconds a call of a small GPU function costs inside a captured step: ``calls`` calls captured in one CUDA
graph, replayed, timed between events (launch gaps included, as a decode step's graph pays them)."""

from __future__ import annotations

from typing import Callable

import torch


def graph_call_us(fn: Callable[[], object], calls: int = 100, replays: int = 5) -> float:
    """Microseconds per call of ``fn`` (run once first: compiled and warm), ``calls`` of them in one graph
    replayed ``replays`` times after a first replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)
