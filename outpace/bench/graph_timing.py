"""Microseconds a GPU call costs as the engine runs it, replayed from a CUDA graph (no host launch overhead):
``captured_call_us`` the median of one call's replays under ``triton.testing.do_bench`` (the L2 cache flushed
between them: the call reads its operands from HBM), ``graph_call_us`` a small call among ``calls`` of its
kind captured in one graph and timed between events (launch gaps included, as a decode step's graph pays
them)."""

from __future__ import annotations

from typing import Callable

import torch


def captured_call_us(fn: Callable[[], object]) -> float:
    """Median GPU microseconds of ``fn`` (run once first: compiled and warm) captured in a CUDA graph, its
    replays timed by ``triton.testing.do_bench``."""
    from triton.testing import do_bench

    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, return_mode="median") * 1e3


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
