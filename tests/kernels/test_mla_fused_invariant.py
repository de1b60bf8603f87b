"""The fused few-row MLA block (layers/mla_fused.py) in batch-invariant mode, in Triton's interpreter in float32
(rows' dots bit for bit row by row: tests/conftest.py): a batch of verify chains over more rows than one row tile
gives each token the output and latent-cache row bits it gets decoded one step at a time in a batch of other
sizes, with and without a q_lora_rank (the two query kernels); and the mode takes the fused block for any row
count. On the GPU this rests on what the mode's other kernels rest on (an MMA row's bits do not depend on the
other rows); a GPU run of the engine's invariant tests (tests/engine/test_batch_invariant_trees.py's cuda cases,
tests/gpu/) checks it there."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import outpace.layers.mla as mla_module
from helpers.mla_layers import make_layer
from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.registry import get_backend
from outpace.layers import mla_fused
from outpace.layers.mla import MLAShape
from outpace.layers.skinny_gemm import MAX_ROWS

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tensors through Triton's interpreter"
)

BLOCK_SIZE = 5
CACHED = [70, 131, 3, 150, 12, 96]  # a chain of CHAIN tokens after each: 24 rows, two row tiles
CHAIN = 4


@pytest.fixture
def fused_calls(monkeypatch):
    """The fused block forced on CPU tensors for any number of rows (as the mode takes it on the GPU), its
    forwards counted."""
    calls = []
    real = mla_fused.mla_forward_fused
    monkeypatch.setattr(mla_module.MultiHeadLatentAttention, "fused", True)
    monkeypatch.setattr(mla_module, "fusable_rows", lambda x, w: True)
    monkeypatch.setattr(
        mla_fused, "mla_forward_fused", lambda *a: calls.append(a[2].shape[0]) or real(*a)
    )
    return calls


def forward(
    layer, seqs: list[int], cached: list[int], new: int, x: torch.Tensor, tables
) -> torch.Tensor:
    """The layer over ``new`` tokens of each sequence in ``seqs`` (their rows of x in order), after ``cached``
    rows, in batch-invariant mode under the Triton backend."""
    meta = build_paged_metadata(
        [tables[s] for s in seqs], [cached[s] for s in seqs], [new] * len(seqs), BLOCK_SIZE, "cpu"
    )
    positions = (meta.seq_lens - meta.query_lens)[meta.token_seq_index] + meta.token_query_index
    with torch.no_grad(), forward_context(meta, get_backend("triton"), batch_invariant=True):
        return layer(positions, x)


@pytest.mark.parametrize("q_lora_rank", [None, 20])
def test_chains_give_each_token_its_decoded_bits(q_lora_rank, fused_calls):
    layer = make_layer(MLAShape(40, 3, q_lora_rank, 36, 6, 8, 5, scale=0.3), True, "cpu")
    g = torch.Generator().manual_seed(1)
    n = len(CACHED)
    needed = [-(-(c + CHAIN) // BLOCK_SIZE) for c in CACHED]
    blocks = torch.randperm(sum(needed) + 4, generator=g).tolist()
    tables = [blocks[sum(needed[:s]) : sum(needed[: s + 1])] for s in range(n)]
    x = torch.randn(n, CHAIN, 40, generator=g)  # [sequence, token, hidden]
    cache_init = torch.randn(sum(needed) + 4, BLOCK_SIZE, 1, 44, generator=g)

    layer.bind_cache(cache_init.shape[0], BLOCK_SIZE, torch.float32, "cpu")
    layer.cache_rows.copy_(cache_init)
    chains = forward(layer, list(range(n)), CACHED, CHAIN, x.reshape(n * CHAIN, 40), tables)
    chain_cache = layer.cache_rows.clone()
    assert fused_calls == [n * CHAIN] and n * CHAIN > MAX_ROWS  # two row tiles

    # the same tokens decoded one step at a time, the sequences in batches of other sizes
    layer.cache_rows.copy_(cache_init)
    decoded = torch.empty(n, CHAIN, 40)
    for t in range(CHAIN):
        cached = [c + t for c in CACHED]
        for seqs in ([0, 1, 2, 3, 4], [5]) if t % 2 else ([0], [1, 2], [3, 4, 5]):
            decoded[seqs, t] = forward(layer, seqs, cached, 1, x[seqs, t], tables)
    assert len(fused_calls) > 1 and max(fused_calls[1:]) <= MAX_ROWS
    assert torch.equal(chains.view(n, CHAIN, 40), decoded)
    assert torch.equal(layer.cache_rows, chain_cache)
