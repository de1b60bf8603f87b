"""Running a drafter over prefill rows of its own paged KV (shared block tables with the target)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from outpace.attention import build_paged_metadata, forward_context
from outpace.host_copies import to_device
from outpace.host_repeat import run_positions
from outpace.speculative.proposer import PrefillRows


@dataclass
class PrefillExtension:
    """The prefill rows a drafter extends its KV over now: each request's first ``counts[i] - keep[i]``
    rows of its chunk."""

    rows: torch.Tensor  # [m] int64 index of each into the prefill's rows
    positions: torch.Tensor  # [m] int64 its position (= its KV row)
    metadata: object

    def context(self, backend):
        return forward_context(self.metadata, backend)


def prefill_extension(
    prefill: PrefillRows, keep: list[int], block_size: int
) -> PrefillExtension | None:
    """The rows of ``prefill`` but each request's last ``keep[i]``; None when that leaves none."""
    take = [i for i, (c, k) in enumerate(zip(prefill.counts, keep)) if c > k]
    if not take:
        return None
    device = prefill.next_token_ids.device
    offsets = list(itertools.accumulate(prefill.counts, initial=0))  # each chunk's first row
    counts = [prefill.counts[i] - keep[i] for i in take]
    starts = [prefill.starts[i] for i in take]
    # [2, sum(counts)]: each row's place in the prefill's rows and its position, in one copy
    rows, positions = to_device(
        torch.stack(
            [run_positions(counts, [offsets[i] for i in take]), run_positions(counts, starts)]
        ),
        device,
    )
    meta = build_paged_metadata(
        [prefill.tables[i] for i in take], starts, counts, block_size, device
    )
    return PrefillExtension(rows, positions, meta)
