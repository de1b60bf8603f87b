"""Sliding-window attention in both paged backends against a dense float64 reference: a query at
position p sees only the KV rows r > p - window (transformers' sliding_window_overlay), on top of
the causal or tree mask. Decode, chunked prefill (queries spanning more than the window), chain
verify, tree verify (rows whose positions are not their KV rows), ragged batches; the Triton
kernels' fast path with its split heuristic and forced splits, and the batch-invariant variant
(fixed splits, some wholly before the window), which also keeps its bit-exactness between a decode
row and the same row inside a verify. Interpreter-sized shapes on the CPU (see conftest.py)."""

from __future__ import annotations

import pytest
import torch

from helpers.attention_cases import DEVICE, Case, make_case, poisoned_allocations
from outpace.attention import build_paged_metadata
from outpace.attention.context import forward_settings
from outpace.attention.torch_backend import TorchAttentionBackend
from outpace.attention.triton_kernels import paged_attention, write_kv

# (cached rows, new tokens, tree window or None) per sequence, and the sliding window
LAYOUTS = {
    "decode": ([37, 5, 130, 16], [1, 1, 1, 1], None, 8),
    "prefill-chunks": ([0, 17, 64], [40, 25, 9], None, 7),
    "verify": ([20, 45, 7], [6, 6, 6], None, 5),
    "tree": ([30, 12, 50], [5, 8, 3], [9, 8, 7], 9),
    "ragged-tree": ([0, 33, 70], [20, 1, 6], [None, 3, 10], 24),
}


def positions_of(case: Case) -> torch.Tensor:
    """[num_tokens] each query's position: its KV row when causal; under a tree mask the window's
    first row + the node's depth (the ancestors it sees in the window, minus itself)."""
    m = case.meta
    prefix = (m.seq_lens - m.query_lens)[m.token_seq_index]
    if m.custom_mask is None:
        return prefix + m.token_query_index
    width = m.custom_mask.shape[2]
    seen = m.custom_mask[m.token_seq_index, m.token_query_index].sum(-1)  # [num_tokens]
    return m.seq_lens[m.token_seq_index] - width + seen - 1


