"""The grouped-expert kernels (layers/moe_kernels.py) against the eager experts (layers/moe.py run_experts)
in Triton's interpreter (fp32 on the CPU; bf16 and the DeepSeek-V2-Lite shape on the GPU): decode and verify
batches whose tokens share experts, top_k > 1, experts nobody chose, an odd hidden and expert size, every
expert chosen by one token (a prefill-sized batch, the large blocks), and the block layout of the routing
sort (shared-expert slots included; one block per chosen expert up to 64 tokens). The stacked weights are
views of the experts' parameters; the fused shared experts are views of the shared MLP's and the MoE block
with them fused (torch routing or the routing kernel) equals it with the shared MLP run beside; every token
count to 64 with tokens sharing experts gives the eager output, and the same bits twice.

Every activation the kernels take (SiLU-gated, GELU-tanh-gated, SiLU with Step-3.5's clamps, relu2 ungated)
in every weight layout of ``RoutedExperts`` (expert modules, packed gate/up, separate stacks) equals
run_experts; and every MoE family's module (DeepSeek, Qwen3-Next, Nemotron-H, Step-3.5, Gemma 4) computes with
the kernels what it computes eagerly, its eager output being what its code computed before RoutedExperts."""

from __future__ import annotations

import copy
import json
from functools import partial

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from outpace.layers.activation import ACTIVATIONS  # noqa: E402
from outpace.layers.decoder import GatedMLP, pack_projections  # noqa: E402
from outpace.layers.expert_blocks import _align_kernel, align, block_rows, max_blocks  # noqa: E402
from outpace.layers.grouped_experts import grouped_experts  # noqa: E402
from outpace.layers.linear import project  # noqa: E402
from outpace.layers.moe import (  # noqa: E402
    ExpertActivation,
    MoE,
    RoutedExperts,
    run_experts,
    shared_expert_stacks,
)
from outpace.layers.router import Routing  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def randomise(module: torch.nn.Module, std: float = 0.3) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)
    return module


def make_moe(
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype=torch.float32,
    shared: int = 0,
    shared_bias: bool = False,
) -> MoE:
    routing = Routing(num_experts=experts, top_k=top_k, scoring="softmax")
    moe = MoE(
        hidden,
        routing,
        inter,
        shared,
        lambda size, bias, **_: GatedMLP(hidden, size, "silu", bias),
        shared_bias,
    )
    return randomise(moe).to(DEVICE, dtype)


def kernel_out(experts: RoutedExperts, x, weights, ids):
    return grouped_experts(
        x,
        weights,
        ids,
        *experts.stacks(),
        activation=experts.activation.kernel,
        limit=experts.activation.limit,
    )


