"""The batch-invariant linear (deterministic mode): the same function as F.linear, and each row's
bits independent of the other rows in the call. On the CPU the kernel runs in Triton's interpreter,
float32 in the kernel's own operation order: a launch whose reduction over K changed with the row
count (another K tile, a split-K) would give some row other bits there too. What the interpreter
cannot show (the GPU's instruction choice by tile shape) is pinned by the tiles being the same for
every row count (``test_tiles_do_not_depend_on_the_row_count``), and checked in bf16 on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from helpers.attention_cases import poisoned_allocations
from outpace.attention import build_paged_metadata
from outpace.attention.context import forward_settings
from outpace.attention.triton_kernels import paged_attention, write_kv
from outpace.layers.batch_invariant import batch_invariant_linear
from outpace.layers.linear import project, project_rows_alone
from outpace.layers.skinny_gemm import ROW_TILE, skinny_linear, tiles_for

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "m,k,n,bias", [(1, 48, 200, False), (7, 130, 64, True), (70, 300, 33, False)]
)
def test_matches_f_linear_fp32(m, k, n, bias):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    out = batch_invariant_linear(
        x.to(DEVICE), w.to(DEVICE), None if b is None else b.to(DEVICE)
    ).cpu()
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_leading_dims_are_kept():
    x, w = torch.randn(2, 3, 16), torch.randn(8, 16)
    assert batch_invariant_linear(x.to(DEVICE), w.to(DEVICE)).shape == (2, 3, 8)
    assert batch_invariant_linear(x[:0].to(DEVICE), w.to(DEVICE)).shape == (0, 3, 8)


@pytest.mark.parametrize("n", [40, 4096, 6144, 16384, 28672, 128256])
def test_tiles_do_not_depend_on_the_row_count(n):
    """Every row count gets the same 16-row tile, columns, K step and warps (so the same tl.dot
    instruction and K order for a row); only how many tiles a program holds (1 or 4) and the grid
    change, and the grid covers every row once."""
    tiles = {m: tiles_for(m, n) for m in range(1, 600)}
    fixed = {(t.block_m, t.block_n, t.block_k, t.num_warps) for t in tiles.values()}
    assert fixed == {(ROW_TILE, 64 if n >= 16384 else 32, 256, 4)}
    for m, t in tiles.items():
        assert t.subtiles in (1, 4)
        assert (
            (t.row_groups - 1) * t.subtiles * ROW_TILE < m <= t.row_groups * t.subtiles * ROW_TILE
        )
        assert t.col_blocks * t.block_n >= n > (t.col_blocks - 1) * t.block_n


def _rows_alone_and_in_batches(x, w, b, counts, offsets):
    """Assert that rows [o, o + m) of ``x`` get the bits they get in the whole batch, for every
    count m and offset o (a row at another place in its 16-row tile, in another tile, in a program
    with one row tile or four), and each row alone the same bits."""
    full = batch_invariant_linear(x, w, b)
    for m in counts:
        for o in offsets:
            if o + m <= x.shape[0]:
                part = batch_invariant_linear(x[o : o + m], w, b)
                assert torch.equal(part, full[o : o + m]), f"rows {o}..{o + m - 1}"
    for r in (0, 15, 16, 63, 64, x.shape[0] - 1):
        assert torch.equal(batch_invariant_linear(x[r : r + 1], w, b), full[r : r + 1]), f"row {r}"
    return full


def test_rows_are_bitwise_independent_of_the_batch_fp32():
    """Decode rows (1..8), verify widths (2..8 tokens times 1..8 sequences: up to 64 rows) and
    bigger products (four row tiles a program), two K steps with a ragged tail."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(130, 300, generator=g).to(DEVICE)
    w, b = torch.randn(40, 300, generator=g).to(DEVICE), torch.randn(40, generator=g).to(DEVICE)
    counts = sorted({*range(1, 9), *(q * s for q in range(2, 9) for s in (2, 5, 8)), 65, 100, 128})
    _rows_alone_and_in_batches(x, w, None, counts, (0, 3))
    _rows_alone_and_in_batches(x, w, b, (1, 6, 70), (0, 1))


