"""Random paged-attention inputs for the attention kernel tests: q/k/v and KV caches whose sequences sit in
random, shuffled blocks, with optional tree masks; and poisoned allocations, so that a lane a backend forgets
to write shows up."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from outpace.attention import build_paged_metadata
from outpace.attention.metadata import PagedAttentionMetadata

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tree_mask(q: int, window: int, g: torch.Generator) -> torch.Tensor:
    """[q, window] bool, as tree drafting builds it: the window holds a random tree whose last q
    nodes are the new tokens; each row sees its node and the node's ancestors."""
    seen = torch.zeros(window, window, dtype=torch.bool)
    for node in range(window):
        parent = int(torch.randint(-1, node, (1,), generator=g)) if node else -1
        if parent >= 0:
            seen[node] = seen[parent]
        seen[node, node] = True
    return seen[window - q :]


@dataclass
class Case:
    q: torch.Tensor  # [num_tokens, heads, head_dim]
    k: torch.Tensor  # [num_tokens, kv_heads, head_dim]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    meta: PagedAttentionMetadata
    scale: float


def make_case(
    cached,
    new,
    windows=None,
    *,
    block_size=16,
    head_dim=32,
    heads=8,
    kv_heads=2,
    dtype=torch.float32,
    device=DEVICE,
    seed=0,
) -> Case:
    """Random q/k/v and caches; each sequence's blocks are a random, shuffled slice of the pool
    (block 0 left as the tables' padding block)."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-(c + q) // block_size) for c, q in zip(cached, new)]
    num_blocks = sum(counts) + 3
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables, used = [], 0
    for n in counts:
        tables.append(perm[used : used + n])
        used += n
    masks = None
    if windows is not None:
        masks = [None if w is None else tree_mask(q, w, g).to(device) for q, w in zip(new, windows)]
    total = sum(new)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    return Case(
        q=randn(total, heads, head_dim),
        k=randn(total, kv_heads, head_dim),
        v=randn(total, kv_heads, head_dim),
        k_cache=randn(num_blocks, block_size, kv_heads, head_dim),
        v_cache=randn(num_blocks, block_size, kv_heads, head_dim),
        meta=build_paged_metadata(tables, cached, new, block_size, device, masks),
        scale=head_dim**-0.5,
    )


@contextlib.contextmanager
def poisoned_allocations():
    """torch.empty returns NaN-filled floats and huge integers while active."""
    real = torch.empty

    def empty(*args, **kwargs):
        x = real(*args, **kwargs)
        return x.fill_(float("nan") if x.is_floating_point() else 2**30)

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real
