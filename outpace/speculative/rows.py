"""Running a drafter over rows of its own paged KV (shared block tables with the target)."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.backend import AttentionBackend
from outpace.cache.block_pool import BlockPool
from outpace.request import Request


@contextlib.contextmanager
def draft_rows(pool: BlockPool, backend: AttentionBackend, requests: Sequence[Request], starts: Sequence[int],
               counts: Sequence[int], device: torch.device, custom_masks=None) -> Iterator[None]:
    """A forward context in which request i's new rows are KV rows starts[i] .. starts[i] + counts[i] - 1."""
    meta = build_paged_metadata([pool.table(r.request_id) for r in requests], starts, counts, pool.block_size,
                                device, custom_masks)
    with forward_context(meta, backend):
        yield


def row_positions(starts: Sequence[int], counts: Sequence[int], device: torch.device) -> torch.Tensor:
    """[sum(counts)] int64: each request's rows at their own positions, concatenated."""
    return torch.cat([torch.arange(s, s + c) for s, c in zip(starts, counts)]).to(device)
