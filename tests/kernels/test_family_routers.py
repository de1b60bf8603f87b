"""Step-3.5-Flash's and Gemma 4's MoE blocks on the kernels (layers/moe.py ``moe_on_kernels``: the routing
kernel of layers/moe_routing_kernel.py writing the grouped kernels' block layout, the grouped experts of
layers/moe_kernels.py, a shared expert fused as weight-1 experts) against their eager paths, in Triton's
interpreter on the CPU (float32): odd sizes, decode (1 token) and verify widths 2..8 of several sequences,
and a prefill-sized batch (its layout from ``align``).

- Gemma 4's router (transformers Gemma4TextRouter): softmax of proj(RMSNorm(x) * scale / sqrt(hidden)),
  the top k renormalised, times per_expert_scale: the norm and the scales folded into the routing kernel
  (``RouterInputNorm``, ``expert_scale``); the test fails with any of them dropped.
- Step-3.5 (sigmoid, router_bias to choose, renormalised, times the scaling factor: DeepSeek-V3's routing
  without groups): its shared expert fused where its clamp is the routed experts' (the kernels clamp every
  slot with one limit) and added after them where it is not.
The GPU (bf16, the public shapes, CUDA graphs) at the end, skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")

from helpers.routing_checks import assert_same_routing, by_expert  # noqa: E402
from outpace.layers.expert_blocks import align  # noqa: E402
from outpace.layers.moe import RoutedExperts, shared_expert_stacks  # noqa: E402
from outpace.model_config import ModelConfig  # noqa: E402
from outpace.models.gemma4 import Gemma4Experts, Gemma4Moe, Gemma4Router  # noqa: E402
from outpace.models.step3p5 import Step3p5MLP, Step3p5MoE  # noqa: E402
from outpace.models.step3p5_config import Step3p5Config  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# decode (1 token), verify widths 2..8 over a few sequences, a batch of 32 verifying 2 or 3 (> 64: the token
# masks' second word)
TOKENS = [1, 2, 3 * 5, 4 * 8, 70]
# the routing alone also at the most tokens the routing kernel lays out itself (FUSED_LAYOUT_TOKENS) and one
# more (align's layout)
ROUTER_TOKENS = [*TOKENS, 128, 129]


@pytest.fixture(autouse=True)
def _no_autograd():
    with torch.no_grad():
        yield


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randomise(module: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    """Every parameter and buffer of module normal(0, std), then moved to DEVICE."""
    g = _generator(seed)
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            t.copy_(torch.randn(t.shape, generator=g) * std)
    return module.to(DEVICE)


# ---- Gemma 4 --------------------------------------------------------------------------------------------

GEMMA = Gemma4Moe(num_experts=19, top_k=3, intermediate_size=24)
HIDDEN = 197  # odd: the router's matvec over several splits with a ragged tail


def gemma_router(seed: int = 0, hidden: int = HIDDEN) -> Gemma4Router:
    router = randomise(Gemma4Router(hidden, GEMMA, eps=1e-6), seed)
    with torch.no_grad():  # the checkpoint's magnitudes: scales about 1, logits about unit size
        router.scale.add_(1.0)
        router.per_expert_scale.copy_(0.5 + torch.rand(GEMMA.num_experts, generator=_generator(1)))
        router.proj.weight.mul_(3.0)
    return router


@pytest.mark.parametrize("n", ROUTER_TOKENS)
def test_gemma4_router_kernel_equals_its_torch_router(n):
    """Rows of different magnitudes (the norm is one number a token), layout and no layout."""
    router = gemma_router(seed=n)
    g = _generator(100 + n)
    x = (torch.randn(n, HIDDEN, generator=g) * (0.1 + 5 * torch.rand(n, 1, generator=g))).to(DEVICE)
    expected = router(x)  # the torch path off CUDA
    router.kernel = True
    assert_same_routing(router(x), expected)
    weights, ids, layout = router(x, layout=True)
    assert_same_routing((weights, ids), expected)
    reference = align(ids, GEMMA.num_experts)
    assert torch.equal(layout.block_expert, reference.block_expert)
    assert torch.equal(layout.sorted_pairs, reference.sorted_pairs)


@pytest.mark.parametrize("dropped", ["scale", "per_expert_scale", "eps"])
def test_each_part_of_gemma4s_router_reaches_the_kernel(dropped):
    """The kernel's weights move with the column scale, the per-expert scale and the norm's eps (an eps as
    large as the rows' mean square): routing without one of them would pass the test above by chance only
    if the part did nothing."""
    router = gemma_router(seed=7)
    x = torch.randn(5, HIDDEN, generator=_generator(8)).to(DEVICE) * 0.05
    router.kernel = True
    before = router(x)
    with torch.no_grad():
        if dropped == "eps":
            router.norm.eps = 1e-2
        else:
            getattr(router, dropped).mul_(
                1.0 + torch.rand(getattr(router, dropped).shape).to(DEVICE)
            )
    after_kernel = router(x)
    router.kernel = False
    assert_same_routing(after_kernel, router(x))
    assert not torch.allclose(after_kernel[0], before[0])


@pytest.mark.parametrize("n", TOKENS)
def test_gemma4_moe_block_on_the_kernels_equals_the_eager_block(n):
    """``Gemma4Experts.routed_by``: the experts' input x (after their norm) routed by the stream h (a
    hidden size of 45: the grouped kernels' cost in the interpreter grows with it)."""
    router = gemma_router(seed=n, hidden=45)
    experts = randomise(Gemma4Experts(45, GEMMA, "gelu_pytorch_tanh"), seed=n + 1, std=0.2)
    g = _generator(200 + n)
    h, x = (torch.randn(n, 45, generator=g).to(DEVICE) for _ in range(2))
    with torch.no_grad():  # (the eager reference named: by default a CUDA tensor takes the kernels)
        router.kernel, experts.kernels = False, False
        expected = experts.routed_by(router, h, x)
        router.kernel, experts.kernels = True, True
        torch.testing.assert_close(experts.routed_by(router, h, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", TOKENS)
def test_gemma4_dense_mlp_fused_with_the_experts_keeps_both_outputs_apart(n):
    """``Gemma4Experts.routed_beside``: the layer's dense MLP (3 experts' width, its own input) as shared
    slots of the grouped kernels gives the MoE block's output and the MLP's, each as the eager path computes
    it apart. It fails if the shared slots read the experts' input, or their sum joins the routed one."""
    from outpace.layers.decoder import GatedMLP

    router = gemma_router(seed=n, hidden=45)
    experts = randomise(Gemma4Experts(45, GEMMA, "gelu_pytorch_tanh"), seed=n + 1, std=0.2)
    mlp = randomise(GatedMLP(45, 3 * GEMMA.intermediate_size, "gelu_pytorch_tanh"), n + 2, std=0.2)
    g = _generator(300 + n)
    h, x, mlp_x = (torch.randn(n, 45, generator=g).to(DEVICE) for _ in range(3))
    with torch.no_grad():
        router.kernel, experts.kernels = False, False
        expected = experts.routed_by(router, h, x), mlp(mlp_x)
        # eager: the caller runs the MLP
        assert experts.routed_beside(router, h, x, mlp, mlp_x)[1] is None
        router.kernel, experts.kernels = True, True
        routed, dense = experts.routed_beside(router, h, x, mlp, mlp_x)
    assert dense is not None, "the MLP of 3 experts' width fuses"
    torch.testing.assert_close(routed, expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense, expected[1], rtol=1e-5, atol=1e-5)


def test_gemma4_dense_mlp_of_another_width_runs_beside_the_experts():
    """An MLP whose rows are no whole number of experts' does not fuse: ``routed_beside`` leaves it to the
    caller (None) and its MoE output is the kernels' alone."""
    from outpace.layers.decoder import GatedMLP

    router = gemma_router(seed=3, hidden=45)
    experts = randomise(Gemma4Experts(45, GEMMA, "gelu_pytorch_tanh"), seed=4, std=0.2)
    mlp = randomise(GatedMLP(45, 50, "gelu_pytorch_tanh"), 5, std=0.2)
    h, x = (torch.randn(3, 45, generator=_generator(9)).to(DEVICE) for _ in range(2))
    with torch.no_grad():
        router.kernel, experts.kernels = True, True
        routed, dense = experts.routed_beside(router, h, x, mlp, x)
        assert dense is None
        torch.testing.assert_close(routed, experts.routed_by(router, h, x))


# ---- Step-3.5 -------------------------------------------------------------------------------------------


def step_block(limit: float | None, shared_limit: float | None, shared_width: int, seed: int):
    """Step-3.5's routed experts (7 of 20 rows, top 3, hidden 40) and a shared expert of shared_width
    rows, from the test checkpoint's config (tests/helpers/step3p5_checkpoints.py)."""
    from helpers.step3p5_checkpoints import CONFIG

    cfg = Step3p5Config.from_model_config(ModelConfig.from_dict(CONFIG))
    moe = randomise(Step3p5MoE(cfg, limit), seed)
    shared = randomise(
        Step3p5MLP(cfg.hidden_size, shared_width, shared_limit, reduce=False), seed + 1
    )
    return moe, shared


STEP_CASES = {  # id -> (routed limit, shared limit, shared width, fused)
    "plain-two-shared-experts-fused": (None, None, 40, True),
    "same-clamp-fused": (0.3, 0.3, 20, True),
    "shared-clamped-only-added-after": (None, 0.4, 40, False),
    "routed-clamped-only-added-after": (0.3, None, 20, False),
    "shared-narrower-added-after": (None, None, 28, False),
}
# every case at decode and a verify batch, the fused ones at every token count
STEP_RUNS = [(c, n) for c in STEP_CASES for n in (TOKENS if STEP_CASES[c][3] else TOKENS[:3:2])]


@pytest.mark.parametrize("case, n", STEP_RUNS)
def test_step3p5_moe_block_on_the_kernels_equals_the_eager_block(case, n):
    limit, shared_limit, width, fused = STEP_CASES[case]
    moe, shared = step_block(limit, shared_limit, width, seed=n)
    assert moe.gate.routing.scoring == "sigmoid" and moe.gate.routing.correction_bias
    x = torch.randn(n, 40, generator=_generator(300 + n)).to(DEVICE)
    calls = []
    shared.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():  # (the eager reference named: by default a CUDA tensor takes the kernels)
        moe.kernels, moe.gate.kernel = False, False
        expected = moe(x, shared)
        assert calls == [1]
        moe.kernels, moe.gate.kernel = True, True
        got = moe(x, shared)
    assert (shared_expert_stacks(shared, moe) is not None) == fused
    assert len(calls) == (
        1 if fused else 2
    )  # a fused shared expert runs inside the grouped kernels
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [c for c in STEP_CASES if not STEP_CASES[c][3]])
@pytest.mark.parametrize("n", [1, 5])
def test_a_shared_expert_beside_the_experts_joins_their_combine_on_the_fused_stack(case, n):
    """On the fused residual stack (``ReadyStream``) a shared expert that does not fuse adds its output in the
    experts' combine (``ReadyStream.addend``), with the stream and the next norm's readying: the same bits as
    adding the two outputs and readying the stream in a launch of its own (``ReadyStream.add``), which does
    not run."""
    from unittest.mock import patch

    from outpace.layers import normed_rows as row_norms
    from outpace.layers.moe import ReadyStream

    limit, shared_limit, width, _ = STEP_CASES[case]
    moe, shared = step_block(limit, shared_limit, width, seed=20 + n)
    x, stream = (torch.randn(n, 40, generator=_generator(400 + n + i)).to(DEVICE) for i in (0, 1))
    norm_weight = torch.randn(40, generator=_generator(500)).to(DEVICE)
    ready = ReadyStream(stream, norm_weight, 1.0)
    moe.kernels, moe.gate.kernel = True, True
    expected = ready.add(moe(x, shared))  # (the block's output, then the stream readied apart)
    with patch.object(row_norms, "normed_rows", side_effect=AssertionError("a launch apart")):
        got = moe(x, shared, ready=ready)
    assert torch.equal(got.stream, expected.stream) and torch.equal(got.normed, expected.normed)
    torch.testing.assert_close(got.sq_parts.sum(0), expected.sq_parts.sum(0))


@pytest.mark.parametrize("case", [c for c in STEP_CASES if not STEP_CASES[c][3]])
@pytest.mark.parametrize("n", [1, 5])
def test_a_shared_expert_beside_the_experts_reads_the_stream_made_ready_for_the_norm(case, n):
    """On the fused residual stack the block may read the stream made ready for its norm (layers/moe.py
    ``RowNorm``: the norm folded into routing and the grouped gate/up): a shared expert that does not fuse reads
    it through the norm-folding projections too (layers/fused_decoder.py ``mlp_normalised``; a clamped one its
    gate and up apart, then its clamp), so the norm runs as no launch: the block over norm(stream)."""
    from outpace.layers.moe import RowNorm, takes_normed_rows
    from outpace.layers.normed_rows import normed_rows

    limit, shared_limit, width, _ = STEP_CASES[case]
    moe, shared = step_block(limit, shared_limit, width, seed=40 + n)
    stream = torch.randn(n, 40, generator=_generator(600 + n)).to(DEVICE)
    weight, eps = torch.rand(40, generator=_generator(601)).to(DEVICE) + 0.5, 1e-6
    moe.kernels, moe.gate.kernel = True, True
    assert takes_normed_rows(moe.gate, moe, shared, stream)
    with torch.no_grad():
        normalised = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps) * weight
        expected = moe(normalised, shared)
        rows = normed_rows(stream, weight)
        got = moe(rows.normed, shared, row_norm=RowNorm.of(rows, eps))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_step3p5_routing_kernel_equals_its_torch_routing():
    moe, _ = step_block(None, None, 40, seed=5)
    x = torch.randn(8, 40, generator=_generator(6)).to(DEVICE)
    expected = moe.gate(x)
    moe.gate.kernel = True
    assert_same_routing(moe.gate(x), expected)


# ---- the GPU: bf16 at the public shapes --------------------------------------------------------------------


@pytest.mark.gpu  # bf16 at Gemma-4-26B-A4B's router shape: GPU only
@pytest.mark.parametrize("n", [1, 8, 32, 64, 200])
def test_gpu_gemma4_26b_router(n):
    """hidden 2816, 128 experts, top 8 (huggingface.co/google/gemma-4-26B-A4B, outpace/bench/
    family_shapes.py), the router's weights in bf16 as served. The kernels take them to float32 in registers,
    so they choose what a float32 copy of the router chooses over the same (bf16-exact) input, except where
    its top_k-th and next logits tie within float32 summation order, and give the same weights to float32
    rounding. (Against the bf16 router, whose torch path rounds the normed input and the logits to bf16,
    near-ties differ at random: one token of 8 did on the H200, gpu_2026-12-04f call 3.)"""
    moe = Gemma4Moe(128, 8, 704)
    router = Gemma4Router(2816, moe, eps=1e-6)
    with torch.no_grad():
        router.proj.weight.normal_(0.0, 2816**-0.5 * 3, generator=_generator(n))
        router.scale.uniform_(0.5, 1.5, generator=_generator(n + 1))
        router.per_expert_scale.uniform_(0.5, 1.5, generator=_generator(n + 2))
    router = router.to(DEVICE, torch.bfloat16)
    reference = copy.deepcopy(router).float()
    reference.kernel = False
    x = torch.randn(n, 2816, generator=_generator(n + 3)).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        router.kernel = True
        got_w, got_i = by_expert(*router(x))
        exp_w, exp_i = by_expert(*reference(x.float()))
        logits = reference.proj(reference.norm(x.float()) * reference.scale * 2816**-0.5)
    ranked = logits.topk(9, dim=-1).values  # [n, top_k + 1]
    near_tie = (ranked[:, 7] - ranked[:, 8]) < 1e-4
    same = (got_i == exp_i).all(dim=1)
    assert (same | near_tie).all(), f"tokens {(~same & ~near_tie).nonzero().flatten().tolist()}"
    torch.testing.assert_close(got_w[same], exp_w[same], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu  # bf16 and CUDA graphs: GPU only
@pytest.mark.parametrize("n", [1, 8, 64])
def test_gpu_step3p5_flash_moe_block_replays_in_a_cuda_graph(n):
    """Step-3.5-Flash's MoE shape (hidden 4096, 288 experts of 1280 rows, top 8, a shared expert of 1280
    rows: fused), bf16: against a float32 eager copy, and captured once, replayed on new inputs exactly."""
    import copy

    raw = {
        "hidden_size": 4096,
        "moe_num_experts": 288,
        "moe_top_k": 8,
        "moe_intermediate_size": 1280,
        "share_expert_dim": 1280,
        "moe_router_scaling_factor": 3.0,
    }
    from helpers.step3p5_checkpoints import CONFIG

    cfg = Step3p5Config.from_model_config(ModelConfig.from_dict({**CONFIG, **raw}))
    moe = Step3p5MoE(cfg, None)
    shared = Step3p5MLP(4096, 1280, None, reduce=False)
    with torch.no_grad():
        for p in [*moe.parameters(), *shared.parameters()]:
            p.normal_(0.0, 0.02)
        moe.gate.e_score_correction_bias.normal_(0.0, 0.1)
    reference = copy.deepcopy((moe, shared))
    moe, shared = moe.to(DEVICE, torch.bfloat16), shared.to(DEVICE, torch.bfloat16)
    moe.gate.float()  # (the router stays float32)
    x = torch.randn(n, 4096, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        assert isinstance(moe, RoutedExperts) and shared_expert_stacks(shared, moe) is not None
        got = moe(x, shared)
        weights, ids = moe.gate(x)
        ref_moe, ref_shared = (m.to(DEVICE) for m in reference)
        ref_moe.kernels = False
        expected = ref_moe.run(x.float(), weights, ids) + ref_shared(x.float())
        assert ((got.float() - expected).norm() / expected.norm()).item() < 2e-2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(x, shared)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, moe(x, shared))
