"""The grouped-expert kernels over quantized stacks (layers/quant/moe_quant_kernels.py on layers/moe_kernels.py)
against the experts computed in torch on the dequantized stacks (layers/quant/dequantize.py): block FP8 with a
hidden size and an expert size that are not multiples of the block (ragged scale blocks), INT4 groups of 32,
SiLU-gated, SiLU with a clamp and relu2 ungated; one token, a few sharing experts, a verify batch and a
prefill-sized one (the 64-row blocks); the launches benchmarks/scripts/moe_fp8_settings.py times, at each of its
tiles. On the CPU, Triton's interpreter in float32; on the GPU, bf16 at the DeepSeek-V3 expert shape, captured
in a CUDA graph, and ``test_gpu_grouped_bandwidth`` prints the speed over the distinct experts' bytes
(``pytest -s``)."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from helpers.bench_scripts import load_bench_script  # noqa: E402
from outpace.layers import moe_kernels  # noqa: E402
from outpace.layers.quant import quant_matmul_kernel as qm  # noqa: E402
from outpace.layers.quant.dequantize import (  # noqa: E402
    dequantize_fp8_block,
    dequantize_int4_group,
    quantize_fp8_block,
    quantize_int4_group,
)
from outpace.layers.quant.experts import QuantizedShared, slot_views  # noqa: E402
from outpace.layers.quant.moe_quant_kernels import (  # noqa: E402
    fp8_block_grouped_experts,
    int4_group_grouped_experts,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = (128, 128)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


def reference(x, weights, ids, gate_up, down, activation="silu", limit=None, gated=True):
    """float32 [n, H]: sum over slots of weight times the expert's MLP on the dequantized stacks (gate_up
    [E, 2I or I, H], down [E, H, I])."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            if e < 0:  # another expert-parallel rank's expert
                continue
            h = F.linear(x[t].float(), gate_up[e])
            if gated:
                g, u = h.chunk(2)
                g = F.silu(g)
                if limit is not None:
                    g, u = g.clamp(max=limit), u.clamp(-limit, limit)
                h = g * u
            else:
                h = F.relu(h).square()
            out[t] += w * F.linear(h, down[e])
    return out