def routing_of(
    n: int, experts: int, top_k: int, shared: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [n, top_k] float32, ids [n, top_k]): distinct experts per token; with ``shared`` every token
    draws from the same few experts, so tokens share them."""
    g = torch.Generator().manual_seed(seed)
    pool = min(experts, top_k + 1) if shared else experts
    ids = torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(n)])
    weights = torch.rand(n, top_k, generator=g)
    return weights.to(DEVICE), ids.to(DEVICE)


@pytest.mark.parametrize(
    "n, experts, top_k, shared",
    [
        (1, 8, 3, False),  # decode, one token
        (
            5,
            8,
            3,
            True,
        ),  # verify of k+1 = 5 tokens over 4 experts: every expert seen by several tokens
        (7, 16, 2, False),  # experts nobody chose
        (4, 6, 6, False),  # top_k = experts
    ],
)
def test_grouped_experts_equal_the_eager_experts(n, experts, top_k, shared):
    moe = make_moe(hidden=40, inter=24, experts=experts, top_k=top_k)
    x = torch.randn(n, 40, device=DEVICE)
    weights, ids = routing_of(n, experts, top_k, shared, seed=n)
    expected = run_experts(x, weights, ids, moe.experts)
    torch.testing.assert_close(
        kernel_out(moe.experts, x, weights, ids), expected, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "n, hidden, offset, several",  # several: the hidden size spans several combine programs (4 SMs here)
    [(1, 40, 0.0, False), (1, 300, 1.0, True), (6, 1500, 1.0, True)],
)
def test_combine_adds_the_stream_and_readies_the_next_norm(n, hidden, offset, several):
    """``ready``: the combine adds the experts' output (rounded to its dtype first) to the stream and
    leaves it made ready for the next norm, as ``normed_rows`` of the output with the stream as residual:
    the same stream bits, its product with the norm's scale, and sums of squares that add up to the row's
    (one part per combine program: several where the hidden size spans several)."""
    from outpace.layers.normed_rows import normed_rows

    moe = make_moe(hidden=hidden, inter=12, experts=8, top_k=3, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, hidden, generator=g).to(DEVICE, torch.bfloat16)
    stream = torch.randn(n, hidden, generator=g).to(DEVICE, torch.bfloat16)
    norm_weight = torch.randn(hidden, generator=g).to(DEVICE, torch.bfloat16)
    weights, ids = routing_of(n, 8, 3, shared=False, seed=n)
    experts = moe.experts
    out = kernel_out(experts, x, weights, ids)
    expected = normed_rows(out, norm_weight, offset, residual=stream)
    got = grouped_experts(
        x,
        weights,
        ids,
        *experts.stacks(),
        activation=experts.activation.kernel,
        ready=(stream, norm_weight, offset),
    )
    assert torch.equal(got.stream, expected.stream)
    assert torch.equal(got.normed, expected.normed)
    assert got.sq_parts.shape[1] == n and (got.sq_parts.shape[0] > 1) == several
    torch.testing.assert_close(got.sq_parts.sum(0), expected.sq_parts.sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 7])
def test_a_row_scale_is_the_input_norm_of_a_stream(n):
    """``row_scale``: x is a stream times its norm's weight, each token's gate/up products scaled by its
    norm factor before the activation: the experts of the normalised stream (shared slots too)."""
    from outpace.layers.norm import rms_norm_torch

    moe = make_moe(hidden=40, inter=12, experts=8, top_k=3, shared=2)
    g = torch.Generator().manual_seed(n)
    stream, w = torch.randn(n, 40, generator=g), torch.rand(40, generator=g) + 0.5
    rstd = torch.rsqrt(stream.pow(2).mean(dim=1) + 1e-6)
    weights, ids = routing_of(n, 8, 3, shared=False, seed=n)
    weights = torch.cat([weights, torch.ones(n, 2, device=DEVICE)], dim=1)  # (the shared slots': 1)
    stacks = shared_expert_stacks(moe.shared_experts, moe.experts)
    kernel_args = (weights, ids, *moe.experts.stacks())
    kw = dict(activation="silu", shared=stacks)
    expected = grouped_experts(rms_norm_torch(stream, w, 1e-6)[0].to(DEVICE), *kernel_args, **kw)
    got = grouped_experts((stream * w).to(DEVICE), *kernel_args, row_scale=rstd.to(DEVICE), **kw)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_prefill_sized_batch_takes_the_large_blocks():
    """More pairs than 16 per expert: 64-row blocks, experts with several blocks, ragged last blocks."""
    moe = make_moe(hidden=24, inter=20, experts=4, top_k=2)
    n = 70
    x = torch.randn(n, 24, device=DEVICE)
    weights, ids = routing_of(n, 4, 2, shared=False, seed=3)
    expected = run_experts(x, weights, ids, moe.experts)
    torch.testing.assert_close(
        kernel_out(moe.experts, x, weights, ids), expected, rtol=1e-5, atol=1e-5
    )


def test_routing_sort_fills_whole_blocks_of_one_expert():
    ids = torch.tensor(
        [[3, 0], [3, 1], [0, 3], [3, 2]], device=DEVICE
    )  # expert 3 four times, 0 twice
    pairs, block_m = ids.numel(), 16
    blocks = max_blocks(pairs, 5, block_m)
    sorted_pairs = torch.full((blocks * block_m,), -7, dtype=torch.int32, device=DEVICE)
    block_expert = torch.full((blocks,), -7, dtype=torch.int32, device=DEVICE)
    cursor = torch.full((5,), -7, dtype=torch.int32, device=DEVICE)
    _align_kernel[(1,)](
        ids,
        ids.stride(0),
        sorted_pairs,
        block_expert,
        cursor,
        pairs,
        blocks,
        5,
        TOP_K=2,
        SLOTS=2,
        BLOCK_E=16,
        BLOCK_M=block_m,
        CHUNK=4,
    )  # chunks of 4 pairs: each expert's cursor carries across chunks
    assert block_expert.tolist() == [0, 1, 2, 3] + [-1] * (blocks - 4)
    rows = sorted_pairs.view(blocks, block_m)[:4].tolist()
    real = [[p for p in row if p != pairs] for row in rows]
    assert real == [
        [1, 4],
        [3],
        [7],
        [0, 2, 5, 6],
    ]  # pair = token * top_k + slot, stable within an expert
    assert all(p == pairs for row in rows for p in row[len([q for q in row if q != pairs]) :])


def test_shared_slots_are_experts_every_token_chooses():
    """With 2 shared experts each token has 4 slots: its 2 routed ones, then experts 5 and 6."""
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], device=DEVICE)
    layout = align(ids, num_routed=5, num_shared=2)
    assert layout.block_m == 16
    experts = layout.block_expert.tolist()
    assert experts[:5] == [0, 1, 3, 5, 6] and set(experts[5:]) <= {-1}
    rows = layout.sorted_pairs.view(layout.blocks, 16)[:5].tolist()
    real = [[p for p in row if p != 12] for row in rows]
    assert real == [[1, 8], [5], [0, 4, 9], [2, 6, 10], [3, 7, 11]]  # pair = token * 4 + slot


@pytest.mark.parametrize(
    "tokens, block_m", [(1, 16), (16, 16), (17, 16), (33, 16), (64, 16), (65, 64)]
)
def test_each_expert_spans_the_blocks_its_pairs_fill(tokens, block_m):
    """16-row blocks up to 64 tokens (64 beyond): a routed expert with at most 16 pairs is one block (its
    weights read once), the shared expert every token chooses spans one block per 16 of them."""
    assert block_rows(tokens) == block_m
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(tokens)]).to(DEVICE)
    layout = align(ids, num_routed=8, num_shared=1)
    used = [e for e in layout.block_expert.tolist() if e >= 0]
    pairs_of = {e: (ids == e).sum().item() for e in range(8)} | {8: tokens}
    assert sorted(used) == sorted(e for e, n in pairs_of.items() for _ in range(-(-n // block_m)))


@pytest.mark.parametrize("n", [1, 2, 8, 17, 33, 64])
def test_every_token_count_to_64_with_tokens_sharing_experts(n):
    """Decode to batch x verify width 64: every chosen expert one block of up to 64 rows, read once."""
    moe = make_moe(hidden=24, inter=20, experts=6, top_k=3)
    x = torch.randn(n, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    weights, ids = routing_of(n, 6, 3, shared=True, seed=n)
    expected = run_experts(x, weights, ids, moe.experts)
    got = kernel_out(moe.experts, x, weights, ids)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(kernel_out(moe.experts, x, weights, ids), got)  # the same bits again


@pytest.mark.parametrize("n", [1, 5, 64, 70])
@pytest.mark.parametrize("routing_kernel", [True, False])
def test_fused_shared_experts_equal_the_separate_shared_mlp(n, routing_kernel):
    """MoE on the kernels (routing kernel or torch routing, shared experts fused as 2 more experts of
    weight 1) equals MoE eager (torch routing, run_experts, the shared MLP added)."""
    moe = make_moe(hidden=24, inter=12, experts=8, top_k=3, shared=2)
    pack_projections(
        moe
    )  # serving packs the shared MLP's gate/up: the fused stacks view those rows
    x = torch.randn(n, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    with torch.no_grad():
        moe.experts.kernels, moe.gate.kernel = False, False
        expected = moe(x)
        moe.experts.kernels, moe.gate.kernel = True, routing_kernel
        seen = []  # the router runs as a module: hooks (bench/deepseek_shape.py CountExperts) see the ids
        moe.gate.register_forward_hook(lambda _m, _i, out: seen.append(out[1]))
        got = moe(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert len(seen) == 1 and seen[0].shape == (n, 3)


@pytest.mark.parametrize("n", [5, 12, 70])
def test_rows_that_route_nowhere_read_no_expert(n):
    """Within ``routed_rows`` (layers/routed_rows.py: an MTP draft window's padding rows), the masked rows'
    routed slots land in no block: the layout's ids are -1 there (the router's ids and weights as chosen), no
    block holds them, their output is the shared experts' alone, and every other row's is what it is without
    the mask. A mask of another row count leaves the routing alone."""
    from outpace.layers.moe_routing_kernel import route
    from outpace.layers.routed_rows import routed_rows

    moe = make_moe(hidden=24, inter=12, experts=8, top_k=3, shared=2)
    pack_projections(moe)
    x = torch.randn(n, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    live = torch.arange(n, device=DEVICE) % 4 < 2  # rows 0, 1 of every 4
    with torch.no_grad():
        moe.experts.kernels, moe.gate.kernel = True, True
        full = moe(x)
        with routed_rows(live):
            masked = moe(x)
            weights, ids, layout = route(
                x, moe.gate.weight.float(), None, moe.gate.routing, 2, True
            )
        with routed_rows(live[:-1]):
            other = moe(x)
        shared = moe.shared_experts(x[~live])
    assert torch.equal(masked[live], full[live]) and torch.equal(other, full)
    torch.testing.assert_close(masked[~live], shared, rtol=1e-5, atol=1e-5)
    assert (
        layout.skips and layout.ids[~live].eq(-1).all() and torch.equal(layout.ids[live], ids[live])
    )
    all_weights, all_ids, _ = route(x, moe.gate.weight.float(), None, moe.gate.routing, 2, True)
    assert torch.equal(ids, all_ids) and torch.equal(weights, all_weights)
    pairs = layout.sorted_pairs[layout.sorted_pairs < n * 5].long()  # placed (token, slot) pairs
    routed = pairs[pairs % 5 < 3] // 5  # the tokens of routed slots placed in a block
    assert live[routed].all() and routed.unique().numel() == int(live.sum())


@pytest.mark.parametrize("n", [3, 70])
def test_rows_that_all_route_nowhere_get_the_shared_experts_alone(n):
    """A mask with no row (an MTP layer's prompt rows, whose output nothing reads: speculative/drafters/mtp.py):
    no routed slot is placed, and every row's output is the shared experts'."""
    from outpace.layers.routed_rows import routed_rows

    moe = make_moe(hidden=24, inter=12, experts=8, top_k=3, shared=2)
    pack_projections(moe)
    x = torch.randn(n, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    with torch.no_grad():
        moe.experts.kernels, moe.gate.kernel = True, True
        with routed_rows(torch.zeros(n, dtype=torch.bool, device=DEVICE)):
            masked = moe(x)
        shared = moe.shared_experts(x)
    torch.testing.assert_close(masked, shared, rtol=1e-5, atol=1e-5)


def test_shared_stacks_are_views_of_the_shared_mlp():
    moe = make_moe(hidden=16, inter=8, experts=4, top_k=2, shared=3)
    mlp = moe.shared_experts
    gate, up, down = shared_expert_stacks(moe.shared_experts, moe.experts)
    assert gate.shape == up.shape == (3, 8, 16) and down.shape == (3, 16, 8)
    assert gate.data_ptr() == mlp.gate_proj.weight.data_ptr()
    assert up.data_ptr() == mlp.up_proj.weight.data_ptr()
    assert down.data_ptr() == mlp.down_proj.weight.data_ptr()
    assert torch.equal(
        down[1], mlp.down_proj.weight[:, 8:16]
    )  # expert s: columns s*inter.. of down
    assert torch.equal(gate[2], mlp.gate_proj.weight[16:])
    biased = make_moe(hidden=16, inter=8, experts=4, top_k=2, shared=2, shared_bias=True)
    # not fusable: the shared MLP runs beside the experts
    assert shared_expert_stacks(biased.shared_experts, biased.experts) is None
    x = torch.randn(3, 16, device=DEVICE)
    with torch.no_grad():
        biased.experts.kernels = False
        expected = biased(x)
        biased.experts.kernels = True
        torch.testing.assert_close(biased(x), expected, rtol=1e-5, atol=1e-5)


def test_stacked_weights_are_views_of_the_expert_parameters():
    moe = make_moe(hidden=16, inter=8, experts=4, top_k=2)
    pack_projections(
        moe
    )  # serving packs each expert's gate/up first: the stack must take those over
    gate, up, down = moe.experts.stacks()
    assert moe.experts.stacks()[0] is gate  # built once
    with torch.no_grad():
        moe.experts[2].up_proj.weight.mul_(2.0)
        moe.experts[1].down_proj.weight.zero_()
    assert torch.equal(up[2], moe.experts[2].up_proj.weight)
    assert torch.equal(moe.experts[2].gate_up.weight, torch.cat((gate[2], up[2])))
    assert moe.experts[2].gate_up.weight.data_ptr() == gate[2].data_ptr()
    assert not down[1].any()
    x = torch.randn(3, 16, device=DEVICE)
    weights, ids = routing_of(3, 4, 2, shared=True, seed=1)
    torch.testing.assert_close(
        kernel_out(moe.experts, x, weights, ids),
        run_experts(x, weights, ids, moe.experts),
        rtol=1e-5,
        atol=1e-5,
    )
    moe.to(torch.float64)  # new storage: restacked
    assert moe.experts.stacks()[0].dtype == torch.float64


def test_stacking_allocates_the_two_stacks_alone():
    """The experts move into their stacks one by one: no per-expert copy is made on the way (a list of
    concatenations stacked took two gate/up stacks' memory more: Kimi-K2's layer ran out of an H100's)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    moe = make_moe(hidden=16, inter=8, experts=4, top_k=2)
    pack_projections(moe)
    expert_bytes = 2 * 8 * 16 * moe.experts[0].down_proj.weight.element_size()

    class NewStorages(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: dict[int, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(o, torch.Tensor):
                    storage = o.untyped_storage()
                    self.sizes[storage.data_ptr()] = storage.nbytes()
            return out

    before = {p.untyped_storage().data_ptr() for p in moe.parameters()}
    with NewStorages() as seen:
        gate, up, down = moe.experts.stacks()
    made = sorted(n for ptr, n in seen.sizes.items() if ptr not in before and n >= expert_bytes)
    assert made == sorted([down.untyped_storage().nbytes(), gate.untyped_storage().nbytes()])
    assert made == [4 * 16 * 8 * down.element_size(), 4 * 2 * 8 * 16 * gate.element_size()]


# ---- every activation, every layout --------------------------------------------------------------------------


class UngatedMLP(torch.nn.Module):
    """Nemotron-H's expert (models/nemotron_h.py): down(act(up(x)))."""

    def __init__(self, hidden: int, inter: int, act: str) -> None:
        super().__init__()
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)
        self.act = act

    def forward(self, x):
        return self.down_proj(ACTIVATIONS[self.act](self.up_proj(x)))


def routed_experts(
    layout: str, activation: ExpertActivation, hidden=24, inter=20, experts=6
) -> RoutedExperts:
    if layout == "modules":
        mlp = (
            partial(GatedMLP, hidden, inter, activation.name)
            if activation.gated
            else partial(UngatedMLP, hidden, inter, activation.name)
        )
        module = RoutedExperts(activation, [mlp() for _ in range(experts)])
    else:
        module = RoutedExperts(
            activation, stacked=(experts, hidden, inter), packed=layout == "packed"
        )
    return randomise(module).to(DEVICE)


CASES = {  # id -> (layout, activation)
    "silu-modules": ("modules", ExpertActivation("silu")),
    "gelu_tanh-packed": ("packed", ExpertActivation("gelu_pytorch_tanh")),
    "gelu_new-modules": ("modules", ExpertActivation("gelu_new")),
    "silu-clamped-separate": ("separate", ExpertActivation("silu", limit=0.7)),
    "silu-separate": ("separate", ExpertActivation("silu")),
    "relu2-ungated-modules": ("modules", ExpertActivation("relu2", gated=False)),
    "relu2-ungated-separate": ("separate", ExpertActivation("relu2", gated=False)),
}


@pytest.mark.parametrize("n, shared", [(1, False), (5, True), (40, False)])
@pytest.mark.parametrize("case", list(CASES))
def test_every_activation_and_layout_equals_run_experts(case, n, shared):
    experts = routed_experts(*CASES[case])
    x = torch.randn(n, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    weights, ids = routing_of(n, 6, 2, shared, seed=n)
    expected = run_experts(x, weights, ids, experts.eager_experts())
    experts.kernels = True
    torch.testing.assert_close(experts(x, weights, ids), expected, rtol=1e-5, atol=1e-5)


def test_the_kernels_take_the_activation_they_are_given():
    """The same weights under another activation, without the clamp, or ungated give other outputs (so the
    equalities above pin each formula down), and the clamp is active at these sizes."""
    x = torch.randn(5, 24, device=DEVICE)
    weights, ids = routing_of(5, 6, 2, shared=True, seed=5)
    base = routed_experts("separate", ExpertActivation("silu", limit=0.7))
    outs = [kernel_out(base, x, weights, ids)]
    for activation in ("silu", "gelu_tanh"):
        outs.append(grouped_experts(x, weights, ids, *base.stacks(), activation=activation))
    outs.append(grouped_experts(x, weights, ids, None, *base.stacks()[1:], activation="relu2"))
    for i in range(len(outs)):
        for j in range(i):
            assert (outs[i] - outs[j]).abs().max() > 1e-3, (i, j)


def test_the_kernels_serve_cuda_tensors_without_autograd_only(monkeypatch):
    """They have no backward: with autograd on (training) the experts run eagerly even on CUDA."""
    import outpace.layers.grouped_experts as launcher

    experts = routed_experts("modules", ExpertActivation("silu"))
    calls = []
    monkeypatch.setattr(
        launcher, "grouped_experts", lambda *a, **k: calls.append(1) or run_experts(*a[:3], experts)
    )
    x = torch.randn(3, 24, device=DEVICE, requires_grad=True)
    weights, ids = routing_of(3, 6, 2, shared=True, seed=0)
    experts(x, weights, ids).sum().backward()
    assert not calls and x.grad is not None and experts[0].down_proj.weight.grad is not None
    with torch.no_grad():
        experts(x, weights, ids)
    assert len(calls) == (DEVICE == "cuda")


def test_refusals():
    def one_token_of_two_experts(**kwargs):  # x [1, 4], top 1 of 2 ungated experts of 3 rows
        args = (torch.zeros(1, 4), torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.long), None)
        return grouped_experts(*args, torch.zeros(2, 3, 4), torch.zeros(2, 4, 3), **kwargs)

    with pytest.raises(ValueError, match="clamp"):
        ExpertActivation("relu2", gated=False, limit=1.0)
    with pytest.raises(ValueError, match="grouped experts compute"):
        one_token_of_two_experts(activation="gelu")
    assert ExpertActivation("gelu").kernel is None  # erf GELU: no kernel, the eager experts
    with pytest.raises(
        ValueError, match="shared_input"
    ):  # rows for shared slots, and none to read them
        one_token_of_two_experts(activation="relu2", shared_input=torch.zeros(1, 4))
    with pytest.raises(
        ValueError, match="the stream"
    ):  # a stream of other rows than the experts' output
        one_token_of_two_experts(activation="relu2", ready=(torch.zeros(2, 4), torch.ones(4), 0.0))


def test_ungated_shared_experts_fuse_too():
    """Nemotron-H's shape: relu2 experts without a gate, a shared MLP three experts wide."""
    experts = routed_experts("modules", ExpertActivation("relu2", gated=False))
    shared = randomise(UngatedMLP(24, 60, "relu2")).to(DEVICE)
    stacks = shared_expert_stacks(shared, experts)
    assert stacks[0] is None and stacks[1].shape == (3, 20, 24)
    x = torch.randn(5, 24, device=DEVICE)
    weights, ids = routing_of(5, 6, 2, shared=True, seed=2)
    with torch.no_grad():
        expected = run_experts(x, weights, ids, experts.eager_experts()) + shared(x)
        experts.kernels = True
        got = experts.run(x, weights, ids, shared=stacks)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert shared_expert_stacks(UngatedMLP(24, 50, "relu2"), experts) is None  # not 20-wide experts


def test_shared_slots_take_their_weights_where_the_routing_gives_them():
    """Qwen3-Next's gated shared expert: weights [n, top_k + shared], each shared slot times its column."""
    experts = routed_experts("modules", ExpertActivation("silu"))
    shared = randomise(GatedMLP(24, 40, "silu")).to(DEVICE)  # two experts of the routed width
    stacks = shared_expert_stacks(shared, experts)
    x = torch.randn(5, 24, device=DEVICE)
    weights, ids = routing_of(5, 6, 2, shared=True, seed=3)
    gate = torch.rand(5, 1, device=DEVICE)
    with torch.no_grad():
        expected = run_experts(x, weights, ids, experts.eager_experts()) + gate * shared(x)
        experts.kernels = True
        gated = torch.cat([weights, gate.expand(5, 2)], dim=1)  # [n, top_k + shared]
        torch.testing.assert_close(
            experts.run(x, gated, ids, shared=stacks), expected, rtol=1e-5, atol=1e-5
        )
        with pytest.raises(ValueError, match="slots a token"):  # neither top_k nor every slot
            experts.run(x, torch.cat([weights, gate], dim=1), ids, shared=stacks)


def test_qwen3_next_block_fuses_its_gated_shared_expert(tmp_path):
    """Qwen3-Next's MoE block on the kernels with its rows packed (models/qwen3_next.py
    ``RouterWithSharedGate``), its shared expert two routed experts wide: the router, seen by forward
    hooks, gives both shared slots the gate's weight, no shared MLP runs beside the experts, and the block
    equals its torch path."""
    import transformers

    from helpers.hybrid_models import HYBRIDS
    from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
    from outpace.model_config import ModelConfig
    from outpace.models.loader import build_model

    cls_name, extra = HYBRIDS["qwen3_next"]
    extra = {**extra, "shared_expert_intermediate_size": 2 * extra["moe_intermediate_size"]}
    config = getattr(transformers, cls_name)(**extra, architectures=["Qwen3NextForCausalLM"])
    config.save_pretrained(tmp_path)
    model = randomise(build_model(ModelConfig.from_pretrained(tmp_path), torch.float32, DEVICE))
    pack_projections(model)
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeWithSharedExpert)]
    assert blocks and all(b.gate.rows is not None for b in blocks)
    for block in blocks:
        x = torch.randn(7, block.gate.weight.shape[1], device=DEVICE)
        with torch.no_grad():
            block.experts.kernels, block.gate.kernel = False, False
            expected = block(x)
            block.experts.kernels, block.gate.kernel = True, True
            widths = []
            hook = block.gate.register_forward_hook(lambda m, a, out: widths.append(out[0].shape))
            beside = block.shared_expert.register_forward_hook(lambda *a: widths.append("beside"))
            got = block(x)
            hook.remove(), beside.remove()
        assert widths == [(7, block.gate.routing.top_k + 2)]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_qwen3_next_shared_expert_beside_the_experts_joins_their_combine(tmp_path):
    """Qwen3-Next's MoE block whose gated shared expert does not fuse (its router's rows not packed) on the
    fused residual stack (``ReadyStream``): the shared expert's output added in the experts' combine
    (layers/moe.py ``experts_and_beside``), the same bits as the tensor add and the norm kernel, which does
    not run."""
    from unittest.mock import patch

    import transformers

    from helpers.hybrid_models import HYBRIDS
    from outpace.layers import normed_rows as row_norms
    from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
    from outpace.layers.moe import ReadyStream
    from outpace.model_config import ModelConfig
    from outpace.models.loader import build_model

    cls_name, extra = HYBRIDS["qwen3_next"]
    config = getattr(transformers, cls_name)(**extra, architectures=["Qwen3NextForCausalLM"])
    config.save_pretrained(tmp_path)
    model = randomise(build_model(ModelConfig.from_pretrained(tmp_path), torch.float32, DEVICE))
    block = next(m for m in model.modules() if isinstance(m, SparseMoeWithSharedExpert))
    assert block.gate.rows is None  # (not packed: the shared expert runs beside the experts)
    hidden = block.gate.weight.shape[1]
    x, stream = (torch.randn(5, hidden, generator=torch.Generator().manual_seed(i)) for i in (1, 2))
    ready = ReadyStream(stream.to(DEVICE), torch.randn(hidden).to(DEVICE), 0.0)
    with torch.no_grad():
        block.experts.kernels, block.gate.kernel = True, True
        expected = ready.add(block.partial(x.to(DEVICE)))
        with patch.object(row_norms, "normed_rows", side_effect=AssertionError("apart")):
            got = block.partial(x.to(DEVICE), ready=ready)
    assert torch.equal(got.stream, expected.stream) and torch.equal(got.normed, expected.normed)


# ---- every MoE family's module ---------------------------------------------------------------------------------


def family_model(family: str, tmp_path) -> torch.nn.Module:
    """The outpace model of a family's tiny test config (tests/helpers/: hybrid_models.py,
    step3p5_checkpoints.py, gemma_models.py), random weights."""
    import transformers

    from outpace.model_config import ModelConfig
    from outpace.models.loader import build_model

    if family in ("qwen3_next", "nemotron_h", "nemotron_h-latent"):
        from helpers.hybrid_models import HYBRIDS

        cls_name, extra = HYBRIDS[family]
        arch = {"qwen3_next": "Qwen3NextForCausalLM", "nemotron_h": "NemotronHForCausalLM"}[
            family.split("-")[0]
        ]
        getattr(transformers, cls_name)(**extra, architectures=[arch]).save_pretrained(tmp_path)
    elif family == "gemma4":
        from helpers.gemma_models import GEMMA4_MOE_SHARED

        config = transformers.Gemma4TextConfig(
            **GEMMA4_MOE_SHARED, architectures=["Gemma4ForCausalLM"]
        )
        config.save_pretrained(tmp_path)
    elif family == "step3p5":
        from helpers.step3p5_checkpoints import CONFIG

        (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    else:
        from helpers.deepseek_models import make_hf_deepseek

        config = make_hf_deepseek("v3-yarn").config
        config.architectures = ["DeepseekV3ForCausalLM"]
        config.save_pretrained(tmp_path)
    return randomise(
        build_model(ModelConfig.from_pretrained(tmp_path), torch.float32, DEVICE)
    ).eval()


def previous_experts(module: RoutedExperts, family: str) -> list:
    """The routed experts as each family's code computed them before RoutedExperts."""
    if family == "step3p5":  # Step3p5MoE.expert
        from outpace.models.step3p5 import clamped_swiglu

        def expert(e, x):
            act = clamped_swiglu(
                project(x, module.gate_proj.weight[e]),
                project(x, module.up_proj.weight[e]),
                module.activation.limit,
            )
            return project(act, module.down_proj.weight[e])
    elif family == "gemma4":  # Gemma4Experts.expert

        def expert(e, x):
            gate, up = F.linear(x, module.gate_up_proj[e]).chunk(2, dim=-1)
            return F.linear(ACTIVATIONS[module.activation.name](gate) * up, module.down_proj[e])
    else:  # an nn.ModuleList of the family's MLPs
        return torch.nn.ModuleList(module.per_expert)
    return [partial(expert, e) for e in range(len(module))]


def family_moe(owner: torch.nn.Module, experts: RoutedExperts, x: torch.Tensor) -> torch.Tensor:
    """The family's MoE block over x [n, hidden]: its router, its routed experts and its shared experts
    (Gemma 4: the layer's router and experts; the layer adds the dense MLP)."""
    return experts.run(x, *owner.router(x)) if hasattr(owner, "router") else owner(x)


@pytest.mark.parametrize(
    "family, kernel",
    [
        ("deepseek", "silu"),
        ("qwen3_next", "silu"),
        ("nemotron_h", "relu2"),
        ("step3p5", "silu"),
        ("gemma4", "gelu_tanh"),
    ],
)
def test_each_family_moe_equals_its_previous_output_and_the_kernels(family, kernel, tmp_path):
    model = family_model(family, tmp_path)
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, RoutedExperts)]
    assert found, f"{family}: no RoutedExperts"
    for i, (name, experts) in enumerate(found):
        owner = (
            experts if hasattr(experts, "gate") else model.get_submodule(name.rpartition(".")[0])
        )
        assert experts.activation.kernel == kernel
        x = torch.randn(9, experts.stacks()[2].shape[1], device=DEVICE)
        weights, ids = routing_of(9, len(experts), 2, shared=True, seed=i)
        with torch.no_grad():
            experts.kernels = False
            eager, eager_block = experts.run(x, weights, ids), family_moe(owner, experts, x)
            assert torch.equal(
                eager, run_experts(x, weights, ids, previous_experts(experts, family))
            )
            experts.kernels = True
            torch.testing.assert_close(experts.run(x, weights, ids), eager, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                family_moe(owner, experts, x), eager_block, rtol=1e-5, atol=1e-5
            )
    if family == "step3p5":
        assert {m.activation.limit for _, m in found} == {
            None,
            0.3,
        }  # clamped layers run through the clamp


