"""Runs one forward over a scheduled batch and samples the next tokens.

Host work per step: build the flat input tensors and attention metadata once; device work:
one forward, logits only for rows that need them, sampling; one host sync (``tolist``) to hand
the sampled ids back to the engine. On CUDA, with graphs captured (``capture_graphs``), a batch of
decoding requests replays the captured forward of its batch bucket instead (cuda_graphs.py).

Run-ahead (``enable_run_ahead``): for a greedy batch of decoding requests, the runner launches the
next step (same requests, each fed its token from the device) right after the current one, before
the host reads the current tokens; while the GPU runs it, the engine appends the tokens, checks stop
conditions and schedules. If the next step's batch is that same batch, its results are already on
the way; otherwise the step run ahead is dropped (its KV rows are rewritten before anything reads
them). Every token still comes from a forward over exactly the tokens the host holds: lossless.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.registry import get_backend
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.engine.cuda_graphs import CapturedTargetForward, GraphBlockTables, bucket_for, pinned
from outpace.engine.run_ahead import HostCopy, reserve_rows
from outpace.engine.scheduler import ScheduledRequest, StepResult
from outpace.layers.sampler import SamplingTensors, is_greedy, sample
from outpace.request import SAMPLE, request_keys


@dataclass
class _DecodeLaunch:
    """A greedy captured decode step in flight."""
    request_ids: tuple[str, ...]
    starts: tuple[int, ...]         # each request's position of its input token
    tokens: torch.Tensor            # [n] int64 on the device: the greedy next tokens
    copy: HostCopy                  # the same tokens, on their way to the host


class ModelRunner:
    def __init__(self, model: nn.Module, pool: BlockPool, kv_dtype: torch.dtype, device: str,
                 attention_backend: str = "torch") -> None:
        self.model = model
        self.pool = pool
        self.device = torch.device(device)
        self.backend = get_backend(attention_backend)
        # NOTE: only the decoder stack: MTP layers belong to the MTP proposer, which binds their KV.
        self.kv_caches = bind_kv_cache(model.model, pool, kv_dtype, device)
        self.graph_buckets: tuple[int, ...] = ()
        self.graph_tables: GraphBlockTables | None = None
        self.graph_memory = None
        self._captured: dict[tuple[int, bool], CapturedTargetForward] = {}
        self.run_ahead_limit: int | None = None  # max_model_len when run-ahead is on
        self._ahead: _DecodeLaunch | None = None

    # ---- CUDA graphs ---------------------------------------------------------------------------
    def enable_graphs(self, buckets: tuple[int, ...], max_blocks: int) -> None:
        """Prepare graph capture for batches of up to max(buckets) sequences of up to ``max_blocks`` blocks."""
        self.graph_buckets = buckets
        self.graph_tables = GraphBlockTables(self.pool, max(buckets), max_blocks, self.device)
        self.graph_memory = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None

    def capture_target(self, query_len: int, tree: bool = False) -> None:
        """Capture the target forward over ``query_len`` tokens per sequence for every bucket."""
        self._captured[query_len, tree] = CapturedTargetForward(
            self.model, self.backend, self.graph_tables, self.graph_buckets, query_len, tree, self.graph_memory)

    def enable_run_ahead(self, max_model_len: int) -> None:
        """Run greedy decode steps ahead (module docstring); positions stay below ``max_model_len``."""
        self.run_ahead_limit = max_model_len

    def captured(self, num_seqs: int, query_len: int, tree: bool = False) -> CapturedTargetForward | None:
        """The captured forward for this shape, or None when the batch must run eagerly."""
        if bucket_for(self.graph_buckets, num_seqs) is None:
            return None
        return self._captured.get((query_len, tree))

    def forward(self, token_ids: list[list[int]], positions: list[list[int]], batch: list[ScheduledRequest]):
        """Forward the given new tokens of each scheduled request; returns the model output."""
        meta = build_paged_metadata(
            [self.pool.table(s.request.request_id) for s in batch],
            [s.request.num_computed_tokens for s in batch],
            [len(t) for t in token_ids], self.pool.block_size, self.device)
        ids = torch.tensor([t for seq in token_ids for t in seq], dtype=torch.int64).to(self.device)
        pos = torch.tensor([p for seq in positions for p in seq], dtype=torch.int64).to(self.device)
        with torch.inference_mode(), forward_context(meta, self.backend):
            return self.model(ids, pos)

    def execute(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        """Forward every scheduled chunk; sample a token for each request whose chunk completes its
        sequence (none for the others, still in chunked prefill)."""
        graph = self.captured(len(batch), 1)
        if graph is not None and all(s.num_new_tokens == 1 and s.completes_sequence for s in batch):
            return self._execute_decode(graph, batch)
        self._take_ahead((), ())
        token_ids, positions = [], []
        for s in batch:
            start = s.request.num_computed_tokens
            token_ids.append(s.request.token_ids[start:start + s.num_new_tokens])
            positions.append(list(range(start, start + s.num_new_tokens)))
        out = self.forward(token_ids, positions, batch)
        ends = torch.tensor([len(t) for t in token_ids]).cumsum(0) - 1
        needs = [i for i, s in enumerate(batch) if s.completes_sequence]
        results = [StepResult([], s.num_new_tokens) for s in batch]
        if not needs:
            return results
        with torch.inference_mode():
            logits = self.model.compute_logits(out.hidden_states[ends[needs].to(self.device)])  # [n, vocab]
            tokens = self._sample(logits, [batch[i].request for i in needs])
        for i, t in zip(needs, tokens):
            results[i].new_token_ids.append(t)
        return results

    def _execute_decode(self, graph: CapturedTargetForward, batch: list[ScheduledRequest]) -> list[StepResult]:
        """One token per request through the captured forward of the batch's bucket."""
        reqs = [s.request for s in batch]
        ids, starts = tuple(r.request_id for r in reqs), tuple(r.num_computed_tokens for r in reqs)
        launch = self._take_ahead(ids, starts)
        greedy = all(is_greedy(r.params) for r in reqs)
        with torch.inference_mode():
            if launch is None and not greedy:
                _, logits = graph.run(ids, starts, pinned([r.token_ids[-1] for r in reqs], self.device),
                                      pinned(starts, self.device))
                return [StepResult([t], 1) for t in self._sample(logits, reqs)]
            if launch is None:
                launch = self._launch_greedy(graph, ids, starts, pinned([r.token_ids[-1] for r in reqs], self.device))
            if greedy and self._may_run_ahead(reqs):
                self._ahead = self._launch_greedy(graph, ids, tuple(p + 1 for p in starts), launch.tokens)
        return [StepResult([t], 1) for t in launch.copy.tolist()]

    def _take_ahead(self, ids: tuple[str, ...], starts: tuple[int, ...]) -> _DecodeLaunch | None:
        """The step run ahead if it is this step; any other is dropped, once it has finished reading the
        block tables (their rows may change owner now)."""
        launch, self._ahead = self._ahead, None
        if launch is not None and (launch.request_ids, launch.starts) != (ids, starts):
            launch.copy.wait()
            return None
        return launch

    def _launch_greedy(self, graph: CapturedTargetForward, ids: tuple[str, ...], starts: tuple[int, ...],
                       tokens: torch.Tensor) -> _DecodeLaunch:
        """Replay the decode graph over ``tokens`` [n] (device or pinned host) at positions ``starts``."""
        _, logits = graph.run(ids, starts, tokens, pinned(list(starts), self.device))
        next_tokens = logits.argmax(dim=-1)                                             # [n]
        return _DecodeLaunch(ids, starts, next_tokens, HostCopy(next_tokens))

    def _may_run_ahead(self, reqs: list) -> bool:
        """Whether to launch the step after this one now (run_ahead.reserve_rows: its rows reserved)."""
        if self.run_ahead_limit is None:
            return False
        rows = [r.num_computed_tokens + 2 for r in reqs]  # through the next step's input token
        return reserve_rows(self.pool, reqs, rows, min(self.run_ahead_limit, self.graph_tables.max_rows))

    def _sample(self, logits: torch.Tensor, reqs: list) -> list[int]:
        if all(is_greedy(r.params) for r in reqs):  # no sampling tensors to build and upload
            return logits.argmax(dim=-1).tolist()
        tensors = SamplingTensors.from_params([r.params for r in reqs], self.device)
        return sample(logits, tensors, request_keys(reqs, [r.num_tokens for r in reqs], SAMPLE, self.device)).tolist()
