"""The grouped-expert kernels (layers/moe_kernels.py) against the eager experts (layers/moe.py run_experts)
in Triton's interpreter (fp32 on the CPU; bf16 and the DeepSeek-V2-Lite shape on the GPU): decode and verify
batches whose tokens share experts, top_k > 1, experts nobody chose, an odd hidden and expert size, every
expert chosen by one token (a prefill-sized batch, the large blocks), and the block layout of the routing
sort. The stacked weights are views of the experts' parameters."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")

from outpace.layers.decoder import GatedMLP, pack_projections
from outpace.layers.moe import MoE, Routing, run_experts
from outpace.layers.moe_kernels import _align_kernel, grouped_swiglu_experts, max_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_moe(hidden: int, inter: int, experts: int, top_k: int, dtype=torch.float32) -> MoE:
    torch.manual_seed(0)
    routing = Routing(num_experts=experts, top_k=top_k, scoring="softmax")
    moe = MoE(hidden, routing, inter, 0, lambda size, bias: GatedMLP(hidden, size, "silu", bias))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
    return moe.to(DEVICE, dtype)


def routing_of(n: int, experts: int, top_k: int, shared: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [n, top_k] float32, ids [n, top_k]): distinct experts per token; with ``shared`` every token
    draws from the same few experts, so tokens share them."""
    g = torch.Generator().manual_seed(seed)
    pool = min(experts, top_k + 1) if shared else experts
    ids = torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(n)])
    weights = torch.rand(n, top_k, generator=g)
    return weights.to(DEVICE), ids.to(DEVICE)


@pytest.mark.parametrize("n, experts, top_k, shared", [
    (1, 8, 3, False),    # decode, one token
    (5, 8, 3, True),     # verify of k+1 = 5 tokens over 4 experts: every expert seen by several tokens
    (7, 16, 2, False),   # experts nobody chose
    (4, 6, 6, False),    # top_k = experts
])
def test_grouped_experts_equal_the_eager_experts(n, experts, top_k, shared):
    moe = make_moe(hidden=40, inter=24, experts=experts, top_k=top_k)
    x = torch.randn(n, 40, device=DEVICE)
    weights, ids = routing_of(n, experts, top_k, shared, seed=n)
    expected = run_experts(x, weights, ids, moe.experts)
    got = grouped_swiglu_experts(x, weights, ids, *moe.stacked_experts())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_prefill_sized_batch_takes_the_large_blocks():
    """More pairs than 16 per expert: 64-row blocks, experts with several blocks, ragged last blocks."""
    moe = make_moe(hidden=24, inter=20, experts=4, top_k=2)
    n = 70
    x = torch.randn(n, 24, device=DEVICE)
    weights, ids = routing_of(n, 4, 2, shared=False, seed=3)
    expected = run_experts(x, weights, ids, moe.experts)
    torch.testing.assert_close(grouped_swiglu_experts(x, weights, ids, *moe.stacked_experts()), expected,
                               rtol=1e-5, atol=1e-5)


def test_routing_sort_fills_whole_blocks_of_one_expert():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2]], device=DEVICE)  # expert 3 four times, 0 twice
    pairs, block_m = ids.numel(), 16
    blocks = max_blocks(pairs, 5, block_m)
    sorted_pairs = torch.full((blocks * block_m,), -7, dtype=torch.int32, device=DEVICE)
    block_expert = torch.full((blocks,), -7, dtype=torch.int32, device=DEVICE)
    _align_kernel[(1,)](ids.reshape(-1), sorted_pairs, block_expert, pairs, blocks, NUM_EXPERTS=5, BLOCK_E=16,
                        BLOCK_M=block_m, CHUNK=4)  # chunks of 4 pairs: the running counts carry across chunks
    assert block_expert.tolist() == [0, 1, 2, 3] + [-1] * (blocks - 4)
    rows = sorted_pairs.view(blocks, block_m)[:4].tolist()
    real = [[p for p in row if p != pairs] for row in rows]
    assert real == [[1, 4], [3], [7], [0, 2, 5, 6]]  # pair = token * top_k + slot, stable within an expert
    assert all(p == pairs for row in rows for p in row[len([q for q in row if q != pairs]):])


def test_stacked_weights_are_views_of_the_expert_parameters():
    moe = make_moe(hidden=16, inter=8, experts=4, top_k=2)
    pack_projections(moe)  # serving packs each expert's gate/up first: the stack must take those over
    gate_up, down = moe.stacked_experts()
    assert moe.stacked_experts()[0] is gate_up  # built once
    with torch.no_grad():
        moe.experts[2].up_proj.weight.mul_(2.0)
        moe.experts[1].down_proj.weight.zero_()
    assert torch.equal(gate_up[2, 8:], moe.experts[2].up_proj.weight)
    assert torch.equal(moe.experts[2].gate_up.weight, gate_up[2])
    assert not down[1].any()
    x = torch.randn(3, 16, device=DEVICE)
    weights, ids = routing_of(3, 4, 2, shared=True, seed=1)
    torch.testing.assert_close(grouped_swiglu_experts(x, weights, ids, gate_up, down),
                               run_experts(x, weights, ids, moe.experts), rtol=1e-5, atol=1e-5)
    moe.to(torch.float64)  # new storage: restacked
    assert moe.stacked_experts()[0].dtype == torch.float64


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 at the DeepSeek-V2-Lite expert shape: GPU only")
@pytest.mark.parametrize("n", [1, 4, 8, 32])
def test_bf16_at_the_v2_lite_shape(n):
    moe = make_moe(hidden=2048, inter=1408, experts=64, top_k=6, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.02)
    x = torch.randn(n, 2048, device=DEVICE, dtype=torch.bfloat16)
    weights, ids = routing_of(n, 64, 6, shared=False, seed=n)
    got = grouped_swiglu_experts(x, weights, ids, *moe.stacked_experts())
    reference = copy.deepcopy(moe.experts).float()
    expected = run_experts(x.float(), weights, ids, reference)  # float32 reference
    assert ((got.float() - expected).norm() / expected.norm()).item() < 1e-2
