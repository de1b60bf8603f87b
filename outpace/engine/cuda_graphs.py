"""CUDA graphs: forwards of one shape captured per batch bucket at start-up and replayed with padding.

A captured forward reads only static device buffers (token ids, positions, first rows, the block
tables) and builds its attention metadata from them with device operations
(``uniform_paged_metadata``), so a replay costs a few small host-to-device copies and one graph
launch instead of thousands of kernel launches. A batch of ``n`` sequences replays the graph of
the smallest bucket >= n; the padded sequences start at row 0 and their block-table rows point at
the pool's padding block, so the KV they write lands where no request reads.
"""
from __future__ import annotations

import gc
from typing import Callable, Sequence

import torch
from torch import nn

from outpace.attention import forward_context, uniform_paged_metadata
from outpace.attention.backend import AttentionBackend
from outpace.cache.block_pool import BlockPool
from outpace.models.llama import ModelOutput

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The captured batch sizes: the default ladder up to ``max_num_seqs``, which is always one."""
    return tuple(b for b in DEFAULT_BUCKETS if b < max_num_seqs) + (max_num_seqs,)


def bucket_for(buckets: Sequence[int], n: int) -> int | None:
    """The smallest bucket that holds ``n`` sequences, or None (then the caller runs eagerly)."""
    return next((b for b in buckets if b >= n), None)


class CapturedCall:
    """``fn`` (which reads and writes only static buffers) captured as a CUDA graph on a CUDA
    device; elsewhere each replay simply calls ``fn`` again, with the same static-buffer semantics,
    so the padding and state handling around graphs run (and are tested) on the CPU too."""

    def __init__(self, fn: Callable[[], object], device: torch.device, memory_pool=None) -> None:
        self.fn, self.graph, self.outputs = fn, None, None
        if device.type != "cuda":
            return
        side = torch.cuda.Stream()  # warm-up: allocations, library handles, Triton compilation
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

    def replay(self):
        """Run the call; returns its outputs (on CUDA: the captured static tensors)."""
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.outputs


def pinned(values: list[int], device: torch.device) -> torch.Tensor:
    """A host int64 tensor, page-locked when it is bound for a CUDA device (asynchronous copies)."""
    return torch.tensor(values, dtype=torch.int64, pin_memory=device.type == "cuda")


class GraphBlockTables:
    """The [max_seqs, max_blocks] device block tables that replays read, mirrored in pinned host
    memory and updated incrementally: a request's table only grows while it lives, so a step
    usually copies nothing.

    An earlier asynchronous copy may still be queued when the mirror changes: rows only grow while
    their request stays (entries past what a queued replay reads), and a row changes owner only after
    the replays queued before have finished (each step waits for its results; a step run ahead is
    waited for before it is dropped: runner.py).
    """

    def __init__(self, pool: BlockPool, max_seqs: int, max_blocks: int, device: torch.device) -> None:
        self.pool = pool
        self.host = torch.full((max_seqs, max_blocks), pool.padding_block, dtype=torch.int64,
                               pin_memory=torch.device(device).type == "cuda")
        self.device = self.host.to(device)
        self._rows: list[tuple[str | None, int]] = [(None, 0)] * max_seqs  # (request id, blocks written)

    @property
    def max_rows(self) -> int:
        """The KV rows a request's table here can address."""
        return self.host.shape[1] * self.pool.block_size

    def update(self, request_ids: Sequence[str], bucket: int) -> None:
        """Rows 0 .. len(request_ids) - 1 become these requests' tables, rows up to ``bucket`` padding."""
        dirty = False
        for i in range(bucket):
            rid = request_ids[i] if i < len(request_ids) else None
            table = self.pool.table(rid) if rid is not None else []
            owner, written = self._rows[i]
            if owner != rid or written > len(table):
                self.host[i].fill_(self.pool.padding_block)
                written, dirty = 0, dirty or owner is not None or rid is not None
            if len(table) > written:
                if len(table) > self.host.shape[1]:
                    raise ValueError(f"request {rid!r} has {len(table)} blocks, graphs hold {self.host.shape[1]}")
                self.host[i, written:len(table)] = torch.tensor(table[written:], dtype=torch.int64)
                dirty = True
            self._rows[i] = (rid, len(table))
        if dirty:
            self.device[:bucket].copy_(self.host[:bucket], non_blocking=True)


