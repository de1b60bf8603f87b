"""The FP8 linear kernels (layers/quant/fp8_linear_kernel.py) against F.linear on the dequantized weights
(layers/quant/dequantize.py): block FP8 with N and K not multiples of the block, bf16 scales (Qwen files)
and power-of-two ones (ue8m0), per-tensor FP8; one row, a few, a verify batch (split K on the interpreter's
4 SMs) and a prefill-sized batch (the many-row tiles). On the CPU the kernels run in Triton's interpreter in
float32: the only differences from the reference are float32 summation orders. On the GPU, bf16 inputs at
the DeepSeek-V3 shapes; ``test_gpu_few_row_bandwidth`` prints the kernel's speed (``pytest -s``)."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers.quant import quant_matmul_kernel  # noqa: E402
from outpace.layers.quant.dequantize import (  # noqa: E402
    dequantize_fp8_block,
    dequantize_fp8_tensor,
    quantize_fp8_block,
    quantize_fp8_tensor,
)
from outpace.layers.quant.fp8_linear_kernel import (  # noqa: E402
    SCALED_MM_FROM_ROWS,
    fp8_block_linear,
    fp8_tensor_linear,
    quantize_activations,
)
from outpace.layers.quant.quant_matmul_kernel import (  # noqa: E402
    QuantTiles,
    RowEpilogue,
    plan,
    quant_matmul,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = (128, 128)
# The launch-option tests' x and tolerance. On the GPU the serving path's bf16 rows (a float32 x tile of 512
# columns does not fit shared memory beside the weight's: Triton's OutOfResources), the weight values rounded
# to bf16 once scaled, float32 accumulation and bf16 output: below 1e-2 relative (as
# test_gpu_bf16_at_the_deepseek_shapes). On the CPU the interpreter in float32: summation orders only.
X_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOLERANCE = 1e-2 if DEVICE == "cuda" else 1e-6


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


def random_block_fp8(n: int, k: int, seed: int, scale_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3  # rows of other ranges
    weight, scale_inv = quantize_fp8_block(w, BLOCK)
    return weight.to(DEVICE), scale_inv.to(scale_dtype).to(DEVICE)


@pytest.mark.parametrize("m", [1, 3, 8, 40, 70])
@pytest.mark.parametrize("n, k", [(40, 1100), (200, 136)])  # (40, 1100): K split in 2 up to 64 rows
def test_block_fp8_equals_f_linear_on_the_dequantized_weight(m, n, k):
    weight, scale_inv = random_block_fp8(n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    got = fp8_block_linear(x, weight, scale_inv, BLOCK)
    assert got.shape == (m, n) and got.dtype == x.dtype
    expected = F.linear(x, dequantize_fp8_block(weight, scale_inv, BLOCK))
    assert relative_error(got, expected) < 1e-6  # float32 summation orders only


def test_bf16_and_power_of_two_scales():
    """Qwen's bf16 weight_scale_inv and ue8m0 (power-of-two) scales: the same weight math."""
    weight, scale_inv = random_block_fp8(130, 256, seed=1)
    for scale in (scale_inv.to(torch.bfloat16), torch.exp2(torch.ceil(torch.log2(scale_inv)))):
        x = torch.randn(3, 256, device=DEVICE)
        expected = F.linear(x, dequantize_fp8_block(weight, scale, BLOCK))
        assert relative_error(fp8_block_linear(x, weight, scale, BLOCK), expected) < 1e-6


def test_the_scale_multiplies_each_block():
    """A scale changed in one block changes exactly that block's rows and nothing else (so a transposed
    or divided scale fails the equalities above)."""
    weight, scale_inv = random_block_fp8(200, 300, seed=2)
    x = torch.randn(2, 300, device=DEVICE)
    base = fp8_block_linear(x, weight, scale_inv, BLOCK)
    scale_inv[1, 2] *= 2.0
    moved = (fp8_block_linear(x, weight, scale_inv, BLOCK) - base).abs().amax(dim=0) > 1e-6
    assert moved[128:].all() and not moved[:128].any()