def test_few_rows_are_the_normal_paths_bits():
    """Up to 16 rows the mode costs nothing: its product is the normal decode path's skinny kernel."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(16, 64, generator=g).to(DEVICE), torch.randn(24, 64, generator=g).to(DEVICE)
    for m in (1, 5, 16):
        assert torch.equal(batch_invariant_linear(x[:m], w), skinny_linear(x[:m], w))


@pytest.mark.gpu
def test_rows_are_bitwise_independent_of_the_batch_bf16():
    """bf16 on the GPU at the Llama-8B widths: o_proj-like (32-column blocks) and the head-like wide
    product (64-column blocks), rows alone and among 1..300 rows."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 4096, generator=g, device="cuda").bfloat16()
    counts = sorted({*range(1, 17), *(q * s for q in range(2, 9) for s in (2, 5, 8)), 100, 300})
    for n in (1024, 16384):
        w = (torch.randn(n, 4096, generator=g, device="cuda") * 0.02).bfloat16()
        full = _rows_alone_and_in_batches(x, w, None, counts, (0, 5, 100))
        ref = F.linear(x.float(), w.float())
        assert ((full.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_cpu_projection_rows_are_bitwise_independent_of_the_batch_in_batch_invariant_mode():
    """On the CPU, batch-invariant mode projects each row alone: a row's bits are the same among any number
    of rows (a plain F.linear gives other bits for some row counts on some CPUs: MKL's kernel for 1-11 rows
    differs from its kernel for 12 or more on an AVX-512 machine), and equal F.linear's for a single row."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(40, 256, generator=g),
        torch.randn(300, 256, generator=g),
        torch.randn(300, generator=g),
    )
    with forward_settings(batch_invariant=True):
        full = project(x, w, b)
        for m in range(1, 40):
            assert torch.equal(project(x[:m], w, b), full[:m])
        assert project(x[:0], w).shape == (0, 300) and project(x.view(4, 10, 256), w).shape == (
            4,
            10,
            300,
        )
    assert torch.equal(full, project_rows_alone(x, w, b))
    assert torch.equal(full[3], F.linear(x[3], w, b))


# Attention: a tree node's row is plain decoding's row ------------------------------------------------


def _attend(seqs, *, block_size, split_rows, sliding_window=None, seed=0, dtype=torch.float32):
    """One write_kv + paged_attention call in batch-invariant mode. ``seqs``: per sequence (cached k,
    v [c, kv_heads, d]; new q [n, heads, d], k, v; mask [n, n] or None; positions [n]), the cache in
    shuffled blocks with every other row NaN. Returns the outputs of each sequence's new tokens."""
    g = torch.Generator().manual_seed(seed)
    kv_shape = seqs[0][0].shape[1:]
    counts = [-(-(len(s[0]) + len(s[2])) // block_size) + 2 for s in seqs]  # spare blocks too
    perm = (torch.randperm(sum(counts), generator=g) + 1).tolist()
    tables = [perm[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(seqs))]
    k_cache = torch.full((sum(counts) + 1, block_size, *kv_shape), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    for (k, v, *_), table in zip(seqs, tables):
        r = torch.arange(len(k))
        slots = torch.tensor(table)[r // block_size] * block_size + r % block_size
        k_cache.view(-1, *kv_shape)[slots] = k.to(dtype)
        v_cache.view(-1, *kv_shape)[slots] = v.to(dtype)
    q, k, v = (torch.cat([s[i] for s in seqs]).to(DEVICE, dtype) for i in (2, 3, 4))
    positions = torch.cat([s[6] for s in seqs]).to(DEVICE)
    masks = [None if s[5] is None else s[5].to(DEVICE) for s in seqs]
    meta = build_paged_metadata(
        tables,
        [len(s[0]) for s in seqs],
        [len(s[2]) for s in seqs],
        block_size,
        DEVICE,
        masks if any(m is not None for m in masks) else None,
    )
    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)
    with poisoned_allocations(), forward_settings(batch_invariant=True):
        token_table = write_kv(k, v, k_cache, v_cache, meta)
        out = paged_attention(
            q,
            k_cache,
            v_cache,
            meta,
            token_table,
            q.shape[-1] ** -0.5,
            split_rows=split_rows,
            sliding_window=sliding_window,
            positions=positions,
        ).cpu()
    return list(out.split([len(s[2]) for s in seqs]))


def _random_tree(n, g):
    """parents [n] (-1 for node 0, each node's parent before it) and the ancestor mask [n, n]."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
    return parents, mask


def _check_tree_nodes(
    cached, nodes, *, heads, kv_heads, dim, dtype, block_size, split_rows, sliding_window, atol
):
    """Every node of a tree verify (two trees and a causal chunk in the batch) gets, bit for bit, the
    row plain decoding computes for its token: a decode step (one new token) over the prefix and the
    node's ancestors, in a batch of every node's decode, and the last row of a chain verify over its
    path, in a ragged batch of every node's path; close to the float64 softmax too."""
    g = torch.Generator().manual_seed(cached)

    def randn(*shape):  # values the dtype holds exactly, so the reference sees the kernel's inputs
        return torch.randn(*shape, generator=g).to(dtype).float()

    prefix_k, prefix_v = randn(2, cached, kv_heads, dim)
    q, (k, v) = randn(nodes, heads, dim), randn(2, nodes, kv_heads, dim)
    mask = _random_tree(nodes, g)[1]
    path = [mask[i].nonzero().flatten() for i in range(nodes)]  # ancestors by depth, then the node
    depth = torch.tensor([len(p) - 1 for p in path])
    other = (*randn(2, 30, kv_heads, dim), randn(5, heads, dim), *randn(2, 5, kv_heads, dim))
    other = (*other, None, torch.arange(30, 35))  # a causal chunk sharing the calls
    second = _random_tree(6, g)[1]  # another tree, in front of the one checked
    kw = {
        "block_size": block_size,
        "split_rows": split_rows,
        "sliding_window": sliding_window,
        "dtype": dtype,
    }
    tree = _attend(
        [
            (*randn(2, 20, kv_heads, dim), q[:6], k[:6], v[:6], second, 19 + second.sum(1)),
            other,
            (prefix_k, prefix_v, q, k, v, mask, cached + depth),
        ],
        seed=1,
        **kw,
    )[2]
    decode = _attend(
        [other]
        + [
            (
                torch.cat([prefix_k, k[p[:-1]]]),
                torch.cat([prefix_v, v[p[:-1]]]),
                q[i : i + 1],
                k[i : i + 1],
                v[i : i + 1],
                None,
                cached + depth[i : i + 1],
            )
            for i, p in enumerate(path)
        ],
        seed=2,
        **kw,
    )[1:]
    chain = _attend(
        [
            (prefix_k, prefix_v, q[p], k[p], v[p], None, cached + torch.arange(len(p)))
            for p in reversed(path)
        ],
        seed=3,
        **kw,
    )[::-1]
    for i, p in enumerate(path):
        assert torch.equal(tree[i], decode[i][0]), f"node {i} (depth {depth[i]}) against decode"
        assert torch.equal(tree[i], chain[i][-1]), f"node {i} (depth {depth[i]}) against its chain"
        keys = torch.cat([prefix_k, k[p]]).double().repeat_interleave(heads // kv_heads, 1)
        values = torch.cat([prefix_v, v[p]]).double().repeat_interleave(heads // kv_heads, 1)
        if sliding_window is not None:
            keys, values = keys[-sliding_window:], values[-sliding_window:]
        scores = torch.einsum("hd,khd->hk", q[i].double(), keys) * dim**-0.5
        ref = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
        torch.testing.assert_close(tree[i].double(), ref, atol=atol, rtol=0)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="float32 on the GPU: not established bit-invariant (attention/invariant_attention.py); "
    "bf16 is checked below",
)
@pytest.mark.parametrize(
    "cached,nodes,block_size,split_rows,sliding_window",
    [
        (45, 12, 16, None, None),  # the window starts inside a KV tile and ends in the next
        (58, 10, 6, 32, None),  # odd blocks, many splits: paths cross tile and split boundaries
        (70, 9, 16, 64, 40),  # a sliding window shorter than the prefix
    ],
)
def test_tree_nodes_get_plain_decodings_bits(cached, nodes, block_size, split_rows, sliding_window):
    _check_tree_nodes(
        cached,
        nodes,
        heads=4,
        kv_heads=2,
        dim=16,
        dtype=torch.float32,
        block_size=block_size,
        split_rows=split_rows,
        sliding_window=sliding_window,
        atol=1e-5,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("cached,split_rows", [(3000, None), (1020, None), (1000, 64)])
def test_tree_nodes_get_plain_decodings_bits_bf16(cached, split_rows):
    """bf16 at the Llama-8B head shape, 16-node trees over long prefixes (the window across a
    512-row split at 1020, across 64-row splits at 1000)."""
    _check_tree_nodes(
        cached,
        16,
        heads=32,
        kv_heads=8,
        dim=128,
        dtype=torch.bfloat16,
        block_size=16,
        split_rows=split_rows,
        sliding_window=None,
        atol=2e-2,
    )
