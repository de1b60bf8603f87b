"""Rows that route to no expert: within ``routed_rows(mask)``, a forward over ``len(mask)`` rows routes only the
rows where ``mask`` is true, on the routing kernel (layers/moe_routing_kernel.py ``select_experts``); the others'
routed slots land in no block of the grouped experts, which skip them as they skip another expert-parallel
rank's (layers/expert_blocks.py ``BlockLayout.skips``): their experts are not read for them, and their routed
output is zero. For rows whose output nothing reads, in a mixture's MTP layer (DeepSeek-V3's, Qwen3-Next's;
speculative/drafters/mtp.py ``_rows_read``): a draft window's padding rows (it is ``HOLD_ROWS`` rows wider than a
drafting step fills, and they chose experts of their own, up to twice the live rows': 12 rows, at most 4 live
after a drafting step), the last layer's rows but each window's last (only their KV rows matter), and a prompt's
rows there. The torch path routes every row (its cost does not depend on the experts chosen)."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

_MASK: ContextVar[torch.Tensor | None] = ContextVar("routed_rows", default=None)


@contextmanager
def routed_rows(mask: torch.Tensor | None):
    """Route only the rows where ``mask`` [n] (bool) is true, in forwards over n rows (module docstring); None:
    every row, as outside any ``routed_rows``."""
    token = _MASK.set(mask)
    try:
        yield
    finally:
        _MASK.reset(token)


def routed_mask(n: int) -> torch.Tensor | None:
    """The mask of the innermost ``routed_rows`` if it is of ``n`` rows, else None (every row routes)."""
    mask = _MASK.get()
    return mask if mask is not None and mask.shape[0] == n else None