def test_split_k_on_narrow_products():
    """The interpreter's 4 SMs: 40 columns in 2 blocks of 32 split K's 9 steps 2 ways (at least 4 steps
    each); a second call (counters left at zero) gives the same bits."""
    tiles = plan(2, 40, 1100, "fp8_block", 128, torch.device(DEVICE))
    if DEVICE == "cpu":
        assert tiles.splits == 2
    weight, scale_inv = random_block_fp8(40, 1100, seed=3)
    x = torch.randn(2, 1100, device=DEVICE)
    first = fp8_block_linear(x, weight, scale_inv, BLOCK)
    assert torch.equal(fp8_block_linear(x, weight, scale_inv, BLOCK), first)


# ---- quant_matmul's launch options (QuantTiles): K steps over several scales, split K --------------------


def blocky_fp8(n: int, k: int, seed: int, block=BLOCK):
    """``random_block_fp8`` with each block column of its own magnitude (x16 and x1/16 in turn), so a scale
    applied to another block's columns is far off."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w *= (16.0 ** (torch.arange(k) // block[1] % 3 - 1))[None, :]
    weight, scale_inv = quantize_fp8_block(w, block)
    return weight.to(DEVICE), scale_inv.to(DEVICE)


def launch_options(m: int, k: int, block_k: int, split: bool) -> QuantTiles:
    """64 columns a program, m's row tile, 4 warps, 3 stages; split: one K step a split."""
    k_per_split = block_k if split else k
    splits = -(-k // k_per_split)
    return QuantTiles(16 if m <= 16 else 32, 64, block_k, splits, k_per_split, 4, 3)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("block_k", [128, 256, 512])
def test_launch_options_equal_the_product_on_the_dequantized_weight(block_k, split):
    """N = 200 and K = 1100 multiples of neither BN nor BK (nor the 128-column scale blocks); 1 to 20 rows
    (row tiles of 16 and 32); x in X_DTYPE."""
    weight, scale_inv = blocky_fp8(200, 1100, seed=block_k)
    dense = dequantize_fp8_block(weight, scale_inv, BLOCK)
    g = torch.Generator().manual_seed(7)
    for m in range(1, 21):
        x = torch.randn(m, 1100, generator=g).to(DEVICE, X_DTYPE)
        tiles = launch_options(m, 1100, block_k, split)
        assert tiles.splits > 1 if split else tiles.splits == 1
        got = quant_matmul(x, weight, scale_inv, "fp8_block", BLOCK, tiles)
        assert relative_error(got, F.linear(x.float(), dense)) < TOLERANCE, m


@pytest.mark.parametrize("block_k", [256, 512])
def test_a_wide_k_step_scales_each_block_column_by_its_own_scale(block_k):
    """x only in columns 128 .. 255: the product is those columns' fp8 values times scale column 1 (not 0
    or 2, which share the step); doubling scale column 1 doubles it, doubling 0 or 2 changes nothing. A
    misapplied scale is off by half the product or more (the block columns' magnitudes differ 16-fold),
    far above TOLERANCE."""
    weight, scale_inv = blocky_fp8(200, 600, seed=8)
    x = torch.zeros(3, 600, device=DEVICE, dtype=X_DTYPE)
    x[:, 128:256] = torch.randn(3, 128, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    tiles = launch_options(3, 600, block_k, split=False)
    second = weight[:, 128:256].float() * scale_inv[:, 1].repeat_interleave(128)[:200, None]
    expected = x[:, 128:256].float() @ second.T  # [3, 200]
    for column, factor in ((None, 1.0), (0, 1.0), (1, 2.0), (2, 1.0)):
        scales = scale_inv.clone()
        if column is not None:
            scales[:, column] *= 2.0
        got = quant_matmul(x, weight, scales, "fp8_block", BLOCK, tiles)
        assert relative_error(got, factor * expected) < TOLERANCE, column


def test_plan_steps_over_scales_narrower_than_its_k_step():
    """Scales of 64 columns: plan's 128-column fp8 step spans two (it no longer narrows the step)."""
    weight, scale_inv = blocky_fp8(72, 300, seed=10, block=(128, 64))
    assert plan(2, 72, 300, "fp8_block", 64, torch.device(DEVICE)).block_k == 128
    x = torch.randn(2, 300, device=DEVICE)
    expected = F.linear(x, dequantize_fp8_block(weight, scale_inv, (128, 64)))
    got = quant_matmul(x, weight, scale_inv, "fp8_block", (128, 64))
    assert relative_error(got, expected) < 1e-6


def test_plan_gives_large_fp8_weights_wide_k_steps_up_to_16_rows():
    """From 4096 x 4096 fp8 values, up to 16 rows: 64 columns a program over two 128-column scale blocks a
    step (the H200 sweep's choice); smaller weights, more rows and INT4 keep the default tiles. (The product
    over such tiles: test_launch_options_equal_the_product_on_the_dequantized_weight.)"""
    device = torch.device(DEVICE)
    wide = plan(16, 4096, 4096, "fp8_block", 128, device)
    assert (wide.block_n, wide.block_k, wide.num_stages) == (64, 256, 3)
    assert plan(2, 6144, 4096, "fp8_tensor", 128, device).block_k == 256
    for m, n, fmt in ((17, 4096, "fp8_block"), (2, 2048, "fp8_block"), (2, 4096, "int4_group")):
        tiles = plan(m, n, 4096, fmt, 128 if fmt == "fp8_block" else 32, device)
        assert (tiles.block_n, tiles.block_k) != (64, 256), (m, n, fmt)


# ---- one row on the CUDA cores (quant_matmul_kernel.py ONE-ROW: row_times_tile) ---------------------------


def one_row_options(k: int, block_k: int, split: bool) -> QuantTiles:
    """A one-row tile, 16 columns a program, 4 warps; split: one K step a split."""
    k_per_split = block_k if split else k
    return QuantTiles(1, 16, block_k, -(-k // k_per_split), k_per_split, 4, 1)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("block_k", [128, 256, 512])
@pytest.mark.parametrize("scale_k", [64, 128])
def test_one_row_scales_each_group_by_its_own_block_column(scale_k, block_k, split):
    """N = 200 and K = 1100 multiples of neither the program's columns nor the K step nor the scale blocks,
    whose columns differ 16-fold in magnitude (``blocky_fp8``): a scale applied to another block column's
    values is off by far more than TOLERANCE; a doubled scale column doubles its columns' share only."""
    weight, scale_inv = blocky_fp8(200, 1100, seed=block_k + scale_k, block=(128, scale_k))
    x = torch.randn(1, 1100, generator=torch.Generator().manual_seed(5)).to(DEVICE, X_DTYPE)
    tiles = one_row_options(1100, block_k, split)
    for column in (None, 3):
        scales = scale_inv.clone()
        if column is not None:
            scales[:, column] *= 2.0
        dense = dequantize_fp8_block(weight, scales, (128, scale_k))
        got = quant_matmul(x, weight, scales, "fp8_block", (128, scale_k), tiles)
        assert relative_error(got, F.linear(x.float(), dense)) < TOLERANCE, column


@pytest.mark.parametrize("split", [False, True])
def test_one_row_per_tensor_fp8_and_its_epilogue(split):
    """Per-tensor fp8 (its scale on the product) through a one-row tile, with the residual added: as F.linear
    on the dequantized weight plus the residual."""
    g = torch.Generator().manual_seed(13)
    weight, scale = quantize_fp8_tensor(torch.randn(72, 1100, generator=g))
    weight, scale = weight.to(DEVICE), scale.to(DEVICE)
    x = torch.randn(1, 1100, generator=g).to(DEVICE, X_DTYPE)
    residual = torch.randn(1, 72, generator=g).to(DEVICE, X_DTYPE)
    got = quant_matmul(
        x,
        weight,
        scale,
        "fp8_tensor",
        (1, 1),
        one_row_options(1100, 256, split),
        RowEpilogue(residual=residual),
    )
    expected = F.linear(x.float(), dequantize_fp8_tensor(weight, scale)) + residual.float()
    assert relative_error(got, expected) < TOLERANCE


def test_plan_takes_one_row_on_the_cuda_cores_for_quantized_weights_outside_batch_invariant_mode():
    """One row of an fp8 weight of at most ONE_ROW_MAX_K columns, of an INT4 one of at most ONE_ROW_MAX_INT4_K: the
    one-row tile (``one_row_tiles``); wider, two rows, batch-invariant mode (a row's bits as among many rows) and
    ``one_row_cuda_cores`` off: the 16-row tile."""
    device = torch.device(DEVICE)
    assert plan(1, 2048, 2048, "fp8_block", 128, device).block_m == 1
    assert plan(1, 2048, 2048, "fp8_tensor", 1, device).block_m == 1
    assert plan(2, 2048, 2048, "fp8_block", 128, device).block_m == 16
    assert (
        plan(1, 2048, quant_matmul_kernel.ONE_ROW_MAX_K + 128, "fp8_block", 128, device).block_m
        == 16
    )
    assert (
        plan(1, 2048, quant_matmul_kernel.ONE_ROW_MAX_INT4_K, "int4_group", 32, device).block_m == 1
    )
    wide = quant_matmul_kernel.ONE_ROW_MAX_INT4_K + 128
    assert plan(1, 2048, wide, "int4_group", 32, device).block_m == 16
    assert plan(2, 2048, 2048, "int4_group", 32, device).block_m == 16
    with forward_settings(True):
        assert plan(1, 2048, 2048, "fp8_block", 128, device).block_m == 16
    with patch.object(quant_matmul_kernel, "one_row_cuda_cores", False):
        assert plan(1, 2048, 2048, "fp8_block", 128, device).block_m == 16


def test_one_row_of_a_weight_that_fills_the_gpu_takes_the_wide_tiles():
    """``one_row_wide_tiles``, when on and the row streams off (8 columns a program, 2048-column K steps, K unsplit),
    where their column blocks alone give 1.5 programs an SM (4 where K takes two steps or more), at an H200's 132 SMs:
    Step-3.5's q_proj, Qwen3-Next's in_proj, DeepSeek-V2-Lite's q and o; not Qwen3-Next's out_proj (2048 x 4096), kv_a
    (576 rows), a K under one step, INT4, two rows, batch-invariant mode or the tiles off."""
    device = torch.device(DEVICE)
    wide = quant_matmul_kernel.ONE_ROW_WIDE_TILES
    with (
        patch.object(quant_matmul_kernel, "num_sms", lambda device: 132),
        patch.object(quant_matmul_kernel, "one_row_wide_tiles", wide),
        patch.object(quant_matmul_kernel, "one_row_streams", False),
    ):
        for n, k in ((6144, 4096), (12352, 2048), (3072, 2048), (2048, 2048)):
            tiles = plan(1, n, k, "fp8_block", 128, device)
            assert (tiles.block_n, tiles.block_k, tiles.num_warps, tiles.splits) == (
                wide[0],
                wide[1],
                wide[2],
                1,
            ), (n, k)
            assert tiles.k_per_split >= k
        for m, n, k, fmt in (
            (1, 2048, 4096, "fp8_block"),
            (1, 576, 2048, "fp8_block"),
            (1, 12288, 1024, "fp8_block"),
            (1, 12288, 2048, "int4_group"),
            (2, 12288, 2048, "fp8_block"),
        ):
            assert plan(m, n, k, fmt, 128, device).block_k != wide[1], (m, n, k, fmt)
        with forward_settings(True):
            assert plan(1, 6144, 4096, "fp8_block", 128, device).block_m == 16
        with patch.object(quant_matmul_kernel, "one_row_wide_tiles", None):
            assert plan(1, 6144, 4096, "fp8_block", 128, device).block_k != wide[1]


@pytest.mark.parametrize("k", [2048, 2100, 4096])
def test_one_row_over_the_wide_tiles_equals_the_product_on_the_dequantized_weight(k):
    """The wide tiles' launch (16 scale columns a K step; K = 2100: the second step mostly past the weight), its
    residual added: F.linear on the dequantized weight plus the residual, every scale column its own."""
    bn, bk, warps, stages = quant_matmul_kernel.ONE_ROW_WIDE_TILES
    weight, scale_inv = blocky_fp8(200, k, seed=k, block=(128, 128))
    g = torch.Generator().manual_seed(k)
    x = torch.randn(1, k, generator=g).to(DEVICE, X_DTYPE)
    residual = torch.randn(1, 200, generator=g).to(DEVICE, X_DTYPE)
    tiles = QuantTiles(1, bn, bk, 1, -(-k // bk) * bk, warps, stages)
    got = quant_matmul(
        x, weight, scale_inv, "fp8_block", (128, 128), tiles, RowEpilogue(residual=residual)
    )
    dense = dequantize_fp8_block(weight, scale_inv, (128, 128))
    expected = F.linear(x.float(), dense) + residual.float()
    assert relative_error(got, expected) < TOLERANCE


def _gelu_tanh_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU-tanh(gate) * up rounded as a gating launch after the product rounds it: the activation to gate's
    dtype, the product to it."""
    return (F.gelu(gate.float(), approximate="tanh").to(gate.dtype).float() * up.float()).to(
        gate.dtype
    )


@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    "m, tiles_of", [(1, "plan"), (3, "plan"), (1, "one_split"), (3, "one_split"), (1, "wide")]
)
def test_a_swiglu_epilogue_gates_gate_and_up_as_the_gating_launch_after_the_product(
    m, tiles_of, gelu
):
    """``RowEpilogue.swiglu`` (and ``gelu``): a weight of 200 gate rows then 200 up rows (the up rows start inside a
    scale block's rows; K = 300 in 128-column blocks), the input norm's factor folded in, one row (ONE-ROW) and
    three, K split as planned, in one split, or one row in ``ONE_ROW_WIDE_TILES``: the product then a gating
    launch, in one launch (on the GPU, for SiLU the bits of layers/fused_kernels.py's launch; GELU-tanh's formula is
    not torch's, so to bf16 rounding)."""
    from outpace.layers.activation import silu_and_mul

    inter, k = 200, 300
    weight, scale_inv = blocky_fp8(2 * inter, k, seed=40 + m)
    g = torch.Generator().manual_seed(41)
    x = torch.randn(m, k, generator=g).to(DEVICE, X_DTYPE)
    sq = (torch.rand(4, m, generator=g) * k).to(DEVICE)  # the input norm's partial sums of squares
    tiles = plan(m, 2 * inter, k, "fp8_block", 128, torch.device(DEVICE))
    if tiles_of == "one_split":
        tiles = QuantTiles(tiles.block_m, 16, 128, 1, 384, tiles.num_warps, tiles.num_stages)
    if tiles_of == "wide":
        bn, bk, warps, stages = quant_matmul_kernel.ONE_ROW_WIDE_TILES
        tiles = QuantTiles(1, bn, bk, 1, bk, warps, stages)
    norm = RowEpilogue(row_norm=(sq, 1e-5))
    both = quant_matmul(x, weight, scale_inv, "fp8_block", (128, 128), tiles, norm)
    gating = _gelu_tanh_and_mul if gelu else silu_and_mul
    expected = gating(both[:, :inter], both[:, inter:])
    gated = RowEpilogue(row_norm=(sq, 1e-5), swiglu=True, gelu=gelu)
    got = quant_matmul(x, weight, scale_inv, "fp8_block", (128, 128), tiles, gated)
    assert got.shape == (m, inter)
    if DEVICE == "cuda" and not gelu:
        assert torch.equal(got, expected)
    elif (
        DEVICE == "cuda"
    ):  # (two bf16 roundings of nearly equal float32 values: a few units in the last place)
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=1e-3)
    else:  # (the interpreter's exp is numpy's, torch's activations their own; GELU's two forms part by 1e-5 near 0)
        torch.testing.assert_close(
            got, expected, rtol=1e-5 if gelu else 1e-6, atol=1e-5 if gelu else 1e-7
        )
    dense = dequantize_fp8_block(weight, scale_inv, (128, 128))
    gate, up = (F.linear(x.float(), dense) * torch.rsqrt(sq.sum(0) / k + 1e-5)[:, None]).chunk(
        2, -1
    )
    act = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    assert relative_error(got, act * up) < TOLERANCE


def test_a_swiglu_epilogue_takes_an_even_number_of_rows_and_the_input_norm_only():
    weight, scale_inv = blocky_fp8(64, 256, seed=12)
    x = torch.randn(1, 256, device=DEVICE, dtype=X_DTYPE)
    for bad in (
        dict(weight=weight[:63]),
        dict(epilogue=RowEpilogue(swiglu=True, residual=torch.zeros(1, 64, device=DEVICE))),
    ):
        args = dict(weight=weight, epilogue=RowEpilogue(swiglu=True)) | bad
        with pytest.raises(ValueError, match="SwiGLU epilogue"):
            quant_matmul(
                x, args["weight"], scale_inv, "fp8_block", BLOCK, epilogue=args["epilogue"]
            )
    with pytest.raises(ValueError, match="GELU epilogue gates"):
        quant_matmul(x, weight, scale_inv, "fp8_block", BLOCK, epilogue=RowEpilogue(gelu=True))


def test_a_k_step_that_does_not_tile_the_scales_is_refused():
    weight, scale_inv = blocky_fp8(64, 256, seed=11)
    x = torch.randn(1, 256, device=DEVICE)
    with pytest.raises(ValueError, match="K step of 192"):
        quant_matmul(
            x, weight, scale_inv, "fp8_block", BLOCK, launch_options(1, 256, 192, split=False)
        )


def test_leading_dimensions_and_strided_rows():
    weight, scale_inv = random_block_fp8(64, 256, seed=4)
    x = torch.randn(2, 3, 512, device=DEVICE)[..., :256]  # rows 512 apart
    expected = F.linear(x, dequantize_fp8_block(weight, scale_inv, BLOCK))
    assert relative_error(fp8_block_linear(x, weight, scale_inv, BLOCK), expected) < 1e-6


@pytest.mark.parametrize("m", [1, 8, 70])
def test_per_tensor_fp8_equals_f_linear(m):
    g = torch.Generator().manual_seed(m)
    weight, scale = quantize_fp8_tensor(torch.randn(72, 200, generator=g))
    weight, scale = weight.to(DEVICE), scale.to(DEVICE)
    x = torch.randn(m, 200, generator=g).to(DEVICE)
    got = fp8_tensor_linear(x, weight, scale)
    assert got.shape == (m, 72)
    assert relative_error(got, F.linear(x, dequantize_fp8_tensor(weight, scale))) < 1e-6


def test_batch_invariant_rows_keep_their_bits_in_any_batch():
    """Batch-invariant mode: a row's product has the same bits alone and among 300 rows (every M takes one
    row's tiles and K split, a split launch 256 rows at most); outside the mode 300 rows take the prefill
    tiles, whose sums over K run in another order."""
    g = torch.Generator().manual_seed(12)
    weight, scale = quantize_fp8_tensor(torch.randn(72, 1100, generator=g))
    weight, scale = weight.to(DEVICE), scale.to(DEVICE)
    x = torch.randn(300, 1100, generator=g).to(DEVICE, X_DTYPE)
    with forward_settings(True):
        assert plan(300, 72, 1100, "fp8_tensor", 1, torch.device(DEVICE)).splits > 1
        batch = quant_matmul(x, weight, scale, "fp8_tensor", (1, 1))
        for row in (0, 255, 256, 299):  # (either side of the 256-row launches)
            alone = quant_matmul(x[row : row + 1], weight, scale, "fp8_tensor", (1, 1))
            assert torch.equal(alone[0], batch[row]), row
    expected = F.linear(x.float(), dequantize_fp8_tensor(weight, scale))
    assert relative_error(batch, expected) < TOLERANCE


def test_bad_shapes_are_refused_by_name():
    weight, scale_inv = random_block_fp8(64, 256, seed=5)
    x = torch.randn(1, 256, device=DEVICE)
    with pytest.raises(ValueError, match="weight_scale_inv"):
        fp8_block_linear(x, weight, scale_inv[:, :1], BLOCK)
    with pytest.raises(ValueError, match="columns"):
        fp8_block_linear(x[:, :128], weight, scale_inv, BLOCK)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_block_linear(x, weight.float(), scale_inv, BLOCK)
    with pytest.raises(ValueError, match="one element"):
        fp8_tensor_linear(x, weight, scale_inv)


def test_activation_quantization_is_per_token_groups_of_128():
    x = torch.randn(5, 300, device=DEVICE)
    x[2, 128:256] *= 100.0  # one group of one row far larger
    q, scales = quantize_activations(x)
    assert q.shape == (8, 300) and scales.shape == (8, 3) and scales.stride() == (1, 8)
    assert not q[5:].float().any()  # padding rows
    for g in range(3):
        cols = slice(128 * g, 128 * (g + 1))
        torch.testing.assert_close(scales[:5, g], x[:, cols].abs().amax(dim=1) / 448.0)
        if DEVICE == "cuda":  # Triton 3.7's interpreter rounds 127.4 to 64 in e4m3 (no carry)
            expected = (x[:, cols] / scales[:5, g : g + 1]).to(torch.float8_e4m3fn)
            assert torch.equal(q[:5, cols].float(), expected.float())


# ---- GPU: bf16 at the DeepSeek-V3 shapes, and the speed of the few-row kernel ----------------------------

# (N, K): V3's projections, and V2-Lite's shared-expert down projection, whose 22 K blocks torch's GEMM takes
# padded to 24
DEEPSEEK_SHAPES = {
    "q_a": (1536, 7168),
    "kv_a": (576, 7168),
    "o": (7168, 16384),
    "up": (4096, 7168),
    "v2_lite_shared_down": (2048, 2816),
}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64, SCALED_MM_FROM_ROWS, 256])
@pytest.mark.parametrize("name", list(DEEPSEEK_SHAPES))
def test_gpu_bf16_at_the_deepseek_shapes(name, m):
    """Tolerances: up to 64 rows the weights are dequantized exactly (fp8 and bf16 have the same exponent
    range, 3 <= 7 mantissa bits) and rounded to bf16 once multiplied by the scale (2^-9 relative, random
    across K), with float32 accumulation and bf16 output: below 1e-2 relative. From SCALED_MM_FROM_ROWS
    rows torch's GEMM also quantizes the activations to e4m3 (3 mantissa bits: up to 2^-4 relative per
    element, about 2.5% RMS, random across K): below 6e-2."""
    n, k = DEEPSEEK_SHAPES[name]
    weight, scale_inv = random_block_fp8(n, k, seed=m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    expected = F.linear(x.float(), dequantize_fp8_block(weight, scale_inv, BLOCK))
    tol = 6e-2 if m >= SCALED_MM_FROM_ROWS else 1e-2
    assert relative_error(fp8_block_linear(x, weight, scale_inv, BLOCK), expected) < tol


@pytest.mark.gpu
def test_gpu_fp8_linear_replays_in_a_cuda_graph():
    weight, scale_inv = random_block_fp8(576, 7168, seed=0)  # split K
    x = torch.randn(4, 7168, device="cuda", dtype=torch.bfloat16)
    fp8_block_linear(x, weight, scale_inv)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_block_linear(x, weight, scale_inv)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, fp8_block_linear(x, weight, scale_inv))


@pytest.mark.gpu
def test_gpu_few_row_bandwidth():
    """Prints the few-row kernel's speed over the fp8 bytes (``pytest -s``); asserts nothing about time."""
    from outpace.bench.quant_kernels import report_linear

    report_linear({"deepseek": DEEPSEEK_SHAPES}, rows=(1, 8, 64))


@pytest.mark.parametrize("m", [1, 8, 70])
@pytest.mark.parametrize("k", [200, 1100])
def test_per_channel_fp8_as_blocks_of_one_row(m, k):
    """compressed-tensors' per-channel FP8 (a scale an output row) read as block FP8 of one row by a power of
    two of columns at least K (``Fp8Weight.per_channel``, as layers/quant/linear.py ``Fp8Channel`` serves it):
    F.linear on the dequantized weight, each row by its own scale."""
    from outpace.layers.quant.dequantize import dequantize_fp8_channel, quantize_fp8_channel
    from outpace.layers.quant.fp8_weight import Fp8Weight

    g = torch.Generator().manual_seed(m + k)
    w = torch.randn(72, k, generator=g) * torch.rand(72, 1, generator=g) * 3  # rows of other ranges
    weight, scale = (t.to(DEVICE) for t in quantize_fp8_channel(w))
    channel = Fp8Weight.per_channel(weight, scale)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    got = fp8_block_linear(x, channel.weight, channel.scale, channel.block)
    assert got.shape == (m, 72)
    assert relative_error(got, F.linear(x, dequantize_fp8_channel(weight, scale))) < 1e-6
