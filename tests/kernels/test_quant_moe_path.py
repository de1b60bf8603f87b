"""MoE layers with quantized routed experts on the kernels (layers/moe.py ``moe_on_kernels``: the routing
kernel's block layout, the quantized grouped experts of layers/quant/moe_quant_kernels.py over the stacks of
layers/quant/experts.py, a quantized shared MLP fused as shared slots or run beside) against their eager
dequantizing path (``run_experts``, each projection dequantized), in Triton's interpreter on the CPU
(float32): a DeepSeek-style MoE (grouped sigmoid routing with the correction bias) whose shared MLP is one,
two (DeepSeek-V2-Lite's) or three experts wide, in block FP8 (a ragged last column block; fp32 and bf16
scales) and in INT4 groups, and Nemotron-H's ungated relu2 experts in ModelOpt's per-tensor FP8 (read by the
kernels as blocks of one expert's rows) with its two-expert-wide shared MLP, and per-channel FP8 (compressed-tensors:
blocks of one row), at decode (one token) and verify
widths of several sequences. The stacks must be views of the experts' own tensors, and the fused shared
slots views of the shared MLP's own weights and scales (no memory added, nothing moved)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.layers.decoder import GatedMLP  # noqa: E402
from outpace.layers.moe import FusedShared, MoE  # noqa: E402
from outpace.layers.quant import dequantize as dq  # noqa: E402
from outpace.layers.quant.linear import FORMATS, QuantizedLinear, quantized_like  # noqa: E402
from outpace.layers.quant.scheme import (  # noqa: E402
    FP8_BLOCK,
    FP8_CHANNEL,
    FP8_TENSOR,
    INT4_GROUP,
    QuantScheme,
)
from outpace.layers.router import Routing  # noqa: E402
from outpace.models.nemotron_h import NemotronHMoE  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HIDDEN, INTER = 96, 64  # 96 columns: a partial last 64-column block
SCHEMES = {
    FP8_BLOCK: QuantScheme(FP8_BLOCK, "test", block=(32, 64)),
    INT4_GROUP: QuantScheme(INT4_GROUP, "test", group=32),
    FP8_TENSOR: QuantScheme(FP8_TENSOR, "test"),
    FP8_CHANNEL: QuantScheme(FP8_CHANNEL, "test"),
}
TOKENS = [1, 3 * 4]  # decode; verify width 4 of three sequences


@pytest.fixture(autouse=True)
def _no_autograd():
    with torch.no_grad():
        yield


def quantize_projections(
    module: torch.nn.Module, scheme: QuantScheme, seed: int, fp8_scales=torch.float32
) -> None:
    """Every ``*_proj`` Linear of module replaced by a ``QuantizedLinear`` of scheme holding random weights
    quantized in its format (FP8 scales in ``fp8_scales``, bf16 for INT4 as Kimi's files)."""
    g = torch.Generator().manual_seed(seed)
    fmt = FORMATS[scheme.method](scheme)
    for name, linear in list(module.named_modules()):
        if not (isinstance(linear, torch.nn.Linear) and name.endswith("_proj")):
            continue
        w = torch.randn(linear.out_features, linear.in_features, generator=g) * 0.3
        if scheme.method == FP8_BLOCK:
            stored, scale = dq.quantize_fp8_block(w, scheme.block)
            scale = scale.to(fp8_scales)
        elif scheme.method == FP8_TENSOR:
            stored, scale = dq.quantize_fp8_tensor(w)
        elif scheme.method == FP8_CHANNEL:
            stored, scale = dq.quantize_fp8_channel(w)
        else:
            stored, scale = dq.quantize_int4_group(w, scheme.group)
            scale = scale.to(torch.bfloat16)
        layer = quantized_like(linear, fmt, scale.dtype, name)
        layer.stored_weight.copy_(stored)
        layer.scale.copy_(scale)
        parent, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent), child, layer)


