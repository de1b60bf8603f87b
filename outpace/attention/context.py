"""The forward context: attention metadata, backend and per-forward settings travel here, not
through every signature, so a model's forward stays ``model(input_ids, positions)`` (the nano-vllm
habit).

Per-forward settings: ``batch_invariant`` (deterministic mode, EngineConfig.batch_invariant): every
projection and attention kernel on CUDA takes its batch-invariant variant, whose result for a row
does not depend on how many rows share the call. A context that does not set it inherits it from the
one around it (the engine opens ``forward_settings`` around each step), so drafters' forwards inside
a step follow the engine's setting without passing it along.

``recurrent``: for models with recurrent layers (layers/recurrent.py), which state row each sequence
reads and what the forward keeps; the engine sets it on the forwards of the target it serves (prefill
chunks, verify), None elsewhere (each sequence then starts from a zero state and nothing is kept)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from outpace.attention.backend import AttentionBackend
from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata

if TYPE_CHECKING:
    from outpace.layers.recurrent import RecurrentMetadata


@dataclass
class ForwardContext:
    metadata: (
        PagedAttentionMetadata | DenseCausalMetadata | None
    )  # None: settings only, no forward yet
    backend: AttentionBackend
    batch_invariant: bool = False
    recurrent: RecurrentMetadata | None = None


_current: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _current is None or _current.metadata is None:
        raise RuntimeError("attention ran outside a forward_context(...) block")
    return _current


def batch_invariant() -> bool:
    """Whether the current forward runs in batch-invariant (deterministic) mode."""
    return _current is not None and _current.batch_invariant


def invariant_launch_options() -> dict:
    """A Triton launch's options in batch-invariant mode: no floating-point contraction, so that a kernel compiled
    in several variants (a run length, a row count) rounds each operation as written in every one of them."""
    return {"enable_fp_fusion": False} if batch_invariant() else {}


@contextlib.contextmanager
def forward_context(
    metadata,
    backend: AttentionBackend | None = None,
    batch_invariant: bool | None = None,
    recurrent: RecurrentMetadata | None = None,
) -> Iterator[ForwardContext]:
    """``batch_invariant`` None: as the enclosing context (off outside any); ``recurrent`` is never
    inherited (a drafter's forward inside a step is not the target's)."""
    global _current
    from outpace.attention.registry import get_backend

    previous = _current
    if batch_invariant is None:
        batch_invariant = previous is not None and previous.batch_invariant
    _current = ForwardContext(metadata, backend or get_backend("torch"), batch_invariant, recurrent)
    try:
        yield _current
    finally:
        _current = previous


def forward_settings(batch_invariant: bool) -> contextlib.AbstractContextManager[ForwardContext]:
    """Settings for every forward opened inside (an engine step), before any metadata exists."""
    return forward_context(None, None, batch_invariant)
