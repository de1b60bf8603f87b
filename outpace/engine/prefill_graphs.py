"""A step's prefill chunks as one captured forward, each chunk padded to a token bucket.

An eager prefill forward of the 8B shape spends about 20 ms launching kernels for about 7 ms of GPU
work (benchmarks/scripts/diag_prefill.py). At low load each request is prefilled alone, so that launch time is
most of what a request costs beyond its decode steps, and the time to its first token; under a server's
load a few short prompts (or their uncached suffixes) join at most steps, beside the decoding batch
(benchmarks/scripts/diag_closed_loop.py). A step whose prefill part is ``n`` chunks of ``c_i`` tokens replays
instead the forward captured for the smallest key ``(K, P)`` with ``K >= n`` chunks and ``P >= max c_i``
tokens a chunk (``K * P`` at most the largest bucket, or P at most ``SHORT_CHUNK``): chunk i's tokens and
``P - c_i`` padding tokens at KV rows start_i .. start_i + P - 1, causal, so no real row sees a padding row;
chunks n .. K - 1 are the padding row's. The padding rows' KV lands past each request's last row: in its own
partly filled block (rows that the next chunk or decode step rewrites before anything reads them) or, past its
table, in the pool's padding block. Sampling the first tokens reads the real rows of the forward's outputs, gathered in the
order an eager forward gives them.

A drafter that runs layers of its own over the prompt (``captures_absorb``: MTP layers, EAGLE3's, a standalone
draft without recurrent layers or MLA, DFlash's context rows) has them captured for the same keys, over static
copies of the prompt's tokens, the tokens after them and the target's rows it reads. They replay after the
sampling (a row may read the sampled token) where the forward replayed a key and no chunk reads rows that its
request's previous chunk left pending (``Proposer.absorbs_captured``: a chain of MTP layers leaves some only
before a final chunk of at most K tokens). Each chunk's next tokens fill a row of P + ``absorb_reach``, the tokens
its MTP layers read past the chunk last. Other chunks, like other drafters', are absorbed eagerly. An eager
absorb of DeepSeek's two MTP layers took 18.4 ms of host time for a prompt whose captured forward took 1.6 (H100,
benchmarks/results/gpu_2026-12-05f call 18); captured, the MTP engine's prefill step took 18.0 ms against 36.4,
plain decoding's 20.5 (gpu_2026-12-05g call 19). On the Llama-3.1-8B shape (benchmarks/results/e2e, H100, eager
absorbs) a request cost 5 ms beyond its steady steps with plain decoding, 14 ms with EAGLE3 and 29 ms with a
standalone draft.

Models with recurrent layers (Qwen3-Next, Qwen3.5, Nemotron-H) replay their chunks too: the recurrent layers take
each padded chunk's real length (``RecurrentMetadata.run_lens``), so its padding tokens leave the request's state
as it is, whatever their rows hold. Below the chunked scans' length (layers/chunked_scans.py ``CHUNKED_MIN_LEN``)
the per-token scans and the step kernels keep the state at invalid tokens; from it on, flash-linear-attention's
chunked kernels run in their batched form (one run a chunk, no ``cu_seqlens``: nothing read back to the host),
where an invalid token decays by exp(0) and adds nothing. The step kernels write no padding row, so their output
starts at zeros there: the layers after them read finite rows (NaN left in the graph's memory had made a padding
token's update 0 * NaN, Qwen3-Next's state NaN and its tokens 0; benchmarks/results/gpu_2026-12-06). On the
widened Qwen3.5 (H100, gpu_2026-12-05e call 15) a request cost 63 ms beyond its steady steps when every hybrid
prefill ran eagerly.

Multi-head latent attention switches to its expanded form, which gathers each sequence's whole block
table, from some query-run length on (layers/mla.py): a captured chunk's table is the row's full width,
so the buckets stop below that length and longer chunks prefill eagerly, over their own blocks.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from outpace.attention import forward_context
from outpace.attention.uniform_metadata import uniform_paged_metadata
from outpace.cache.recurrent_states import RecurrentStates
from outpace.engine.cuda_graphs import CapturedCall, bucket_for
from outpace.engine.request_table import RequestTable
from outpace.layers.mla import MultiHeadLatentAttention
from outpace.speculative.proposer import PrefillRows, Proposer

SMALLEST_PREFILL_BUCKET = 16  # the attention kernel's smallest tile: fewer rows cost the same
LARGEST_PREFILL_BUCKET = (
    512  # tokens a key holds: longer prefills amortize an eager forward's launches
)
# chunks a key holds, up to the engine's requests (``_keys``). Past 8 chunks: many requests whose prompts the prefix
# cache mostly holds (a shared system prompt) prefill a few tokens each; eagerly, a step of 32 such chunks took 22 to
# 52 ms on an H100 where 8 of them replayed in 8.3 (widened Llama, closed_batch_rounds.py: gpu_2026-12-06g)
CHUNK_BUCKETS = (1, 2, 4, 8, 16, 32)
# Chunks of at most this many tokens fill keys of every chunk count, past LARGEST_PREFILL_BUCKET: a cached prompt
# leaves a request under a block plus the tokens its drafter reads past a block (the prefix cache's ``reads_ahead``).
# With MTP's, the widened Llama's requests kept up to 26 tokens, and a step of 32 of them ran eagerly in 29.9 ms where
# EAGLE3's replayed in 14.3 (H100, gpu_2026-12-06h call 9).
SHORT_CHUNK = 32
# the static inputs' rows
MOST_KEY_TOKENS = max(LARGEST_PREFILL_BUCKET, CHUNK_BUCKETS[-1] * SHORT_CHUNK)
# A drafter whose rows read r >= 2 tokens past a block (MTP's layers: cache/prefix_cache.py) leaves a request whose
# prompt ends 1 .. r - 1 tokens past a block boundary that block too to compute (its key reads tokens not yet known):
# a chunk of 17 .. 16 + r - 1 tokens, where a repeated prompt otherwise leaves at most 16. One such request among 32
# puts every chunk of the step in a key of 32 tokens: on an H100 the widened Llama's MTP (3 layers) prefilled 32
# repeated prompts in 25.5 ms against plain decoding's 13.3 (its row-wise kernels, SiLU-and-mul and attention, took
# 1.9x plain decoding's time: twice the padded rows), the widened DeepSeek's (2 layers) in 37.6 against 24.4
# (benchmarks/results/gpu_2026-12-06i; on the CPU's tiny widening 310 tokens computed against 230). Such a drafter's
# keys also take chunks of 16 + r - 1 tokens rounded up to a multiple of this (not yet timed on a GPU).
READS_AHEAD_ROUNDING = 4


def prefill_buckets(max_batched_tokens: int) -> tuple[int, ...]:
    """The captured chunk sizes: powers of two within both bounds and the step's token budget."""
    sizes, size = [], SMALLEST_PREFILL_BUCKET
    while size <= min(LARGEST_PREFILL_BUCKET, max_batched_tokens):
        sizes.append(size)
        size *= 2
    return tuple(sizes)