def routing(n: int, experts: int, top_k: int, pool: int, seed: int):
    """(weights [n, top_k] float32, ids [n, top_k] int32): distinct experts per token drawn from the first
    ``pool`` experts (a small pool: tokens share experts)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(n)])
    return torch.rand(n, top_k, generator=g).to(DEVICE), ids.to(torch.int32).to(DEVICE)


def fp8_stacks(experts, hidden, inter, seed, gated=True, dtype=torch.float32):
    g = torch.Generator(DEVICE).manual_seed(seed)  # (made where they run: GPU stacks are gigabytes)
    rows = 2 * inter if gated else inter
    gate_up, gate_up_s = quantize_fp8_block(
        torch.randn(experts, rows, hidden, generator=g, device=DEVICE) * 0.2, BLOCK
    )
    down, down_s = quantize_fp8_block(
        torch.randn(experts, hidden, inter, generator=g, device=DEVICE) * 0.2, BLOCK
    )
    return [t.to(DEVICE) for t in (gate_up, gate_up_s.to(dtype), down, down_s.to(dtype))]


def int4_stacks(experts, hidden, inter, seed, gated=True, group=32):
    g = torch.Generator(DEVICE).manual_seed(seed)
    rows = 2 * inter if gated else inter
    gate_up, gate_up_s = quantize_int4_group(
        torch.randn(experts, rows, hidden, generator=g, device=DEVICE) * 0.2, group
    )
    down, down_s = quantize_int4_group(
        torch.randn(experts, hidden, inter, generator=g, device=DEVICE) * 0.2, group
    )
    return [
        t.to(DEVICE)
        for t in (gate_up, gate_up_s.to(torch.bfloat16), down, down_s.to(torch.bfloat16))
    ]


@pytest.mark.parametrize("n, pool", [(1, 8), (8, 5), (70, 8)])
def test_block_fp8_experts_equal_the_dequantized_experts(n, pool):
    """hidden 136 and inter 128 with 128 x 128 blocks: the last hidden block is partial (8 columns of the
    gate/up scales, 8 rows of down's)."""
    gate_up, gate_up_s, down, down_s = fp8_stacks(8, 136, 128, seed=n)
    x = torch.randn(n, 136, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    weights, ids = routing(n, 8, 3, pool, seed=n)
    got = fp8_block_grouped_experts(x, weights, ids, gate_up, gate_up_s, down, down_s)
    assert got.shape == (n, 136) and got.dtype == x.dtype
    expected = reference(
        x,
        weights,
        ids,
        dequantize_fp8_block(gate_up, gate_up_s, BLOCK),
        dequantize_fp8_block(down, down_s, BLOCK),
    )
    assert relative_error(got, expected) < 1e-6  # float32 summation orders only


def test_block_fp8_experts_over_k_steps_of_two_scale_columns():
    """K steps of 256 columns (two 128-column scale blocks, ``weight_tile`` broadcasting each block's scale
    over its columns): hidden 392 (a partial third block) and inter 256, the dequantized experts' sums."""
    gate_up, gate_up_s, down, down_s = fp8_stacks(6, 392, 256, seed=3)
    x = torch.randn(5, 392, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    weights, ids = routing(5, 6, 2, 6, seed=3)
    wide = ((32, 256, 4, 3), (32, 256, 4, 3))
    got = fp8_block_grouped_experts(x, weights, ids, gate_up, gate_up_s, down, down_s, tiles=wide)
    deq = dequantize_fp8_block(gate_up, gate_up_s, BLOCK), dequantize_fp8_block(down, down_s, BLOCK)
    assert relative_error(got, reference(x, weights, ids, *deq)) < 1e-6


def test_one_token_reads_one_row_a_block_where_its_kernels_k_allows():
    """moe_kernels.py ONE-ROW: one token's block-FP8 kernels of at most ONE_ROW_MAX_K columns read one row a block
    on the CUDA cores (INT4 ones of at most ONE_ROW_MAX_INT4_K), the others the 16-row tiles; half-precision
    stacks and two tokens never. With the
    limit between hidden 392 and inter 256 the gate/up kernel takes the 16-row tiles and the down kernel one row:
    the dequantized experts' sums all the same."""
    assert moe_kernels.one_token_rows(1, "fp8_block", qm.ONE_ROW_MAX_K)
    assert not moe_kernels.one_token_rows(1, "fp8_block", qm.ONE_ROW_MAX_K + 128)
    assert moe_kernels.one_token_rows(1, "int4_group", qm.ONE_ROW_MAX_INT4_K)
    assert not moe_kernels.one_token_rows(1, "int4_group", qm.ONE_ROW_MAX_INT4_K + 128)
    for tokens, fmt in ((2, "fp8_block"), (2, "int4_group"), (1, "none")):
        assert not moe_kernels.one_token_rows(tokens, fmt, 256)
    gate_up, gate_up_s, down, down_s = fp8_stacks(6, 392, 256, seed=4)
    x = torch.randn(1, 392, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    weights, ids = routing(1, 6, 3, 6, seed=4)
    deq = dequantize_fp8_block(gate_up, gate_up_s, BLOCK), dequantize_fp8_block(down, down_s, BLOCK)
    with patch.object(qm, "ONE_ROW_MAX_K", 300):
        got = fp8_block_grouped_experts(x, weights, ids, gate_up, gate_up_s, down, down_s)
    assert relative_error(got, reference(x, weights, ids, *deq)) < 1e-6


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_a_few_tokens_give_each_pair_a_program_row(fmt):
    """moe_kernels.py PAIRS APART: up to the format's ``pairs_apart_max_tokens`` (INT4 as shipped; block FP8, which
    ships without, set to 4 here) over stacks whose both kernels read one row a block, each (token, slot) pair is a
    program row of its own, the layout unread: 4 tokens that share experts (a pool of 4 for 3 slots), two shared
    slots (read once a token) and slots of another rank (-1, skipped). Equal to the dequantized experts, and to
    the layout's kernels (pairs apart off) up to float32 summation order; not chosen past the count, over
    half-precision stacks or past a kernel's one-row K (batch-invariant mode: test_moe_batch_invariant.py)."""
    tokens = 4
    hidden, inter = (136, 128) if fmt == "fp8" else (96, 64)
    name = "fp8_block" if fmt == "fp8" else "int4_group"
    assert moe_kernels.pairs_apart_max_tokens["int4_group"] >= tokens
    apart = patch.dict(moe_kernels.pairs_apart_max_tokens, {name: tokens})
    with apart:
        assert moe_kernels.pairs_apart(tokens, name, hidden, inter)
        assert not moe_kernels.pairs_apart(tokens + 1, name, hidden, inter)
        assert not moe_kernels.pairs_apart(tokens, "none", hidden, inter)
        assert not moe_kernels.pairs_apart(tokens, name, hidden, qm.one_row_max_k(name) + 128)
    if fmt == "fp8":
        stacks = fp8_stacks(6, hidden, inter, seed=11)
        dequantize = lambda w, s: dequantize_fp8_block(w, s, BLOCK)  # noqa: E731
        run = fp8_block_grouped_experts
    else:
        stacks = int4_stacks(6, hidden, inter, seed=11)
        dequantize = lambda w, s: dequantize_int4_group(w, s, 32)  # noqa: E731
        run = int4_group_grouped_experts
    scale_dtype = stacks[1].dtype
    weights_mlp, scales_mlp, dequantized = shared_mlp(hidden, 2 * inter, 11, fmt, scale_dtype)
    shared = as_slots(weights_mlp, scales_mlp, 2)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    weights, ids = routing(tokens, 6, 3, 4, seed=11)
    ids[0, 1] = ids[-1, 0] = -1  # another rank's experts
    with apart:
        got = run(x, weights, ids, *stacks, shared=shared, skipped_slots=True)
    expected = reference(
        x, weights, ids, dequantize(stacks[0], stacks[1]), dequantize(stacks[2], stacks[3])
    ) + shared_reference(x, dequantized)
    assert relative_error(got, expected) < 1e-6
    with patch.dict(moe_kernels.pairs_apart_max_tokens, {name: 0}):
        assert not moe_kernels.pairs_apart(tokens, name, hidden, inter)
        by_layout = run(x, weights, ids, *stacks, shared=shared, skipped_slots=True)
    assert relative_error(got, by_layout) < 1e-6


def test_block_fp8_clamped_and_ungated_experts_with_bf16_scales():
    x = torch.randn(5, 136, device=DEVICE)
    weights, ids = routing(5, 6, 2, 6, seed=1)
    gate_up, gate_up_s, down, down_s = fp8_stacks(6, 136, 128, seed=1, dtype=torch.bfloat16)
    deq = dequantize_fp8_block(gate_up, gate_up_s, BLOCK), dequantize_fp8_block(down, down_s, BLOCK)
    got = fp8_block_grouped_experts(x, weights, ids, gate_up, gate_up_s, down, down_s, limit=0.3)
    assert relative_error(got, reference(x, weights, ids, *deq, limit=0.3)) < 1e-6
    up, up_s, down, down_s = fp8_stacks(
        6, 136, 72, seed=2, gated=False
    )  # inter 72: a partial block
    deq = dequantize_fp8_block(up, up_s, BLOCK), dequantize_fp8_block(down, down_s, BLOCK)
    got = fp8_block_grouped_experts(
        x, weights, ids, up, up_s, down, down_s, activation="relu2", gated=False
    )
    assert relative_error(got, reference(x, weights, ids, *deq, gated=False)) < 1e-6


@pytest.mark.parametrize(
    "n, pool, hidden, inter, group",
    [
        (1, 8, 96, 64, 32),
        (3, 4, 96, 64, 32),
        (70, 8, 96, 64, 32),
        (5, 6, 384, 256, 128),
        (70, 6, 384, 256, 128),
    ],
)
def test_int4_experts_equal_the_dequantized_experts(n, pool, hidden, inter, group):
    """One token reads one row a block on the CUDA cores (moe_kernels.py ONE-ROW), three each pair apart (PAIRS
    APART), 5 the 16-row tiles, 70 the 64-row blocks. In groups of 128 columns (RedHatAI's w4a16 MoE releases) a
    K step of the tiles lies in one group, and each step's scales are loaded in the step before (SCALES AHEAD)."""
    gate_up, gate_up_s, down, down_s = int4_stacks(8, hidden, inter, seed=n, group=group)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    weights, ids = routing(n, 8, 3, pool, seed=n)
    got = int4_group_grouped_experts(x, weights, ids, gate_up, gate_up_s, down, down_s, group)
    assert got.shape == (n, hidden)
    expected = reference(
        x,
        weights,
        ids,
        dequantize_int4_group(gate_up, gate_up_s, group),
        dequantize_int4_group(down, down_s, group),
    )
    assert relative_error(got, expected) < 1e-6


def shared_mlp(hidden, width, seed, fmt, scale_dtype):
    """A shared MLP ``width`` rows wide, stored as a checkpoint stores it: (gate, up, down) quantized weights
    [width, H], [width, H], [H, width] (INT4: packed along the columns) and their scales, as (weights,
    scales, dequantized weights)."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    shapes = [(width, hidden), (width, hidden), (hidden, width)]
    weights, scales, dequantized = [], [], []
    for shape in shapes:
        w = torch.randn(*shape, generator=g, device=DEVICE) * 0.2
        if fmt == "fp8":
            stored, scale = quantize_fp8_block(w, BLOCK)
            deq = dequantize_fp8_block(stored, scale.to(scale_dtype), BLOCK)
        else:
            stored, scale = quantize_int4_group(w, 32)
            deq = dequantize_int4_group(stored, scale.to(scale_dtype), 32)
        weights.append(stored)
        scales.append(scale.to(scale_dtype))
        dequantized.append(deq)
    return weights, scales, dequantized


def as_slots(weights, scales, slots) -> QuantizedShared:
    """The shared MLP as ``slots`` experts' stacks: strided views of its own tensors (layers/quant/experts.py
    ``slot_views``)."""
    (gate, up), down = slot_views(weights[:2], weights[2], slots)
    (gate_s, up_s), down_s = slot_views(scales[:2], scales[2], slots)
    return QuantizedShared((gate, up, down), (gate_s, up_s, down_s))


def shared_reference(x, dequantized):
    """float32 [n, H]: the whole shared MLP on its dequantized weights, silu(x g^T) * (x u^T) d^T."""
    gate, up, down = dequantized
    return F.linear(F.silu(F.linear(x.float(), gate)) * F.linear(x.float(), up), down)


def same_storage(view: torch.Tensor, stored: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == stored.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "fmt, slots, scale_dtype, n",
    [
        ("fp8", 2, torch.float32, 1),
        ("fp8", 2, torch.bfloat16, 7),
        ("fp8", 3, torch.float32, 5),
        ("fp8", 1, torch.float32, 3),  # one expert wide (DeepSeek-V3's, Kimi-K2's, Qwen3-Next's)
        ("fp8", 2, torch.float32, 67),  # the 64-row blocks
        ("int4", 2, torch.bfloat16, 5),
        ("int4", 3, torch.float32, 1),
    ],
)
def test_a_shared_mlp_of_several_experts_runs_as_shared_slots(fmt, slots, scale_dtype, n):
    """A quantized shared MLP ``slots`` experts wide (DeepSeek-V2-Lite's two: one MLP of 2 x 1408 rows) in the
    grouped kernels as every token's shared slots, from strided views of its own weights and scales (down's
    slot stride inter, not hidden * inter): equal to the routed experts plus the whole shared MLP
    dequantized. Block FP8 with 128 x 128 blocks at inter 128 (a multiple of both sides), hidden 136 (a
    partial last block); INT4 groups of 32 at hidden 96, inter 64."""
    hidden, inter = (136, 128) if fmt == "fp8" else (96, 64)
    if fmt == "fp8":
        stacks = fp8_stacks(6, hidden, inter, seed=n, dtype=scale_dtype)
        dequantize = lambda w, s: dequantize_fp8_block(w, s, BLOCK)  # noqa: E731
        run = fp8_block_grouped_experts
    else:
        stacks = int4_stacks(6, hidden, inter, seed=n)
        stacks[1], stacks[3] = stacks[1].to(scale_dtype), stacks[3].to(scale_dtype)
        dequantize = lambda w, s: dequantize_int4_group(w, s, 32)  # noqa: E731
        run = int4_group_grouped_experts
    weights_mlp, scales_mlp, dequantized = shared_mlp(hidden, slots * inter, n, fmt, scale_dtype)
    shared = as_slots(weights_mlp, scales_mlp, slots)
    for view, stored in zip((*shared.weights, *shared.scales), (*weights_mlp, *scales_mlp)):
        assert same_storage(view, stored)  # views of the MLP's own tensors: nothing copied
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    weights, ids = routing(n, 6, 2, 6, seed=n)
    got = run(x, weights, ids, *stacks, shared=shared)
    expected = reference(
        x, weights, ids, dequantize(stacks[0], stacks[1]), dequantize(stacks[2], stacks[3])
    ) + shared_reference(x, dequantized)
    assert got.shape == (n, hidden)
    assert relative_error(got, expected) < 1e-6


def test_shared_slots_of_another_shape_scale_dtype_or_column_stride_are_refused():
    gate_up, gate_up_s, down, down_s = fp8_stacks(4, 136, 128, seed=4)
    x = torch.randn(2, 136, device=DEVICE)
    weights, ids = routing(2, 4, 2, 4, seed=4)
    mlp, scales, _ = shared_mlp(136, 256, 4, "fp8", torch.bfloat16)
    with pytest.raises(ValueError, match="the shared gate scale"):  # bf16 beside the experts' fp32
        fp8_block_grouped_experts(
            x, weights, ids, gate_up, gate_up_s, down, down_s, shared=as_slots(mlp, scales, 2)
        )
    mlp, scales, _ = shared_mlp(136, 256, 4, "fp8", torch.float32)
    with pytest.raises(
        ValueError, match=r"shared gate scale: expected \[S, 1, 2\]"
    ):  # 2 experts as 1
        fp8_block_grouped_experts(
            x, weights, ids, gate_up, gate_up_s, down, down_s, shared=as_slots(mlp, scales, 1)
        )
    column_major = [s.t().contiguous().t() for s in scales]  # (the kernels read one column stride)
    with pytest.raises(ValueError, match="shared gate scale: column stride"):
        fp8_block_grouped_experts(
            x, weights, ids, gate_up, gate_up_s, down, down_s, shared=as_slots(mlp, column_major, 2)
        )


def test_bad_stacks_are_refused_by_name():
    gate_up, gate_up_s, down, down_s = fp8_stacks(4, 136, 128, seed=3)
    x = torch.randn(2, 136, device=DEVICE)
    weights, ids = routing(2, 4, 2, 4, seed=3)
    with pytest.raises(ValueError, match="gate_up_scale_inv"):
        fp8_block_grouped_experts(x, weights, ids, gate_up, gate_up_s[:, :1], down, down_s)
    with pytest.raises(ValueError, match="share scale blocks"):
        fp8_block_grouped_experts(
            x, weights, ids, gate_up[:, :200], gate_up_s, down[..., :100], down_s
        )
    packed, packed_s, down4, down4_s = int4_stacks(4, 64, 32, seed=3)
    with pytest.raises(ValueError, match="down_scale"):
        int4_group_grouped_experts(
            x[:, :64], weights, ids, packed, packed_s, down4, down4_s[..., :0]
        )


def test_the_fp8_settings_script_parses_its_arguments():
    script = load_bench_script("moe_fp8_settings")
    args = script.parse_args(["out", "--shapes", "deepseek-v2-lite", "--tokens", "1", "8"])
    assert (args.out, args.shapes, args.tokens) == (Path("out"), ["deepseek-v2-lite"], [1, 8])
    assert script.parse_args(["out"]).shapes == list(script.SHAPES)
    with pytest.raises(SystemExit):
        script.parse_args(["out", "--shapes", "llama"])


@pytest.mark.parametrize("stacked", [True, False])
def test_the_fp8_settings_scripts_launches_at_each_setting(stacked):
    """The launches benchmarks/scripts/moe_fp8_settings.py times, at each of its settings' tiles (forced:
    K steps of 64 and 128 in scale blocks of 128, 16 to 128 rows a program), at a small shape of each: gate,
    up and down stacks of their own with half of each token's slots another rank's (-1), and packed gate/up
    stacks with a shared MLP of two experts' width as shared slots; equal to the experts on the dequantized
    stacks. Hidden 136: a partial last scale block."""
    script = load_bench_script("moe_fp8_settings")
    if stacked:
        shape = script.Shape(8, 4, 0, 136, 128, ranks=2, stacked=True)
    else:
        shape = script.Shape(6, 2, 2, 136, 128)
    gen = torch.Generator(DEVICE).manual_seed(5)
    layer = script.make_layer(shape, gen, DEVICE)
    routing = script.make_routing(shape, 3, torch.Generator().manual_seed(5), DEVICE)
    weights, ids, _ = routing
    assert ((ids >= 0).sum(1) == shape.local_slots).all()
    experts, up_bytes, down_bytes = script.distinct_bytes(shape, ids)
    assert experts == len(set(ids[ids >= 0].tolist())) + shape.shared
    assert (up_bytes, down_bytes) == (experts * (2 * 136 * 128 + 16), experts * (136 * 128 + 8))
    x = torch.randn(3, 136, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    if stacked:
        quant = layer["scales"]
        gate_up = torch.cat(
            [
                dequantize_fp8_block(layer["gate"], quant.gate_scale, BLOCK),
                dequantize_fp8_block(layer["up"], quant.up_scale, BLOCK),
            ],
            dim=1,
        )
        down = dequantize_fp8_block(layer["down"], quant.down_scale, BLOCK)
        shared = 0
    else:
        gate_up = dequantize_fp8_block(layer["gate_up"], layer["gate_up_scale"], BLOCK)
        down = dequantize_fp8_block(layer["down"], layer["down_scale"], BLOCK)
        (gate, up, shared_down), (gate_s, up_s, down_s) = (
            layer["shared"].weights,
            layer["shared"].scales,
        )
        shared_gate_up = torch.cat(  # [2, 2 * 128, 136]: the two slots as experts of weight 1
            [dequantize_fp8_block(gate, gate_s, BLOCK), dequantize_fp8_block(up, up_s, BLOCK)],
            dim=1,
        )
        shared_down = dequantize_fp8_block(shared_down, down_s, BLOCK)
        slots = torch.arange(2, device=DEVICE).expand(3, 2)
        shared = reference(x, torch.ones(3, 2), slots, shared_gate_up, shared_down)
    expected = reference(x, weights, ids, gate_up, down) + shared
    for tiles in {(g[:2] + (4, 2), d[:2] + (4, 2)) for g, d in script.SETTINGS}:
        got = script.run(shape, layer, x, routing, tiles)
        assert relative_error(got, expected) < 1e-6, tiles


# ---- GPU: bf16 at the DeepSeek-V3 expert shape, in a CUDA graph, and the speed ----------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize("n", [1, 8, 64, 200])
def test_gpu_bf16_at_the_deepseek_expert_shape(fmt, n):
    """32 experts of DeepSeek-V3's shape (hidden 7168, inter 2048), top 8. Tolerance: the dequantized
    weights rounded to bf16 (2^-9 relative), the intermediate rounded to bf16 as the eager experts round
    it, float32 accumulation: below 1e-2 relative to the float32 reference."""
    stacks = (fp8_stacks if fmt == "fp8" else int4_stacks)(32, 7168, 2048, seed=n)
    x = torch.randn(n, 7168, device="cuda", dtype=torch.bfloat16)
    weights, ids = routing(n, 32, 8, 32, seed=n)
    if fmt == "fp8":
        got = fp8_block_grouped_experts(x, weights, ids, *stacks)
        deq = (
            dequantize_fp8_block(stacks[0], stacks[1], BLOCK),
            dequantize_fp8_block(stacks[2], stacks[3], BLOCK),
        )
    else:
        got = int4_group_grouped_experts(x, weights, ids, *stacks)
        deq = (
            dequantize_int4_group(stacks[0], stacks[1], 32),
            dequantize_int4_group(stacks[2], stacks[3], 32),
        )
    assert relative_error(got, reference(x, weights, ids, *deq)) < 1e-2


@pytest.mark.gpu
def test_gpu_quantized_experts_replay_in_a_cuda_graph():
    stacks = fp8_stacks(16, 1024, 256, seed=0)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    weights, ids = routing(8, 16, 4, 16, seed=0)
    fp8_block_grouped_experts(x, weights, ids, *stacks)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_block_grouped_experts(x, weights, ids, *stacks)
    new_weights, new_ids = routing(8, 16, 4, 16, seed=1)
    x.copy_(torch.randn_like(x))
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    assert torch.equal(out, fp8_block_grouped_experts(x, weights, ids, *stacks))


@pytest.mark.gpu
def test_gpu_grouped_bandwidth():
    """Prints the grouped kernels' speed over the distinct experts' bytes (``pytest -s``); asserts no time."""
    from outpace.bench.quant_kernels import report_moe

    report_moe(tokens=(1, 8, 64))
