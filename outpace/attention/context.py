"""The forward context: attention metadata and backend travel here, not through every signature,
so a model's forward stays ``model(input_ids, positions)`` (the nano-vllm habit)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from outpace.attention.backend import AttentionBackend
from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata


@dataclass
class ForwardContext:
    metadata: PagedAttentionMetadata | DenseCausalMetadata
    backend: AttentionBackend


_current: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("attention ran outside a forward_context(...) block")
    return _current


@contextlib.contextmanager
def forward_context(metadata, backend: AttentionBackend | None = None) -> Iterator[ForwardContext]:
    global _current
    from outpace.attention.registry import get_backend

    previous = _current
    _current = ForwardContext(metadata, backend or get_backend("torch"))
    try:
        yield _current
    finally:
        _current = previous
