"""Attention: the per-forward metadata, the forward context, and interchangeable backends."""

from outpace.attention.context import ForwardContext, forward_context, get_forward_context
from outpace.attention.metadata import (
    DenseCausalMetadata,
    PagedAttentionMetadata,
    build_paged_metadata,
)
from outpace.attention.uniform_metadata import uniform_paged_metadata

__all__ = [
    "DenseCausalMetadata",
    "ForwardContext",
    "PagedAttentionMetadata",
    "build_paged_metadata",
    "forward_context",
    "get_forward_context",
    "uniform_paged_metadata",
]