@pytest.mark.parametrize("n", [1, 3, 9])
def test_nemotron_latent_moe_on_the_kernels_equals_its_eager_block(n, tmp_path):
    """Nemotron-H's latent MoE (models/nemotron_h.py NemotronHMoE._latent): the kernels route on x and run the
    experts on fc1_latent_proj(x); both paths equal fc2(experts(fc1(x))) + shared(x) written out here."""
    from outpace.models.nemotron_h import NemotronHMoE

    model = family_model("nemotron_h-latent", tmp_path)
    (block,) = [m for m in model.modules() if isinstance(m, NemotronHMoE)]
    x = torch.randn(n, block.fc1_latent_proj.weight.shape[1], device=DEVICE)  # [n, hidden]
    with torch.no_grad():
        block.experts.kernels = False
        z = block.fc1_latent_proj(x)  # [n, latent]
        routed = run_experts(z, *block.gate(x), previous_experts(block.experts, "nemotron_h"))
        written_out = block.fc2_latent_proj(routed) + block.shared_experts(x)
        torch.testing.assert_close(block(x), written_out, rtol=1e-5, atol=1e-5)
        block.experts.kernels = True
        assert block.experts.uses_kernels(x)
        torch.testing.assert_close(block(x), written_out, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu  # bf16 at the DeepSeek-V2-Lite expert shape: GPU only
@pytest.mark.parametrize("n", [1, 4, 8, 32])
def test_bf16_at_the_v2_lite_shape(n):
    moe = make_moe(hidden=2048, inter=1408, experts=64, top_k=6, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.02)
    x = torch.randn(n, 2048, device=DEVICE, dtype=torch.bfloat16)
    weights, ids = routing_of(n, 64, 6, shared=False, seed=n)
    reference = copy.deepcopy(
        moe.experts
    ).float()  # before the kernel stacks them (its parameters become views)
    got = kernel_out(moe.experts, x, weights, ids)
    expected = run_experts(x.float(), weights, ids, reference)  # float32 reference
    assert ((got.float() - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.gpu  # bf16 at the DeepSeek-V2-Lite shape: GPU only
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_bf16_v2_lite_moe_with_fused_shared_experts(n):
    """The whole MoE block on the kernels (routing kernel, fused shared experts) against a float32 eager
    copy, at every token count to 64."""
    moe = make_moe(hidden=2048, inter=1408, experts=64, top_k=6, dtype=torch.bfloat16, shared=2)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.02)
    reference = copy.deepcopy(moe).float()
    reference.experts.kernels = False
    x = torch.randn(n, 2048, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        assert shared_expert_stacks(moe.shared_experts, moe.experts) is not None
        got = moe(x)
        weights, ids = moe.gate(x)  # the routing the block took (deterministic)
        expected = reference.experts(x.float(), weights, ids) + reference.shared_experts(x.float())
    assert ((got.float() - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.gpu  # bf16 at the Qwen3-Next-80B MoE shape: GPU only
@pytest.mark.parametrize("n", [1, 8, 32])
def test_bf16_qwen3_next_block_with_its_gated_shared_expert_fused(n, tmp_path):
    """Qwen3-Next-80B's MoE block (bench/family_shapes.py: hidden 2048, 512 experts of 512, top 10, one gated
    shared expert of 512) on the kernels with its shared expert fused and weighted by its gate, against a
    float32 eager copy over the routing the kernels chose."""
    from outpace.bench.family_shapes import QWEN3_NEXT_80B, slice_layers
    from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
    from outpace.model_config import ModelConfig
    from outpace.models.loader import build_model

    (tmp_path / "config.json").write_text(json.dumps(slice_layers(QWEN3_NEXT_80B, 1)))
    model = build_model(ModelConfig.from_pretrained(tmp_path), torch.bfloat16, DEVICE)
    block = next(m for m in model.modules() if isinstance(m, SparseMoeWithSharedExpert))
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02)
    reference = copy.deepcopy(block).float()
    reference.experts.kernels, reference.gate.kernel = False, False
    pack_projections(block)
    assert block.gate.rows is not None
    x = torch.randn(n, 2048, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        widths = []
        hook = block.gate.register_forward_hook(lambda m, a, out: widths.append(out[0].shape[1]))
        got = block(x)
        hook.remove()
        weights, ids = block.gate(
            x
        )  # the routing the block took (deterministic), without the shared slot
        expected = reference.experts(x.float(), weights, ids) + reference._gated_shared(x.float())
    assert widths == [block.gate.routing.top_k + 1]  # the shared slot weighted by the gate
    assert ((got.float() - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.gpu  # CUDA graphs: GPU only
@pytest.mark.parametrize("n", [1, 8, 64])
def test_moe_block_replays_in_a_cuda_graph(n):
    """Routing, layout, grouped and combine kernels captured once replay new inputs exactly."""
    moe = make_moe(hidden=256, inter=128, experts=16, top_k=4, dtype=torch.bfloat16, shared=2)
    x = torch.randn(n, 256, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        moe(x)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, moe(x))
