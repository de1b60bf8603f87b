"""One request's prefill chunk as a captured forward, padded to a token bucket.

An eager prefill forward of the 8B shape spends about 20 ms launching kernels for about 7 ms of GPU
work (benchmarks/diag_prefill.py). At low load each request is prefilled alone, so that launch time is
most of what a request costs beyond its decode steps, and the time to its first token. A step whose
prefill part is one chunk of ``c`` tokens (a new prompt, or after a prefix-cache hit its uncached
suffix) replays instead the forward captured for the smallest bucket ``P >= c``: the chunk's tokens and
``P - c`` padding tokens at KV rows start .. start + P - 1, causal, so no real row sees a padding row.
The padding rows' KV lands past the request's last row: in its own partly filled block (rows that the
next chunk or decode step rewrites before anything reads them) or, past its table, in the pool's
padding block. Only the forward is captured: sampling the first token and the drafter's ``absorb``
read the first ``c`` rows of its outputs as they read an eager forward's.

Models with recurrent layers are left out: padding tokens would advance a request's recurrent state.
Multi-head latent attention switches to its expanded form, which gathers each sequence's whole block
table, from some query-run length on (layers/mla.py): a captured chunk's table is the slot's full width,
so the buckets stop below that length and longer chunks prefill eagerly, over their own blocks.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from outpace.attention import forward_context
from outpace.attention.uniform_metadata import uniform_paged_metadata
from outpace.engine.cuda_graphs import CapturedCall, bucket_for
from outpace.engine.slots import RequestSlots
from outpace.layers.mla import MultiHeadLatentAttention
from outpace.speculative.proposer import positions

SMALLEST_PREFILL_BUCKET = 16    # the attention kernel's smallest tile: fewer rows cost the same
LARGEST_PREFILL_BUCKET = 512    # longer chunks amortize an eager forward's launches


def prefill_buckets(max_batched_tokens: int) -> tuple[int, ...]:
    """The captured chunk sizes: powers of two within both bounds and the step's token budget."""
    sizes, size = [], SMALLEST_PREFILL_BUCKET
    while size <= min(LARGEST_PREFILL_BUCKET, max_batched_tokens):
        sizes.append(size)
        size *= 2
    return tuple(sizes)


class PrefillGraphs:
    def __init__(self, model: nn.Module, backend, slots: RequestSlots, max_rows: int, recurrent: bool) -> None:
        """``max_rows``: the positions the model and a slot's table allow (a padded chunk stays below);
        ``recurrent``: the model has recurrent layers (then nothing is captured)."""
        self.model, self.backend, self.slots, self.max_rows = model, backend, slots, max_rows
        self.recurrent = recurrent
        self.buckets: tuple[int, ...] = ()
        self._graphs: dict[int, CapturedCall] = {}
        device = slots.device
        # static inputs, written before each replay
        self.token_ids = torch.zeros(LARGEST_PREFILL_BUCKET, dtype=torch.int64, device=device)  # [P] (stale past c)
        self.start = torch.zeros(1, dtype=torch.int64, device=device)                          # [1] first row
        self.slot = torch.zeros(1, dtype=torch.int64, device=device)                           # [1] the request's slot

    def capture(self, buckets: tuple[int, ...], memory_pool=None) -> None:
        """Capture the forward for every bucket that fits the context and stays below an MLA layer's expanded
        form, none for a recurrent model (on CUDA; elsewhere a replay runs it eagerly). The slot is the padding
        slot meanwhile: its table points at the padding block."""
        self.slot.fill_(self.slots.padding_slot)
        self.start.zero_()
        expands = min((m.expand_min_query_len for m in self.model.modules()
                       if isinstance(m, MultiHeadLatentAttention)), default=math.inf)
        fits = min(LARGEST_PREFILL_BUCKET, self.max_rows)
        self.buckets = () if self.recurrent else tuple(b for b in sorted(buckets) if b <= fits and b < expands)
        self._graphs = {size: CapturedCall(lambda size=size: self._forward(size), self.slots.device, memory_pool)
                        for size in self.buckets}

    def bucket(self, count: int, start: int) -> int | None:
        """The bucket a chunk of ``count`` rows from row ``start`` replays, or None (run it eagerly)."""
        size = bucket_for(self.buckets, count)
        return size if size is not None and start + size <= self.max_rows else None

    def run(self, size: int, slot: int, start: int, token_ids: torch.Tensor):
        """The forward of a chunk (``token_ids`` [c] on the device, c <= ``size``) of the request in
        ``slot`` from KV row ``start``: outputs [c, ...], views of the graph's (valid until its next replay).
        The slot's table must be on the device (``RequestSlots.sync_tables``)."""
        c = token_ids.shape[0]
        self.token_ids[:c].copy_(token_ids)
        self.start.fill_(start)
        self.slot.fill_(slot)
        out = self._graphs[size].replay()
        aux = out.aux_hidden_states
        return dataclasses.replace(out, hidden_states=out.hidden_states[:c],
                                   aux_hidden_states=None if aux is None else aux[:c])

    def _forward(self, size: int):
        """``size`` tokens at rows start .. start + size - 1 of the slot's request (static buffers only)."""
        tables = self.slots.tables.index_select(0, self.slot)                               # [1, max_blocks]
        meta = uniform_paged_metadata(tables, self.start, size, self.slots.pool.block_size)
        with torch.inference_mode(), forward_context(meta, self.backend):
            return self.model(self.token_ids[:size], positions(self.start, size))
