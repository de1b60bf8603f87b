"""The tree commit's row move (cache/kv_cache.py ``CacheRows``): the Triton kernel (in the interpreter
here, on the GPU in tests/gpu/test_gpu.py's runs) and the torch path both give what moving the accepted
nodes' rows one column at a time gives, for KV pairs and for MLA's two views of one row."""

from __future__ import annotations

import pytest
import torch

from outpace.cache.kv_cache import CacheRows

BLOCK = 4
DEVICE = (
    "cuda" if torch.cuda.is_available() else "cpu"
)  # the kernel compiled on a GPU, else interpreted


def _caches(num_blocks: int, device: str) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    k, v = (
        torch.randn(num_blocks, BLOCK, 2, 6, generator=g).to(device) for _ in range(2)
    )  # an attention layer
    rows = torch.randn(num_blocks, BLOCK, 1, 10, generator=g).to(device)  # an MLA layer's rows
    return [(k, v), (rows[..., :7], rows[..., 7:])]


def _accepted_paths(b: int, width: int, num_nodes: int) -> torch.Tensor:
    """[b, width] strictly increasing node indices from node 0, then -1 (as tree verification gives)."""
    g = torch.Generator().manual_seed(1)
    paths = torch.full((b, width), -1, dtype=torch.int64)
    for r in range(b):
        depth = int(torch.randint(0, width, (1,), generator=g))
        nodes = torch.randperm(num_nodes - 1, generator=g)[:depth].sort().values + 1
        paths[r, 0] = 0
        paths[r, 1 : depth + 1] = nodes
    return paths


def _flat_rows(tables: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return tables.gather(1, rows // BLOCK) * BLOCK + rows % BLOCK


@pytest.mark.parametrize("fused", [False, True])
def test_rows_move_as_a_column_by_column_copy(fused):
    if fused:
        pytest.importorskip("triton")
    b, width, num_nodes = 5, 4, 9
    device = DEVICE if fused else "cpu"
    caches = _caches(4 * b, device)
    tables = torch.randperm(4 * b).view(b, 4)  # each request's blocks, scattered
    lengths = torch.tensor([0, 3, 5, 2, 7])
    path = _accepted_paths(b, width, num_nodes)
    order = torch.arange(width).expand(b, -1)
    src = _flat_rows(tables, lengths[:, None] + torch.where(path >= 0, path, order))
    dst = _flat_rows(tables, lengths[:, None] + order)
    expected = [[t.cpu().clone() for t in layer] for layer in caches]
    for layer in expected:
        for t in layer:
            flat = t.view(-1, *t.shape[2:])
            for r in range(b):
                for i in range(1, width):
                    flat[dst[r, i]] = flat[src[r, i]].clone()
    CacheRows(caches, fused=fused).move(src.to(device), dst.to(device))
    assert (path[:, 1] >= 0).any() and (path[:, 1:] < 0).any()  # some rows move, some stay
    for layer, want in zip(caches, expected):
        for t, w in zip(layer, want):
            assert torch.equal(t.cpu(), w)