def reference(case: Case, positions: torch.Tensor, window: int) -> torch.Tensor:
    """Dense float64 attention of every query over its sequence's KV rows: [num_tokens, heads, head_dim]."""
    m = case.meta
    k_cache, v_cache = case.k_cache.clone().double(), case.v_cache.clone().double()
    kv_heads, head_dim = k_cache.shape[2:]
    k_cache.view(-1, kv_heads, head_dim)[m.slot_mapping] = case.k.double()
    v_cache.view(-1, kv_heads, head_dim)[m.slot_mapping] = case.v.double()
    out = torch.empty(case.q.shape, dtype=torch.float64, device=case.q.device)
    group = case.q.shape[1] // kv_heads
    for t in range(case.q.shape[0]):
        s, i = int(m.token_seq_index[t]), int(m.token_query_index[t])
        seq_len, query_len = int(m.seq_lens[s]), int(m.query_lens[s])
        rows = torch.arange(seq_len, device=case.q.device)
        if m.custom_mask is None:
            visible = rows <= seq_len - query_len + i
        else:
            width = m.custom_mask.shape[2]
            start = seq_len - width
            visible = (rows < start) | m.custom_mask[s, i, (rows - start).clamp(min=0)]
        visible &= rows > positions[t] - window
        slots = m.block_tables[s, rows // m.block_size] * m.block_size + rows % m.block_size
        keys = k_cache.view(-1, kv_heads, head_dim)[slots[visible]].repeat_interleave(group, 1)
        values = v_cache.view(-1, kv_heads, head_dim)[slots[visible]].repeat_interleave(group, 1)
        scores = torch.einsum("hd,khd->hk", case.q[t].double(), keys) * case.scale
        out[t] = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
    return out


def run(case: Case, backend: str, window: int, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    if backend == "torch":
        return TorchAttentionBackend().forward(
            case.q, case.k, case.v, (k_cache, v_cache), case.meta, case.scale, window, positions
        )
    with poisoned_allocations():
        token_table = write_kv(case.k, case.v, k_cache, v_cache, case.meta)
        return paged_attention(
            case.q,
            k_cache,
            v_cache,
            case.meta,
            token_table,
            case.scale,
            sliding_window=window,
            positions=positions,
            **kwargs,
        )


@pytest.fixture
def invariant_mode():
    with forward_settings(batch_invariant=True):
        yield


VARIANTS = {
    "torch": ("torch", {}),
    "triton": ("triton", {}),
    "triton-splits": ("triton", {"num_splits": 5}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_dense_reference(layout, variant):
    cached, new, trees, window = LAYOUTS[layout]
    case = make_case(
        cached,
        new,
        trees,
        block_size=6,
        head_dim=12,
        heads=6,
        kv_heads=2,
        seed=list(LAYOUTS).index(layout),
    )
    positions = positions_of(case)
    backend, kwargs = VARIANTS[variant]
    out = run(case, backend, window, positions, **kwargs)
    torch.testing.assert_close(
        out.double(), reference(case, positions, window), atol=1e-5, rtol=1e-4
    )


@pytest.mark.parametrize("layout", ["decode", "prefill-chunks", "tree"])
def test_invariant_matches_dense_reference(invariant_mode, layout):
    """32-row splits: whole splits before the window are skipped, and the combine starts after them."""
    cached, new, trees, window = LAYOUTS[layout]
    case = make_case(cached, new, trees, block_size=6, head_dim=12, heads=6, kv_heads=2, seed=7)
    positions = positions_of(case)
    out = run(case, "triton", window, positions, split_rows=32)
    torch.testing.assert_close(
        out.double(), reference(case, positions, window), atol=1e-5, rtol=1e-4
    )


def test_invariant_decode_and_verify_rows_are_bit_equal(invariant_mode):
    """Row p = 150 (window 40: rows 111 .. 150, in splits 1 and 2 of 64-row splits, a multiple of the
    KV tile on the GPU too) decoded alone, inside a chain verify over 148 .. 153, and inside a tree
    verify whose mask shows it the same rows. bf16 on the GPU, where the mode's tree rows are
    bit-exact in half precision only (attention/invariant_attention.py)."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    heads, kv_heads, dim, block, p, window = 4, 2, 16, 8, 150, 40
    q, k, v = (
        torch.randn(p + 4, h, dim, generator=g).to(DEVICE, dtype)
        for h in (heads, kv_heads, kv_heads)
    )

    def row_p(cached: int, new: int, tree: bool) -> torch.Tensor:
        table = list(range(1, (p + 4) // block + 2))
        cache = [
            torch.full(
                (len(table) + 1, block, kv_heads, dim), float("nan"), device=DEVICE, dtype=dtype
            )
            for _ in range(2)
        ]
        for c, x in zip(cache, (k, v)):
            c.view(-1, kv_heads, dim)[block : block + cached] = x[:cached]
        mask = [torch.ones(new, new, dtype=torch.bool, device=DEVICE).tril()] if tree else None
        meta = build_paged_metadata([table], [cached], [new], block, DEVICE, mask)
        with poisoned_allocations():
            token_table = write_kv(k[cached : cached + new], v[cached : cached + new], *cache, meta)
            out = paged_attention(
                q[cached : cached + new],
                *cache,
                meta,
                token_table,
                dim**-0.5,
                split_rows=64,
                sliding_window=window,
                positions=torch.arange(cached, cached + new, device=DEVICE),
            )
        return out[p - cached]

    decode = row_p(p, 1, False)
    assert torch.equal(decode, row_p(p - 2, 6, False))
    assert torch.equal(decode, row_p(p - 2, 6, True))


def test_refuses_a_tree_wider_than_the_window():
    """Tree rows are placed by position only within a mask no wider than the window (metadata.py)."""
    case = make_case([30], [5], [9], seed=1)
    with pytest.raises(ValueError, match="exceeds the sliding window"):
        run(case, "torch", 8, positions_of(case))
    with pytest.raises(ValueError, match="positions"):
        run(case, "triton", 9, None)


def test_dense_training_metadata():
    """Training's dense causal path (no cache) under a window, against the paged path over one sequence."""
    from outpace.attention import DenseCausalMetadata

    case = make_case([0], [30], block_size=6, head_dim=12, heads=6, kv_heads=2, seed=3)
    dense = TorchAttentionBackend().forward(
        case.q, case.k, case.v, None, DenseCausalMetadata(1, 30), case.scale, 7
    )
    torch.testing.assert_close(
        dense.double(), reference(case, positions_of(case), 7), atol=1e-5, rtol=1e-4
    )