def randomise_routers(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name.startswith("gate."):
            t.copy_(torch.randn(t.shape, generator=g) * 0.5)


def deepseek_moe(scheme: QuantScheme, num_shared: int = 1, fp8_scales=torch.float32) -> MoE:
    """``num_shared`` shared experts: one shared MLP of num_shared * INTER rows (DeepSeek-V2-Lite: two)."""
    routing = Routing(8, 3, "sigmoid", 4, 2, "top2_sum", True, True, 2.5)
    moe = MoE(
        HIDDEN,
        routing,
        INTER,
        num_shared,
        lambda size, bias, **kw: GatedMLP(HIDDEN, size, "silu", bias),
    )
    randomise_routers(moe, seed=1)
    quantize_projections(moe, scheme, seed=2, fp8_scales=fp8_scales)
    return moe.to(DEVICE)


def nemotron_moe(scheme: QuantScheme, hidden: int = HIDDEN) -> NemotronHMoE:
    raw = dict(
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.5, mlp_hidden_act="relu2", mlp_bias=False, moe_intermediate_size=INTER,
        moe_shared_expert_intermediate_size=2 * INTER, moe_latent_size=None,
    )  # fmt: skip
    moe = NemotronHMoE(hidden, raw)
    randomise_routers(moe, seed=3)
    quantize_projections(moe, scheme, seed=4)
    return moe.to(DEVICE)


def on_kernels(moe: torch.nn.Module, kernels: bool) -> torch.nn.Module:
    moe.gate.kernel = kernels
    moe.experts.kernels = kernels
    return moe


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


def shared_tensors(moe: torch.nn.Module) -> list[torch.Tensor]:
    """The shared MLP's stored weights and scales."""
    return [t for p in moe.shared_experts.children() for t in (p.stored_weight, p.scale)]


@pytest.mark.parametrize(
    "build, method, slots",
    [
        (deepseek_moe, FP8_BLOCK, 1),
        (deepseek_moe, INT4_GROUP, 1),
        (nemotron_moe, FP8_TENSOR, 2),
        (deepseek_moe, FP8_CHANNEL, 1),  # (compressed-tensors' per-channel: blocks of one row)
    ],
)
def test_quantized_moe_on_the_kernels_equals_its_eager_dequantized_path(build, method, slots):
    """DeepSeek's shared expert, one expert wide, and Nemotron-H's, two wide (per-tensor scales: one a
    projection, repeated over the slots), quantized as the experts are, run as every token's shared slots."""
    moe = build(SCHEMES[method])
    experts = moe.experts
    x = torch.randn(max(TOKENS), HIDDEN, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    assert on_kernels(moe, True).experts.uses_kernels(x)
    assert FusedShared.of(moe.shared_experts, experts).count == slots
    shared_before = [t.data_ptr() for t in shared_tensors(moe)]
    for n in TOKENS:
        got = on_kernels(moe, True)(x[:n])
        expected = on_kernels(moe, False)(x[:n])
        assert got.shape == (n, HIDDEN)
        assert relative_error(got, expected) < 1e-5, n
    # the stacks are the experts' own tensors: expert 0's projections are views of their first rows
    stacks = experts.quantized_stacks
    first = experts[0]
    assert first.down_proj.stored_weight.data_ptr() == stacks.down.data_ptr()
    assert first.up_proj.stored_weight.data_ptr() == stacks.gate_up.data_ptr() + (
        0
        if method == FP8_TENSOR
        else INTER * stacks.gate_up.stride(1) * stacks.gate_up.element_size()
    )
    # the shared MLP's tensors stay its own: not stacked with the experts, not copied
    assert isinstance(moe.shared_experts.down_proj, QuantizedLinear)
    assert [t.data_ptr() for t in shared_tensors(moe)] == shared_before
    assert stacks.down.shape[0] == len(experts)


@pytest.mark.parametrize(
    "method, slots, fp8_scales",
    [
        (FP8_BLOCK, 2, torch.float32),
        (FP8_BLOCK, 2, torch.bfloat16),
        (FP8_BLOCK, 3, torch.float32),
        (INT4_GROUP, 2, torch.float32),
        (INT4_GROUP, 3, torch.float32),
    ],
)
def test_a_shared_mlp_several_experts_wide_fuses_as_shared_slots(method, slots, fp8_scales):
    """DeepSeek-V2-Lite's shape of shared MLP (two experts: one MLP of 2 x inter rows; and three) in block
    FP8 of 32 x 64 blocks (inter 64 a multiple of both sides) and INT4 groups of 32: fused as shared slots
    of strided views of its own weights and scales, equal to the eager path at odd token counts; a scale
    changed in place reaches the kernels (views, not copies)."""
    moe = on_kernels(deepseek_moe(SCHEMES[method], slots, fp8_scales), True)
    fused = FusedShared.of(moe.shared_experts, moe.experts)
    assert fused.count == slots
    mlp = moe.shared_experts
    projections = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    own = [p.stored_weight for p in projections] + [p.scale for p in projections]
    for view, tensor in zip((*fused.quantized.weights, *fused.quantized.scales), own):
        assert view.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    for n in (1, 5, 7):
        got = on_kernels(moe, True)(x[:n])
        assert relative_error(got, on_kernels(moe, False)(x[:n])) < 1e-5, n
    before = on_kernels(moe, True)(x)
    moe.shared_experts.down_proj.scale.mul_(2.0)  # in place: through the views
    doubled = moe(x)
    assert relative_error(doubled, before) > 0.05
    assert relative_error(doubled, on_kernels(moe, False)(x)) < 1e-5


def test_per_tensor_shared_slots_over_several_column_blocks():
    """Nemotron-H's two-expert-wide shared MLP in per-tensor FP8 at a hidden size of two 128-column blocks
    (200: ragged), where the per-tensor scales read as blocks repeat along the columns (stride 0, the
    routed experts' and the shared slots' alike): fused, equal to the eager path."""
    moe = on_kernels(nemotron_moe(SCHEMES[FP8_TENSOR], hidden=200), True)
    assert FusedShared.of(moe.shared_experts, moe.experts).count == 2
    x = torch.randn(5, 200, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    for n in (1, 5):
        got = on_kernels(moe, True)(x[:n])
        assert relative_error(got, on_kernels(moe, False)(x[:n])) < 1e-5, n


def test_a_shared_mlp_whose_scale_blocks_straddle_two_experts_runs_beside():
    """Block FP8 of 32 x 128 blocks at inter 64: a two-expert-wide shared MLP's down scale columns cover
    both slots (128 columns), so it does not fuse; it runs beside the experts, still equal to the eager
    path. One expert wide it fuses (nothing to split)."""
    scheme = QuantScheme(FP8_BLOCK, "test", block=(32, 128))
    moe = on_kernels(deepseek_moe(scheme, 2), True)
    assert FusedShared.of(moe.shared_experts, moe.experts).count == 0
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    assert relative_error(moe(x), on_kernels(moe, False)(x)) < 1e-5
    one = on_kernels(deepseek_moe(scheme, 1), True)
    assert FusedShared.of(one.shared_experts, one.experts).count == 1


def test_a_stale_stack_is_made_again_and_a_wrong_scale_fails():
    """The experts' scales given other storage (a reload with assign): the kernels restack and read the new
    ones; an expert's scale doubled in place reaches the kernels (the test fails if the stacks were copies)."""
    moe = on_kernels(deepseek_moe(SCHEMES[FP8_BLOCK]), True)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    before = moe(x)
    stacks = moe.experts.quantized_stacks
    for expert in moe.experts:
        expert.down_proj.scale.mul_(2.0)  # in place: through the views
    doubled = moe(x)
    assert moe.experts.quantized_stacks is stacks
    assert relative_error(doubled, before) > 0.05
    for expert in moe.experts:  # other storage: the stacks are made again
        expert.down_proj.stored_weight.data = expert.down_proj.stored_weight.clone()
        expert.down_proj.scale.data = expert.down_proj.scale.data / 2.0
    again = moe(x)
    assert moe.experts.quantized_stacks is not stacks
    assert relative_error(again, before) < 1e-6
    assert relative_error(again, on_kernels(moe, False)(x)) < 1e-5


def test_step3p5_block_fp8_stacks_on_the_kernels_equal_the_eager_path():
    """Step-3.5-Flash-FP8's stacked experts (layers/quant/experts.py ``QuantizedStackedWeight``: gate, up and
    down stacks read in place, gate and up apart, each with its scale stack; the SwiGLU clamp) and its
    quantized shared expert beside them, against the eager path (each expert's stacks dequantized)."""
    from helpers.step3p5_checkpoints import CONFIG
    from outpace.layers.moe import StackedWeight
    from outpace.layers.quant.experts import QuantizedStackedWeight
    from outpace.model_config import ModelConfig
    from outpace.models.step3p5 import Step3p5MLP, Step3p5MoE
    from outpace.models.step3p5_config import Step3p5Config

    scheme = QuantScheme(FP8_BLOCK, "test", block=(8, 64))
    cfg = Step3p5Config.from_model_config(ModelConfig.from_dict(CONFIG))
    moe = Step3p5MoE(cfg, 0.3)
    randomise_routers(moe, seed=7)
    g = torch.Generator().manual_seed(8)
    for name in ("gate_proj", "up_proj", "down_proj"):
        stacked = getattr(moe, name)
        assert isinstance(stacked, StackedWeight)
        layer = QuantizedStackedWeight(stacked, FORMATS[FP8_BLOCK](scheme), torch.float32, name)
        stored, scale = dq.quantize_fp8_block(
            torch.randn(stacked.weight.shape, generator=g) * 0.3, scheme.block
        )
        layer.weight.copy_(stored)
        layer.weight_scale_inv.copy_(scale)
        setattr(moe, name, layer)
    shared = Step3p5MLP(cfg.hidden_size, 40, 0.3, reduce=False)
    quantize_projections(shared, scheme, seed=9)
    moe, shared = moe.to(DEVICE), shared.to(DEVICE)
    x = torch.randn(8, cfg.hidden_size, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    moe.kernels = moe.gate.kernel = True
    assert moe.uses_kernels(x)
    for n in (1, 8):
        moe.kernels = moe.gate.kernel = True
        got = moe(x[:n], shared)
        moe.kernels = moe.gate.kernel = False
        assert relative_error(got, moe(x[:n], shared)) < 1e-5, n


@pytest.mark.parametrize("scale_shape", [(8, 1, 1), (8,)], ids=["E11", "E"])
def test_fused_per_tensor_fp8_stacks_on_the_kernels_equal_the_eager_path(scale_shape):
    """transformers' fused FP8 experts (layers/quant/experts.py ``quantize_packed_stacks``: gate_up [E, 2I, H]
    and down [E, H, I] float8, one scale an expert and projection, as reported of Mistral Small 4's release)
    read in place by the grouped kernels as per-tensor blocks (``QuantizedExpertStacks.of_packed``), beside a
    half-precision shared expert, against the eager path (each expert's stacks dequantized)."""
    from outpace.layers.moe import stacked_experts
    from outpace.layers.quant.experts import quantize_packed_stacks

    routing = Routing(8, 3, "softmax", 4, 2, "top2_sum", False, True, 1.5)
    experts = stacked_experts("silu", 8, HIDDEN, INTER)
    stored = {f"{n}{s}": (torch.bfloat16, scale_shape) for n in ("gate_up_proj", "down_proj")
              for s in ("_scale_inv", "_activation_scale")}  # fmt: skip
    quantize_packed_stacks(experts, FORMATS[FP8_TENSOR](SCHEMES[FP8_TENSOR]), stored)
    g = torch.Generator().manual_seed(11)
    for name in ("gate_up_proj", "down_proj"):
        w = torch.randn(getattr(experts, name).shape, generator=g) * 0.3
        fp8, scales = zip(*(dq.quantize_fp8_tensor(e) for e in w))
        getattr(experts, name).copy_(torch.stack(fp8))
        getattr(experts, name + "_scale_inv").copy_(torch.stack(scales).reshape(scale_shape))
    moe = MoE(
        HIDDEN, routing, INTER, 1, lambda size, bias, **kw: GatedMLP(HIDDEN, size, "silu", bias),
        experts=experts,
    )  # fmt: skip
    randomise_routers(moe, seed=12)
    moe = moe.to(DEVICE)
    x = torch.randn(max(TOKENS), HIDDEN, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    assert on_kernels(moe, True).experts.uses_kernels(x)
    for n in TOKENS:
        got = on_kernels(moe, True)(x[:n])
        expected = on_kernels(moe, False)(x[:n])
        assert relative_error(got, expected) < 1e-5, n


def test_a_fused_shared_mlp_is_refused_off_the_kernels():
    """The eager path would drop a shared MLP handed to it for fusion: it refuses it by name instead."""
    moe = on_kernels(deepseek_moe(SCHEMES[FP8_BLOCK]), False)
    x = torch.randn(2, HIDDEN).to(DEVICE)
    weights, ids = moe.gate(x)
    with pytest.raises(ValueError, match="fused shared experts run on the grouped kernels only"):
        moe.experts.run(x, weights, ids, quantized_shared=moe.shared_experts)


def test_packed_expert_gate_up_becomes_a_view_of_the_stacks():
    """Experts whose gate/up were packed after loading (layers/decoder.py ``pack_projections``: the gate and
    up weights views of one packed tensor) keep no copy once stacked: the packed projection reads the stack's
    rows too, the packed tensor's old storage is freed, and the eager path through it still gives the
    kernels' output."""
    from outpace.layers.decoder import pack_projections

    moe = deepseek_moe(SCHEMES[FP8_BLOCK])
    pack_projections(moe)
    first = moe.experts[0]
    assert first.gate_up is not None  # (packed: what the test is about)
    old = first.gate_up.weight.weight.untyped_storage()._weak_ref()
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    got = on_kernels(moe, True)(x)
    stacks = moe.experts.quantized_stacks
    for e, expert in enumerate(moe.experts):
        assert expert.gate_up.weight.weight.data_ptr() == stacks.gate_up[e].data_ptr()
        assert expert.gate_up.weight.scale.data_ptr() == stacks.gate_up_scale[e].data_ptr()
    assert torch.UntypedStorage._expired(old), (
        "the packed gate/up kept its storage beside the stacks"
    )
    assert relative_error(on_kernels(moe, False)(x), got) < 1e-5
