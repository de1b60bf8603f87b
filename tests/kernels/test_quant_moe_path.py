"""MoE layers with quantized routed experts on the kernels (layers/moe.py ``moe_on_kernels``: the routing
kernel's block layout, the quantized grouped experts of layers/quant/moe_quant_kernels.py over the stacks of
layers/quant/experts.py, a quantized shared expert stacked with them or run beside) against their eager
dequantizing path (``run_experts``, each projection dequantized), in Triton's interpreter on the CPU
(float32): a DeepSeek-V3-style MoE (grouped sigmoid routing with the correction bias, a shared expert fused
as one more stacked expert) in block FP8 (a ragged last column block) and in INT4 groups, and Nemotron-H's
ungated relu2 experts in ModelOpt's per-tensor FP8 (read by the kernels as blocks of one expert's rows, its
two-expert-wide shared MLP beside), at decode (one token) and verify widths of several sequences. The
stacks must be views of the experts' own tensors (no memory added)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.layers.decoder import GatedMLP  # noqa: E402
from outpace.layers.moe import MoE, Routing  # noqa: E402
from outpace.layers.quant import dequantize as dq  # noqa: E402
from outpace.layers.quant.linear import FORMATS, QuantizedLinear, quantized_like  # noqa: E402
from outpace.layers.quant.scheme import (  # noqa: E402
    FP8_BLOCK,
    FP8_TENSOR,
    INT4_GROUP,
    QuantScheme,
)
from outpace.models.nemotron_h import NemotronHMoE  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HIDDEN, INTER = 96, 64  # 96 columns: a partial last 64-column block
SCHEMES = {
    FP8_BLOCK: QuantScheme(FP8_BLOCK, "test", block=(32, 64)),
    INT4_GROUP: QuantScheme(INT4_GROUP, "test", group=32),
    FP8_TENSOR: QuantScheme(FP8_TENSOR, "test"),
}
TOKENS = [1, 3 * 4]  # decode; verify width 4 of three sequences


@pytest.fixture(autouse=True)
def _no_autograd():
    with torch.no_grad():
        yield


def quantize_projections(module: torch.nn.Module, scheme: QuantScheme, seed: int) -> None:
    """Every ``*_proj`` Linear of module replaced by a ``QuantizedLinear`` of scheme holding random weights
    quantized in its format (float32 scales, bf16 for INT4 as Kimi's files)."""
    g = torch.Generator().manual_seed(seed)
    fmt = FORMATS[scheme.method](scheme)
    for name, linear in list(module.named_modules()):
        if not (isinstance(linear, torch.nn.Linear) and name.endswith("_proj")):
            continue
        w = torch.randn(linear.out_features, linear.in_features, generator=g) * 0.3
        if scheme.method == FP8_BLOCK:
            stored, scale = dq.quantize_fp8_block(w, scheme.block)
        elif scheme.method == FP8_TENSOR:
            stored, scale = dq.quantize_fp8_tensor(w)
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


def deepseek_moe(scheme: QuantScheme) -> MoE:
    routing = Routing(8, 3, "sigmoid", 4, 2, "top2_sum", True, True, 2.5)
    moe = MoE(
        HIDDEN, routing, INTER, 1, lambda size, bias, **kw: GatedMLP(HIDDEN, size, "silu", bias)
    )
    randomise_routers(moe, seed=1)
    quantize_projections(moe, scheme, seed=2)
    return moe.to(DEVICE)


def nemotron_moe(scheme: QuantScheme) -> NemotronHMoE:
    raw = dict(
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.5, mlp_hidden_act="relu2", mlp_bias=False, moe_intermediate_size=INTER,
        moe_shared_expert_intermediate_size=2 * INTER,
    )  # fmt: skip
    moe = NemotronHMoE(HIDDEN, raw)
    randomise_routers(moe, seed=3)
    quantize_projections(moe, scheme, seed=4)
    return moe.to(DEVICE)


def on_kernels(moe: torch.nn.Module, kernels: bool) -> torch.nn.Module:
    moe.gate.kernel = kernels
    moe.experts.kernels = kernels
    return moe


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


@pytest.mark.parametrize(
    "build, method",
    [(deepseek_moe, FP8_BLOCK), (deepseek_moe, INT4_GROUP), (nemotron_moe, FP8_TENSOR)],
)
def test_quantized_moe_on_the_kernels_equals_its_eager_dequantized_path(build, method):
    moe = build(SCHEMES[method])
    experts = moe.experts
    x = torch.randn(max(TOKENS), HIDDEN, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    assert on_kernels(moe, True).experts.uses_kernels(x)
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
    assert isinstance(moe.shared_experts.down_proj, QuantizedLinear)
    # DeepSeek's shared expert, as wide as an expert and quantized alike, is stacked after the experts and
    # run as every token's shared slot (layers/quant/experts.py fused_quantized_shared); Nemotron-H's, two
    # experts wide, runs beside them
    fused = build is deepseek_moe
    assert stacks.num_shared == int(fused)
    if fused:
        shared_down = moe.shared_experts.down_proj.stored_weight
        assert shared_down.data_ptr() == stacks.down[-1].data_ptr()


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
    from outpace.models.step3p5 import Step3p5Config, Step3p5MLP, Step3p5MoE

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


def test_a_fused_shared_mlp_is_refused_off_the_kernels():
    """The eager path would drop a shared MLP handed to it for fusion: it refuses it by name instead."""
    moe = on_kernels(deepseek_moe(SCHEMES[FP8_BLOCK]), False)
    x = torch.randn(2, HIDDEN).to(DEVICE)
    weights, ids = moe.gate(x)
    with pytest.raises(ValueError, match="fused shared experts run on the grouped kernels only"):
        moe.experts.run(x, weights, ids, quantized_shared=moe.shared_experts)
