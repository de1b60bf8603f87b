"""The routing kernels (layers/moe_routing_kernel.py) against the torch router (layers/moe.py
``Router.reference``) in Triton's interpreter (fp32 on the CPU; the DeepSeek shapes on the GPU): softmax and
sigmoid scores, with and without the correction bias, without groups and with groups scored "max" (V2) or
"top2_sum" (V3), renormalised or not, scaled; decode and verify widths (a program per token, the last to
finish also writing the block layout) and a prefill-sized batch (a program per block of tokens, the layout
by ``align``); an expert-parallel rank's layout (its experts only, as local indices: the eager
``ExpertPlacement.local_ids`` then ``align`` it replaces); the tie rule; the split router matvec at an odd
hidden size. The interpreter runs the programs one after the other: it checks the layout and the ticket's
reset, not the memory ordering (layers/moe_routing_kernel.py's docstring argues that)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.routing_checks import assert_same_routing, by_expert  # noqa: E402
from outpace.layers import moe_routing_kernel  # noqa: E402
from outpace.layers.expert_blocks import align  # noqa: E402
from outpace.layers.moe import ExpertPlacement  # noqa: E402
from outpace.layers.moe_routing_kernel import (  # noqa: E402
    FUSED_LAYOUT_TOKENS,
    layout_scratch,
    route,
    router_logits,
    select_experts,
)
from outpace.layers.router import Router, Routing  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

ROUTINGS = {  # id -> Routing over 24 experts
    "v2-softmax": Routing(24, 4, "softmax"),
    "softmax-normalised-scaled": Routing(24, 3, "softmax", normalize=True, scaling=2.5),
    "v2-groups-max": Routing(24, 3, "softmax", 6, 3, "max", scaling=1.5),
    "v3-sigmoid-bias-top2-sum": Routing(24, 4, "sigmoid", 4, 2, "top2_sum", True, True, 2.5),
    "sigmoid-bias-no-groups": Routing(24, 4, "sigmoid", correction_bias=True, normalize=True),
    "sigmoid-groups-unnormalised": Routing(24, 2, "sigmoid", 3, 1, "top2_sum"),
}


def make_router(routing: Routing, hidden: int, seed: int = 0) -> Router:
    g = torch.Generator().manual_seed(seed)
    router = Router(hidden, routing)
    with torch.no_grad():
        # logits of about unit size: sigmoid scores far from saturating to ties at 1.0
        router.weight.copy_(torch.randn(router.weight.shape, generator=g) * hidden**-0.5)
        if routing.correction_bias:
            router.e_score_correction_bias.copy_(torch.randn(routing.num_experts, generator=g))
    return router.to(DEVICE)


@pytest.mark.parametrize("n", [1, 5, 70])
@pytest.mark.parametrize("case", list(ROUTINGS))
def test_kernel_routes_the_same_float32_scores_as_torch(case, n):
    """x one-hot rows: the router logits are the weight's columns exactly on both paths (one product, the
    rest zeros), so both score the same float32 logits and must choose the same experts."""
    router = make_router(ROUTINGS[case], hidden=n, seed=n)
    x = torch.eye(n, device=DEVICE)
    expected = router.reference(x)
    router.kernel = True
    weights, ids = router(x)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert_same_routing((weights, ids), expected)
    assert all(len(set(row)) == ids.shape[1] for row in ids.tolist())  # distinct experts per token


def assert_layout_of_align(layout, ids, num_routed: int, num_shared: int) -> None:
    """layout is the block layout ``align`` writes for ids, bit for bit."""
    expected = align(ids, num_routed, num_shared)
    assert layout.block_m == expected.block_m
    assert torch.equal(layout.block_expert, expected.block_expert)
    assert torch.equal(layout.sorted_pairs, expected.sorted_pairs)


@pytest.mark.parametrize(
    "n, num_shared",
    [(1, 0), (1, 2), (2, 1), (5, 2), (64, 1), (65, 0), (70, 2), (128, 1), (129, 0)],
)
def test_routing_writes_the_block_layout_of_its_ids(n, num_shared):
    """Up to 128 tokens (FUSED_LAYOUT_TOKENS) the last routing program to finish also places the pairs
    (shared slots included) into the grouped kernels' blocks (one token's program from its registers; past 64
    tokens the masks' second word): the layout ``align`` writes for those ids, and the ticket and both words
    of the token masks are zero again afterwards; from 129 tokens, align's own."""
    routing = ROUTINGS["v3-sigmoid-bias-top2-sum"]
    router = make_router(routing, hidden=33, seed=n)
    router.kernel = True
    x = torch.randn(n, 33, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    weights, ids, layout = router(x, num_shared, layout=True)
    assert_same_routing((weights, ids), router.reference(x))
    assert_layout_of_align(layout, ids, routing.num_experts, num_shared)
    if n <= FUSED_LAYOUT_TOKENS:
        scratch = layout_scratch(x.device, routing.num_experts + num_shared)
        assert not scratch.any()


def test_small_blocks_past_64_tokens_lay_out_as_align(monkeypatch):
    """With 16-row blocks up to 128 tokens (expert_blocks.small_blocks_max_tokens, a setting the decode step
    measures) 70 tokens' layout is still align's, in blocks of 16."""
    from outpace.layers import expert_blocks

    monkeypatch.setattr(expert_blocks, "small_blocks_max_tokens", 128)
    routing = ROUTINGS["v3-sigmoid-bias-top2-sum"]
    router = make_router(routing, hidden=33, seed=70)
    router.kernel = True
    x = torch.randn(70, 33, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(70))
    _, ids, layout = router(x, 2, layout=True)
    assert layout.block_m == 16
    assert_layout_of_align(layout, ids, routing.num_experts, 2)


# of 24 experts: (first, count) of an expert-parallel rank at the start, in the middle, at the end; an odd one
RANGES = {"start": (0, 8), "middle": (8, 8), "end": (16, 8), "odd": (5, 7)}


def placed_experts(layout, pairs: int) -> torch.Tensor:
    """layout -> [pairs] the expert whose block holds each pair, -1 for a pair in none."""
    rows = layout.sorted_pairs.view(-1, layout.block_m)  # [blocks, block_m]
    experts = layout.block_expert[:, None].expand_as(rows)
    real = rows < pairs  # (padding rows hold ``pairs``)
    placed = torch.full((pairs,), -1, dtype=torch.int32, device=rows.device)
    placed[rows[real].long()] = experts[real]
    return placed


def assert_layout_of_range(layout, ids, placement: ExpertPlacement, num_shared: int) -> None:
    """layout is the eager expert-parallel path's (the placement's local ids, then ``align``), bit for bit,
    and holds each pair in the block of its local expert, another rank's in none."""
    local = placement.local_ids(ids)  # [n, top_k]
    assert_layout_of_align(layout, local, placement.count, num_shared)
    shared = placement.count + torch.arange(num_shared, device=ids.device)  # [num_shared]
    slots = torch.cat([local, shared.expand(ids.shape[0], -1)], dim=1)  # [n, top_k + num_shared]
    assert torch.equal(placed_experts(layout, slots.numel()), slots.flatten().int())


# (routing, range, n, num_shared): every routing, range and count, not every combination (the interpreter is
# slow; 64 tokens on the kernel take seconds): each range laid out by the last program (up to 128 tokens, 70 in
# both mask words) and by ``align`` (130) once at least, each routing both ways, the odd range at 64
RANGE_CASES = [
    ("v2-groups-max", "start", 1, 0),
    ("v3-sigmoid-bias-top2-sum", "odd", 1, 2),
    ("sigmoid-bias-no-groups", "middle", 3, 1),
    ("v3-sigmoid-bias-top2-sum", "end", 17, 2),
    ("sigmoid-bias-no-groups", "odd", 64, 1),
    ("v3-sigmoid-bias-top2-sum", "start", 70, 2),
    ("v2-groups-max", "middle", 70, 2),
    ("sigmoid-bias-no-groups", "end", 130, 2),
    ("v3-sigmoid-bias-top2-sum", "odd", 130, 2),
    ("v2-groups-max", "middle", 130, 0),
]


@pytest.mark.parametrize("case, where, n, num_shared", RANGE_CASES)
def test_routing_writes_an_expert_ranges_layout(case, where, n, num_shared):
    """Routed for an ``ExpertPlacement`` (an expert-parallel rank's experts): the weights and ids of every
    expert, as routing without one gives them bit for bit, and the layout of the range's experts only, as
    local indices (module docstring 4.), by the last program up to 128 tokens, by ``align`` of the local ids
    beyond; the ticket and masks zero again."""
    routing = ROUTINGS[case]
    router = make_router(routing, hidden=33, seed=n)
    router.kernel = True
    x = torch.randn(n, 33, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    placement = ExpertPlacement(routing.num_experts, *RANGES[where])
    weights, ids, layout = router(x, num_shared, layout=placement)
    assert_same_routing((weights, ids), router.reference(x))
    all_weights, all_ids, _ = router(x, num_shared, layout=True)
    assert torch.equal(weights, all_weights) and torch.equal(ids, all_ids)
    assert_layout_of_range(layout, ids, placement, num_shared)
    assert not layout_scratch(x.device, placement.count + num_shared).any()


@pytest.mark.parametrize("n", [1, 6, 70, 130])
@pytest.mark.parametrize("num_shared", [0, 1])
def test_an_expert_range_no_token_chose(n, num_shared):
    """A rank none of whose experts was chosen: a layout of the shared slots only, or of no block at all."""
    routing = ROUTINGS["softmax-normalised-scaled"]
    partial = torch.randn(2, n, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    partial[:, :, 8:16] = -20.0  # (experts 8 .. 15 never among a token's best 3)
    placement = ExpertPlacement(24, 8, 8)
    _, ids, layout = select_experts(partial, None, routing, num_shared, layout=placement)
    assert not ((ids >= 8) & (ids < 16)).any()
    assert_layout_of_range(layout, ids, placement, num_shared)
    used = layout.block_expert[layout.block_expert >= 0]  # (the shared expert is local expert 8)
    shared_blocks = (n + layout.block_m - 1) // layout.block_m
    assert used.eq(8).all() and used.numel() == (shared_blocks if num_shared else 0)


def test_consecutive_launches_each_write_their_layout():
    """The ticket and the masks are reset by each launch's last program: launches of 5, 3 and 5 tokens in a
    row (other hidden states each time, so that no stale layout can pass) each write their own layout."""
    routing = ROUTINGS["v2-groups-max"]
    router = make_router(routing, hidden=29, seed=11)
    router.kernel = True
    g = torch.Generator(DEVICE).manual_seed(12)
    for n in (5, 3, 5):
        x = torch.randn(n, 29, device=DEVICE, generator=g)
        weights, ids, layout = router(x, 1, layout=True)
        assert_same_routing((weights, ids), router.reference(x))
        assert_layout_of_align(layout, ids, routing.num_experts, 1)
        assert not layout_scratch(x.device, routing.num_experts + 1).any()


@pytest.mark.parametrize("case", ["softmax-normalised-scaled", "v3-sigmoid-bias-top2-sum"])
def test_a_tokens_routing_is_the_same_bits_in_any_batch(case):
    """Up to 64 tokens each token has a program of its own: its weights and ids are those it gets routed
    alone, bit for bit (the parallel path indexes each token's logits and outputs right)."""
    routing = ROUTINGS[case]
    partial = torch.randn(2, 5, 24, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(5))
    bias = torch.randn(24, device=DEVICE) if routing.correction_bias else None
    weights, ids, _ = select_experts(partial, bias, routing, 1, layout=True)
    for t in range(5):
        alone_w, alone_i, _ = select_experts(
            partial[:, t : t + 1].contiguous(), bias, routing, 1, layout=True
        )
        assert torch.equal(alone_w[0], weights[t]) and torch.equal(alone_i[0], ids[t])


@pytest.mark.parametrize("case", list(ROUTINGS))
def test_kernel_equals_torch_on_random_hidden_states(case):
    """Random x at an odd hidden size: the logits differ from torch's in rounding only (another summation
    order), far from any tie at these sizes."""
    router = make_router(ROUTINGS[case], hidden=197, seed=3)
    x = torch.randn(7, 197, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(7))
    expected = router(x)  # the torch path off CUDA
    router.kernel = True
    assert_same_routing(router(x), expected)


@pytest.mark.parametrize("n", [1, 6])
@pytest.mark.parametrize("case", ["softmax-normalised-scaled", "v3-sigmoid-bias-top2-sum"])
def test_a_stream_made_ready_for_its_norm_routes_as_the_norm(case, n):
    """``RowNorm``: x is a stream times its norm's weight (``NormedRows``, sums of squares in parts over an
    odd hidden size) and the kernel scales each token's logits by the norm's factor: the routing of the
    normalised stream, and the factor written for the gate/up kernel."""
    from outpace.layers.moe import RowNorm
    from outpace.layers.norm import rms_norm_torch
    from outpace.layers.normed_rows import NormedRows, normed_rows

    g = torch.Generator().manual_seed(n)
    hidden, eps = 197, 1e-6
    stream, w = torch.randn(n, hidden, generator=g), torch.rand(hidden, generator=g) + 0.5
    router = make_router(ROUTINGS[case], hidden=hidden, seed=n)
    expected = router(rms_norm_torch(stream, w, eps)[0].to(DEVICE))  # the torch path off CUDA
    rows = normed_rows(stream.to(DEVICE), w.to(DEVICE))
    parts = torch.stack([c.pow(2).sum(dim=1) for c in stream.chunk(3, dim=1)])  # [3, n]
    row_norm = RowNorm.of(NormedRows(rows.stream, rows.normed, parts.to(DEVICE)), eps)
    router.kernel = True
    assert_same_routing(router(rows.normed, row_norm=row_norm), expected)
    rstd = torch.rsqrt(stream.pow(2).mean(dim=1) + eps)
    torch.testing.assert_close(row_norm.scale.cpu(), rstd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tokens, hidden", [(3, 1097), (40, 197), (70, 4097)])
@pytest.mark.parametrize("many_token_programs", [264, 1056])
def test_split_router_logits_sum_to_the_matvec(tokens, hidden, many_token_programs, monkeypatch):
    """An odd hidden size over several splits of the hidden dimension (few tokens: 256-wide steps; more:
    64-wide; past 64 tokens as many splits as ``many_token_logit_programs`` asks), bf16 x converted in the
    kernel."""
    from outpace.layers import moe_routing_kernel

    monkeypatch.setattr(moe_routing_kernel, "many_token_logit_programs", many_token_programs)
    g = torch.Generator(DEVICE).manual_seed(1)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g).to(torch.bfloat16)
    w = torch.randn(40, hidden, device=DEVICE, generator=g)
    partial = router_logits(x, w)
    assert partial.shape[0] > 1 and partial.shape[1:] == (tokens, 40)
    torch.testing.assert_close(partial.sum(0), x.float() @ w.T, rtol=1e-5, atol=1e-4)
    w16 = w.to(torch.bfloat16)  # a router weight in the model's dtype: converted in the kernel too
    torch.testing.assert_close(
        router_logits(x, w16).sum(0), x.float() @ w16.float().T, rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_the_dot_path_at_each_precision_is_the_matvec(precision, monkeypatch):
    """The tl.dot path (past ``per_token_max`` tokens) at each ``dot_precision``: float32's accuracy (on the GPU
    tf32x3's three tensor-core products; Triton's interpreter multiplies in float32 either way)."""
    from outpace.layers import moe_routing_kernel

    monkeypatch.setattr(moe_routing_kernel, "dot_precision", precision)
    tokens, hidden, experts = 40, 1097, 40
    assert not moe_routing_kernel.logit_splits(tokens, hidden, experts).few
    g = torch.Generator(DEVICE).manual_seed(2)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g).to(torch.bfloat16)
    w = torch.randn(experts, hidden, device=DEVICE, generator=g)
    expected = (x.double() @ w.double().T).float()
    torch.testing.assert_close(router_logits(x, w).sum(0), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("tokens", [17, 40])
def test_router_logits_take_the_per_token_sums_up_to_per_token_max(tokens, monkeypatch):
    """Outside batch-invariant mode the per-token sums serve up to ``per_token_max`` tokens (at 32 here), over
    several 16-token blocks with the splits of one block; the tl.dot path beyond: both the matvec."""
    from outpace.layers import moe_routing_kernel

    monkeypatch.setattr(moe_routing_kernel, "per_token_max", 32)
    hidden, experts = 1097, 40
    split = moe_routing_kernel.logit_splits(tokens, hidden, experts)
    assert split.few == (tokens <= 32)
    # splits as for one block: at a router whose expert tiles bound them, two token blocks' tiles would halve them
    wide = moe_routing_kernel.logit_splits(tokens, 4096, 144)
    assert (wide == moe_routing_kernel.logit_splits(1, 4096, 144)) == split.few
    g = torch.Generator(DEVICE).manual_seed(tokens)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g).to(torch.bfloat16)
    w = torch.randn(experts, hidden, device=DEVICE, generator=g)
    partial = router_logits(x, w)
    assert partial.shape == (split.splits, tokens, experts)
    torch.testing.assert_close(partial.sum(0), x.float() @ w.T, rtol=1e-5, atol=1e-4)


SORTED_CASES = [(case, r) for case, r in ROUTINGS.items() if not r.correction_bias]
SORTED_CASES += [("qwen3-next-512", Routing(512, 10, "softmax", normalize=True))]


@pytest.mark.parametrize("n", [1, 5, 70])
@pytest.mark.parametrize("case, routing", SORTED_CASES, ids=[c for c, _ in SORTED_CASES])
def test_a_sorted_top_k_chooses_as_the_rounds_of_max(case, routing, n, monkeypatch):
    """``sorted_top_k_experts``: one partial sort of each token's keys gives the experts, their order, their weights and
    the block layout of the top_k rounds of max, bit for bit (logits in two splits; token 0's all equal: every
    expert ties)."""
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(2, n, routing.num_experts, generator=g).to(DEVICE)
    logits[:, 0] = 0.0
    runs = []
    for from_experts in (None, 1):  # (the rounds of max, then the sort)
        monkeypatch.setattr(moe_routing_kernel, "sorted_top_k_experts", from_experts)
        runs.append(select_experts(logits, None, routing, layout=True))
    (w_rounds, i_rounds, l_rounds), (w_sorted, i_sorted, l_sorted) = runs
    assert torch.equal(i_sorted, i_rounds) and torch.equal(w_sorted, w_rounds)
    assert i_rounds[0].tolist() == list(range(routing.top_k))
    if n <= 64:  # (the layout in the route kernel's launch)
        assert torch.equal(l_sorted.block_expert, l_rounds.block_expert)
        assert torch.equal(l_sorted.sorted_pairs, l_rounds.sorted_pairs)


def test_ties_go_to_the_lowest_expert_and_group():
    """Equal scores: the lowest indices (the documented tie rule), for experts and for groups."""
    logits = torch.zeros(1, 2, 16, device=DEVICE)
    # token 0: every expert ties; token 1: experts 12..15 best (group 3 of 4), the other groups tie
    logits[0, 1, 12:] = 1.0
    weights, ids, _ = select_experts(logits, None, Routing(16, 3, "softmax"))
    assert ids[0].tolist() == [0, 1, 2] and ids[1].tolist() == [12, 13, 14]
    e = torch.e
    torch.testing.assert_close(
        weights, torch.tensor([[1 / 16] * 3, [e / (12 + 4 * e)] * 3]).to(DEVICE)
    )
    grouped = Routing(16, 6, "sigmoid", num_groups=4, top_groups=2, group_score="top2_sum")
    _, ids, _ = select_experts(logits, None, grouped)
    assert sorted(ids[0].tolist()) == [0, 1, 2, 3, 4, 5]  # groups 0 and 1
    assert sorted(ids[1].tolist()) == [0, 1, 12, 13, 14, 15]  # group 3, then the lowest of the rest


def test_refusals():
    with pytest.raises(ValueError, match="correction bias"):
        select_experts(
            torch.zeros(1, 1, 8, device=DEVICE),
            None,
            Routing(8, 2, "sigmoid", correction_bias=True),
        )
    with pytest.raises(ValueError, match="a placement of 12 experts for routing over 8"):
        select_experts(
            torch.zeros(1, 1, 8, device=DEVICE),
            None,
            Routing(8, 2, "softmax"),
            0,
            ExpertPlacement(12, 0, 6),
        )


# ---- the GPU: the DeepSeek shapes --------------------------------------------------------------------------

GPU_ROUTINGS = {
    "v2-lite": (2048, Routing(64, 6, "softmax")),
    "v2-groups": (5120, Routing(160, 6, "softmax", 8, 3, "max", scaling=16.0)),
    "v3": (7168, Routing(256, 8, "sigmoid", 8, 4, "top2_sum", True, True, 2.5)),
}


@pytest.mark.gpu  # the DeepSeek router shapes in bf16: GPU only
@pytest.mark.parametrize("n", [1, 4, 8, 32, 64, 200])
@pytest.mark.parametrize("case", list(GPU_ROUTINGS))
def test_gpu_deepseek_shapes(case, n):
    """bf16 hidden states: the same experts as torch except at near-ties (logits rounded differently),
    the weights of the tokens that chose the same experts equal to float32 rounding."""
    hidden, routing = GPU_ROUTINGS[case]
    router = make_router(routing, hidden, seed=n)
    x = torch.randn(n, hidden, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n))
    x = x.to(torch.bfloat16)
    router.kernel = False
    exp_w, exp_i = by_expert(*router(x))
    router.kernel = True
    got_w, got_i = by_expert(*router(x))
    same = (got_i == exp_i).all(dim=1)
    assert same.float().mean() >= 0.95
    torch.testing.assert_close(got_w[same], exp_w[same], rtol=1e-4, atol=1e-5)


GPU_LAYOUT_ROUTINGS = {  # id -> (Routing, shared slots, shared gate): the fused layout at real widths
    "v2-lite": (Routing(64, 6, "softmax"), 0, False),
    "v3": (Routing(256, 8, "sigmoid", 8, 4, "top2_sum", True, True, 2.5), 1, False),
    "qwen3-next": (Routing(512, 10, "softmax", normalize=True), 1, True),
}


@pytest.mark.gpu  # programs running at once on the SMs: GPU only
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize(
    "n", [1, 2, 5, 8, 32, 64, 65, 96, 128]
)  # (past 64: the masks' second word)
@pytest.mark.parametrize("case", list(GPU_LAYOUT_ROUTINGS))
def test_gpu_parallel_routing_lays_out_in_a_cuda_graph(case, n, ranks):
    """The programs of a launch finish in any order on the GPU (the interpreter runs them in turn): captured
    once and replayed on 30 new inputs, every replay's layout is align's of its ids (with two expert-parallel
    ranks, of the last rank's local ids) and its ids and weights are the eager call's, bit for bit; the
    ticket and masks are zero after each."""
    routing, shared, gate = GPU_LAYOUT_ROUTINGS[case]
    count = routing.num_experts // ranks
    placement = ExpertPlacement(routing.num_experts, routing.num_experts - count, count)
    g = torch.Generator(DEVICE).manual_seed(n)
    partial = torch.randn(4, n, routing.num_experts + gate, device=DEVICE, generator=g)
    bias = torch.randn(routing.num_experts, device=DEVICE, generator=g) * 0.1
    bias = bias if routing.correction_bias else None

    def call():
        return select_experts(partial, bias, routing, shared, layout=placement, shared_gate=gate)

    call()  # (the scratch is allocated eagerly)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids, layout = call()
    scratch = layout_scratch(partial.device, count + shared)
    for _ in range(30):
        partial.copy_(torch.randn(partial.shape, device=DEVICE, generator=g))
        graph.replay()
        eager_w, eager_i, _ = call()
        assert torch.equal(ids, eager_i) and torch.equal(weights, eager_w)
        assert_layout_of_range(layout, ids, placement, shared)
        assert not scratch.any()


@pytest.mark.parametrize(
    "n, num_shared, layout", [(1, 1, True), (6, 2, True), (70, 1, True), (5, 1, False)]
)
def test_a_shared_gate_row_weights_the_shared_slots(n, num_shared, layout):
    """The router weight with one more row (Qwen3-Next's shared_expert_gate, models/qwen3_next.py
    ``RouterWithSharedGate``): the routing and the block layout of the weight alone, and after the top_k
    weights each shared slot's, sigmoid(x @ gate)."""
    routing = ROUTINGS["softmax-normalised-scaled"]
    router = make_router(routing, hidden=33, seed=n)
    g = torch.Generator(DEVICE).manual_seed(n)
    gate = torch.randn(1, 33, device=DEVICE, generator=g) * 33**-0.5
    x = torch.randn(n, 33, device=DEVICE, generator=g)
    rows = torch.cat([router.weight, gate])  # [experts + 1, hidden]
    weights, ids, blocks = route(x, rows, None, routing, num_shared, layout, shared_gate=True)
    alone_weights, alone_ids, alone_blocks = route(
        x, router.weight, None, routing, num_shared, layout
    )
    top_k = routing.top_k
    assert weights.shape == (n, top_k + num_shared) and torch.equal(ids, alone_ids)
    torch.testing.assert_close(weights[:, :top_k], alone_weights, rtol=1e-6, atol=1e-7)
    expected = torch.sigmoid(x @ gate.T).expand(n, num_shared)  # [n, num_shared]
    torch.testing.assert_close(weights[:, top_k:], expected, rtol=1e-5, atol=1e-6)
    if layout:
        assert torch.equal(blocks.sorted_pairs, alone_blocks.sorted_pairs)
        assert torch.equal(blocks.block_expert, alone_blocks.block_expert)
    with pytest.raises(ValueError, match="num_shared"):
        route(x, rows, None, routing, 0, layout, shared_gate=True)