class CapturedTargetForward:
    """The target's forward and the logits of every row, over ``bucket`` sequences of ``query_len``
    new tokens each (decode: 1; chain or tree verify: the verified tree's size), one graph per bucket.

    Inputs are copied into static buffers; outputs are views of the graph's static outputs, valid
    until the next replay.
    """

    def __init__(self, model: nn.Module, backend: AttentionBackend, tables: GraphBlockTables, buckets: Sequence[int],
                 query_len: int, tree: bool, memory_pool) -> None:
        self.model, self.backend, self.tables = model, backend, tables
        self.buckets, self.query_len = tuple(buckets), query_len
        dev, max_seqs = tables.device.device, max(buckets)
        self.token_ids = torch.zeros(max_seqs * query_len, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_seqs * query_len, dtype=torch.int64, device=dev)
        self.starts = torch.zeros(max_seqs, dtype=torch.int64, device=dev)
        # tree verify: each sequence's ancestor mask over its query_len new rows (causal until written)
        self.custom_mask = (torch.ones(query_len, query_len, dtype=torch.bool, device=dev).tril()
                            .repeat(max_seqs, 1, 1) if tree else None)
        # one logits buffer that every bucket's graph writes into (per-bucket outputs of a large
        # vocabulary would each stay allocated: ~1.5 GB over the buckets of a 128k-vocabulary tree verify)
        self.logits = torch.empty(max_seqs * query_len, model.config.vocab_size, dtype=torch.float32, device=dev)
        self._calls = {b: CapturedCall(lambda b=b: self._forward(b), dev, memory_pool)
                       for b in sorted(self.buckets, reverse=True)}

    def _forward(self, bucket: int) -> tuple[ModelOutput, torch.Tensor]:
        q = self.query_len
        mask = self.custom_mask[:bucket] if self.custom_mask is not None else None
        meta = uniform_paged_metadata(self.tables.device[:bucket], self.starts[:bucket], q,
                                      self.tables.pool.block_size, mask)
        with torch.inference_mode(), forward_context(meta, self.backend):
            out = self.model(self.token_ids[:bucket * q], self.positions[:bucket * q])
            return out, self.model.compute_logits(out.hidden_states, out=self.logits[:bucket * q])

    def run(self, request_ids: Sequence[str], starts: Sequence[int], token_ids: torch.Tensor,
            positions: torch.Tensor, custom_mask: torch.Tensor | None = None) -> tuple[ModelOutput, torch.Tensor]:
        """token_ids, positions [n * query_len] (on the device, or in pinned host memory: copied straight
        into the static buffers); custom_mask [n, query_len, query_len] for trees.

        Returns (model output, logits [n * query_len, vocab]) for the n real sequences."""
        n, q = len(request_ids), self.query_len
        bucket = bucket_for(self.buckets, n)
        self.tables.update(request_ids, bucket)
        self.token_ids[:n * q].copy_(token_ids, non_blocking=True)
        self.positions[:n * q].copy_(positions, non_blocking=True)
        self.starts[:bucket].copy_(pinned(list(starts) + [0] * (bucket - n), self.starts.device), non_blocking=True)
        if custom_mask is not None:
            self.custom_mask[:n].copy_(custom_mask)
        out, logits = self._calls[bucket].replay()
        aux = out.aux_hidden_states[:n * q] if out.aux_hidden_states is not None else None
        return ModelOutput(out.hidden_states[:n * q], aux), logits[:n * q]