PrefillKey = tuple[int, int]  # (K chunks, P tokens a chunk)


class PrefillGraphs:
    def __init__(
        self,
        model: nn.Module,
        backend,
        req_table: RequestTable,
        max_rows: int,
        states: RecurrentStates,
        drafter: Proposer | None = None,
    ) -> None:
        """``max_rows``: the positions the model and a row's table allow (a padded chunk stays below);
        ``states``: the model's recurrent states (module docstring); ``drafter``: its absorb's layers are
        captured where it ``captures_absorb``."""
        self.model, self.backend, self.req_table, self.max_rows = (
            model,
            backend,
            req_table,
            max_rows,
        )
        self.states = states
        self.buckets: tuple[int, ...] = ()  # P: tokens a chunk, of the captured forwards
        self.graphs: dict[PrefillKey, CapturedCall] = {}
        self.drafter = drafter if drafter is not None and drafter.captures_absorb else None
        self.reads_ahead = drafter.kv_reads_ahead if drafter is not None else 0
        self.absorbs: dict[PrefillKey, CapturedCall] = {}
        device, k = req_table.device, CHUNK_BUCKETS[-1]
        # the most chunks a step may have: one a request
        self.max_chunks = req_table.padding_index
        # static inputs, written before each replay
        self.token_ids = torch.zeros(
            MOST_KEY_TOKENS, dtype=torch.int64, device=device
        )  # [K * P] (stale pads)
        self.starts = torch.zeros(k, dtype=torch.int64, device=device)  # [K] first rows
        self.req_indices = torch.full(
            (k,), req_table.padding_index, dtype=torch.int64, device=device
        )  # [K] their indices
        self.lens = torch.zeros(k, dtype=torch.int64, device=device)  # [K] their real tokens
        self.target_rows: torch.Tensor | None = (
            None  # [K * P, width] what the drafter reads (stale pads)
        )
        if self.drafter is not None:
            self.target_rows = self.drafter.absorb_buffer(MOST_KEY_TOKENS)
            self.next_ids = torch.zeros(
                MOST_KEY_TOKENS + k * self.drafter.absorb_reach,
                dtype=torch.int64,
                device=device,
            )  # [K * (P + reach)] each chunk's token after each row, then its tokens ahead (stale pads)

    def capture(self, buckets: tuple[int, ...], memory_pool=None) -> None:
        """Capture the forward for every key whose chunk size fits the context and stays below an MLA layer's
        expanded form, and the drafter's absorb for every such key (on CUDA; elsewhere a replay runs it
        eagerly). The chunks are the padding row's meanwhile: its table points at the padding block."""
        self.req_indices.fill_(self.req_table.padding_index)
        self.starts.zero_()
        expands = min(
            (
                m.expand_min_query_len
                for m in self.model.modules()
                if isinstance(m, MultiHeadLatentAttention)
            ),
            default=math.inf,
        )
        fits = min(LARGEST_PREFILL_BUCKET, self.max_rows)
        sizes = set(buckets)
        if buckets and self.reads_ahead >= 2:  # (READS_AHEAD_ROUNDING)
            longest = SMALLEST_PREFILL_BUCKET + self.reads_ahead - 1
            sizes.add(-(-longest // READS_AHEAD_ROUNDING) * READS_AHEAD_ROUNDING)
        self.buckets = tuple(b for b in sorted(sizes) if b <= fits and b < expands)
        device = self.req_table.device
        self.graphs = {
            key: CapturedCall(lambda key=key: self._forward(*key), device, memory_pool)
            for key in _keys(self.buckets, self.max_chunks)
        }
        self.absorbs = {
            key: CapturedCall(lambda key=key: self._absorb(*key), device, memory_pool)
            for key in (_keys(self.buckets, self.max_chunks) if self.drafter is not None else ())
        }

    def bucket(self, counts: list[int], starts: list[int]) -> PrefillKey | None:
        """The smallest key holding chunks of ``counts`` rows from rows ``starts`` within the context, which they
        replay, or None (run them eagerly)."""
        key = (
            bucket_for(CHUNK_BUCKETS, len(counts)),
            bucket_for(self.buckets, max(counts)),
        )  # (None: no bucket)
        return key if key in self.graphs and max(starts) + key[1] <= self.max_rows else None

    def absorbs_after(self, key: PrefillKey | None, prefill: PrefillRows) -> bool:
        """Whether the drafter's captured layers absorb the chunks whose forward replayed ``key`` (None: it ran
        eagerly): where the drafter ``absorbs_captured`` them."""
        return key in self.absorbs and self.drafter.absorbs_captured(prefill)

    def run(
        self,
        key: PrefillKey,
        req_indices: list[int],
        starts: list[int],
        counts: list[int],
        token_ids: torch.Tensor,
    ):
        """The forward of the chunks (``token_ids`` [sum(counts)] on the device, chunk i's ``counts[i]`` tokens
        of the request in ``req_indices[i]`` from KV row ``starts[i]``): outputs [sum(counts), ...] in that order.
        The indices' tables must be on the device (``RequestTable.sync_tables``)."""
        rows = self._place(key, req_indices, starts, counts, token_ids)
        out = self.graphs[key].replay()
        aux = out.aux_hidden_states
        return dataclasses.replace(
            out,
            hidden_states=out.hidden_states.index_select(0, rows),
            aux_hidden_states=None if aux is None else aux.index_select(0, rows),
        )

    def absorb(
        self,
        key: PrefillKey,
        req_indices: list[int],
        starts: list[int],
        counts: list[int],
        token_ids: torch.Tensor,
        next_ids: torch.Tensor,
        ahead_ids: torch.Tensor,
        target_rows: torch.Tensor | None,
    ) -> None:
        """The drafter's captured layers over the chunks (as ``run``'s; on the device: ``token_ids`` and
        ``next_ids`` [sum(counts)] each row's token and the one after it, ``ahead_ids`` [chunks, reach] the
        tokens after each chunk's last next one, ``target_rows`` [sum(counts), width] the target's rows it
        reads, or None)."""
        rows = self._place(key, req_indices, starts, counts, token_ids)
        wide, reach = key[1] + self.drafter.absorb_reach, self.drafter.absorb_reach
        at = [i * wide + j for i, c in enumerate(counts) for j in range(c)]
        ahead = [i * wide + c + j for i, c in enumerate(counts) for j in range(reach)]
        at = torch.tensor(at + ahead).to(self.next_ids.device, non_blocking=True)
        self.next_ids.index_copy_(0, at, torch.cat([next_ids, ahead_ids.flatten()]))
        if target_rows is not None:
            self.target_rows.index_copy_(0, rows, target_rows)
        self.absorbs[key].replay()

    def _place(
        self,
        key: PrefillKey,
        req_indices: list[int],
        starts: list[int],
        counts: list[int],
        token_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Write the chunks (``run``'s arguments: the padding row's past them) into the static inputs; returns
        [sum(counts)] each real token's row of the padded forward."""
        chunks, size = key
        pads = chunks - len(counts)
        self.starts[:chunks].copy_(torch.tensor(starts + [0] * pads), non_blocking=True)
        self.lens[:chunks].copy_(torch.tensor(counts + [size] * pads), non_blocking=True)
        self.req_indices[:chunks].copy_(
            torch.tensor(req_indices + [self.req_table.padding_index] * pads), non_blocking=True
        )
        rows = torch.tensor([i * size + j for i, c in enumerate(counts) for j in range(c)])
        rows = rows.to(self.token_ids.device, non_blocking=True)
        self.token_ids.index_copy_(0, rows, token_ids)
        return rows

    def _metadata(self, chunks: int, size: int):
        """Chunk i at rows starts[i] .. starts[i] + size - 1 of the request in req_indices[i] (static buffers)."""
        tables = self.req_table.tables.index_select(0, self.req_indices[:chunks])  # [K, max_blocks]
        return uniform_paged_metadata(
            tables, self.starts[:chunks], size, self.req_table.pool.block_size
        )

    def _forward(self, chunks: int, size: int):
        """``chunks`` chunks of ``size`` tokens (``_metadata``), static buffers only."""
        meta = self._metadata(chunks, size)
        recurrent = self.states.padded_prefill(
            self.req_indices[:chunks], self.starts[:chunks], self.lens[:chunks]
        )
        with torch.inference_mode(), forward_context(meta, self.backend, recurrent=recurrent):
            return self.model(self.token_ids[: chunks * size], meta.token_positions)

    def _absorb(self, chunks: int, size: int) -> None:
        """The drafter's layers over ``chunks`` chunks of ``size`` rows (``_metadata``), static buffers only."""
        n, wide = chunks * size, size + self.drafter.absorb_reach
        with torch.inference_mode():
            self.drafter.absorb_layers(
                self._metadata(chunks, size),
                self.token_ids[:n],
                self.next_ids[: chunks * wide].view(chunks, wide),
                None if self.target_rows is None else self.target_rows[:n],
            )


def key_tokens(sizes: tuple[int, ...], max_chunks: int) -> int:
    """The most tokens a captured key's forward takes (chunks times tokens a chunk) for chunk ``sizes`` and an engine
    of ``max_chunks`` requests (0: none)."""
    return max((k * p for k, p in _keys(sizes, max_chunks)), default=0)


def _keys(sizes: tuple[int, ...], max_chunks: int) -> list[PrefillKey]:
    """Every (chunks, tokens a chunk) of ``sizes`` and the chunk buckets up to the first that holds ``max_chunks``,
    within the largest bucket or of short chunks (``SHORT_CHUNK``)."""
    most = bucket_for(CHUNK_BUCKETS, max_chunks) or CHUNK_BUCKETS[-1]
    return [
        (k, p)
        for k in CHUNK_BUCKETS
        for p in sizes
        if k <= most and (k * p <= LARGEST_PREFILL_BUCKET or p <= SHORT_CHUNK)
    ]
