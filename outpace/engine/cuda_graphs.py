"""CUDA graphs: the decode iteration captured per batch bucket at start-up and replayed with padding.

A captured step reads only static device buffers (the batch's indices, the request state, the block tables) and builds
its attention metadata from them with device operations (``uniform_paged_metadata``), so a replay costs a small
host-to-device copy and one graph launch instead of thousands of kernel launches. A batch of ``n`` requests replays
the graph of the smallest bucket >= n; the padded rows use the padding row (engine/request_table.py), so the KV they write
lands where no request reads.
"""

from __future__ import annotations

import functools
import gc
from typing import Callable, Sequence

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


def largest_decode_batch(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    decode_tokens: int,
    run_ahead: bool,
    recurrent: bool,
) -> int:
    """The most requests a decode step can ever hold, so the largest batch bucket worth capturing. A decoding
    request costs ``decode_tokens`` (1, or the largest draft shape's verified tokens) of the step's token budget,
    so the scheduler puts at most ``max_num_batched_tokens // decode_tokens`` in a batch. A step run ahead
    (engine/run_ahead.py) also holds the requests whose prefill the step before it completed, each of which cost
    that step at least one token beside its one or more decoding requests: at most ``max_num_batched_tokens -
    decode_tokens + 1`` (the budget again without speculation). A hybrid's batch after a step run ahead decodes
    every request that step ran for, the budget or not (``RunAhead.reconcile``), and the requests joining in it run
    ahead with them: nothing but ``max_num_seqs`` bounds it.

    vLLM caps its capture sizes the same way: ``max_cudagraph_capture_size = min(max_num_tokens,
    max_cudagraph_capture_size)``, ``max_num_tokens`` being ``scheduler_config.max_num_batched_tokens``
    (vllm/config/vllm.py, ``VllmConfig._set_cudagraph_sizes``); its sizes count tokens, a uniform decode batch
    ``1 + num_speculative_tokens`` of them a request."""
    if run_ahead and recurrent:
        return max_num_seqs
    most = (
        max_num_batched_tokens - decode_tokens + 1
        if run_ahead
        else max_num_batched_tokens // decode_tokens
    )
    return max(1, min(max_num_seqs, most))


def batch_buckets(
    max_num_seqs: int, sizes: tuple[int, ...] | None = None, largest: int | None = None
) -> tuple[int, ...]:
    """The captured batch sizes, ascending: those of ``sizes`` (EngineConfig.cuda_graph_sizes) up to ``largest``
    (``largest_decode_batch``; default ``max_num_seqs``) when given, possibly none, else the default ladder up to
    the smaller of the two, which is always one."""
    most = max_num_seqs if largest is None else min(largest, max_num_seqs)
    if sizes is not None:
        return tuple(sorted(n for n in sizes if n <= most))
    return tuple(b for b in DEFAULT_BUCKETS if b < most) + (most,)


def bucket_for(buckets: Sequence[int], n: int) -> int | None:
    """The smallest bucket that holds ``n`` sequences, or None (then the caller runs eagerly)."""
    return next((b for b in buckets if b >= n), None)


@functools.cache
def warm_up_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream of a device that every capture's warm-up runs on. cuBLAS keeps a workspace for each
    stream it has run on (32 MiB on Hopper) until the process ends, and ``torch.cuda.Stream()`` hands out up to
    32 pooled streams: with a new stream a capture, 896 MiB stayed allocated after a bench's engines had closed
    (benchmarks/results/gpu_2026-12-03, call 2)."""
    return torch.cuda.Stream(device)


class CapturedCall:
    """``fn`` (which reads and writes only static buffers) captured as a CUDA graph on a CUDA
    device; elsewhere each replay simply calls ``fn`` again, with the same static-buffer semantics,
    so the padding and state handling around graphs run (and are tested) on the CPU too. ``replays`` counts
    the calls of ``replay`` (benchmarks check one replay per engine step with it)."""

    def __init__(self, fn: Callable[[], object], device: torch.device, memory_pool=None) -> None:
        self.fn, self.graph, self.outputs = fn, None, None
        self.replays = 0
        if device.type != "cuda":
            return
        side = warm_up_stream(device)  # warm-up: allocations, library handles, Triton compilation
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # No cyclic garbage collection while capturing: it could free an unreachable graph or its
        # memory in the middle of the capture, which CUDA does not allow during a capture (a suspect in
        # an intermittent "capture invalidated" when re-capturing in a loop; not confirmed).
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, pool=memory_pool):
                self.outputs = fn()
        finally:
            if collecting:
                gc.enable()

    def release(self) -> None:
        """Free the captured graph (later replays run ``fn`` eagerly). A graph that captured NCCL
        collectives holds their communicator's resources, so an engine's graphs are released before its
        process group is destroyed, which otherwise waits for them forever (pytorch/pytorch#115388)."""
        if self.graph is not None:
            self.graph.reset()
        self.graph, self.outputs = None, None

    def replay(self):
        """Run the call; returns its outputs (on CUDA: the captured static tensors)."""
        self.replays += 1
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.outputs
