"""The INT4 W4A16 kernel (layers/quant/int4_linear_kernel.py) against F.linear on the dequantized weights
(layers/quant/dequantize.py, compressed-tensors pack-quantized: lowest nibble first, stored + 8, group 32):
N not a multiple of any tile, one row, a few, a verify batch (split K on the interpreter's 4 SMs) and a
prefill-sized batch. On the CPU, Triton's interpreter in float32 (summation orders are the only
difference); on the GPU, bf16 at the Kimi-K2 expert shapes; ``test_gpu_few_row_bandwidth`` prints the
kernel's speed (``pytest -s``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from outpace.layers.quant.dequantize import (  # noqa: E402
    dequantize_int4_group,
    quantize_int4_group,
)
from outpace.layers.quant.int4_linear_kernel import int4_group_linear  # noqa: E402
from outpace.layers.quant.weight_tiles import weight_tile  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


def random_int4(n: int, k: int, seed: int, group: int = 32, scale_dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    packed, scale = quantize_int4_group(w, group)
    return packed.to(DEVICE), scale.to(scale_dtype).to(DEVICE)


@pytest.mark.parametrize("m", [1, 3, 8, 40, 70])
@pytest.mark.parametrize("n, k", [(40, 2048), (72, 96)])  # (40, 2048): K split in 2 up to 64 rows
def test_int4_equals_f_linear_on_the_dequantized_weight(m, n, k):
    packed, scale = random_int4(n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    got = int4_group_linear(x, packed, scale, 32)
    assert got.shape == (m, n) and got.dtype == x.dtype
    expected = F.linear(x, dequantize_int4_group(packed, scale, 32))
    assert relative_error(got, expected) < 1e-6  # float32 summation orders only


def test_other_groups_and_float32_scales():
    for group in (64, 128):
        packed, scale = random_int4(48, 256, seed=group, group=group, scale_dtype=torch.float32)
        x = torch.randn(3, 256, device=DEVICE)
        expected = F.linear(x, dequantize_int4_group(packed, scale, group))
        assert relative_error(int4_group_linear(x, packed, scale, group), expected) < 1e-6


@pytest.mark.parametrize("m", [2, 8, 40])
def test_groups_of_a_k_step_or_more_take_their_scales_a_step_ahead(m):
    """Groups of 128 columns (w4a16 as RedHatAI and Gemma QAT publish it), K steps of one group: the few-row loop
    loads each step's scales a step ahead (layers/quant/quant_matmul_kernel.py, INT4 K steps). 16 steps, K split
    in 2 (the interpreter's 4 SMs), bf16 scales: every step takes its own group's scales, none past its split's."""
    packed, scale = random_int4(40, 2048, seed=m, group=128)
    x = torch.randn(m, 2048, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    expected = F.linear(x.double(), dequantize_int4_group(packed, scale, 128).double())
    assert relative_error(int4_group_linear(x, packed, scale, 128), expected) < 1e-6


def test_nibble_order_and_offset_matter():
    """One nibble changed moves one column's weight by one step of its group's scale: the kernel reads
    nibble j of a word as column 8 * word + j (lowest first), stored + 8."""
    packed, scale = random_int4(8, 64, seed=1)
    x = torch.zeros(1, 64, device=DEVICE)
    x[0, 13] = 1.0  # column 13: word 1, nibble 5
    base = int4_group_linear(x, packed, scale, 32)
    torch.testing.assert_close(base[0], dequantize_int4_group(packed, scale, 32)[:, 13])
    nibble = (packed[3, 1] >> 20) & 0xF
    packed[3, 1] += (1 if nibble < 15 else -1) << 20
    moved = int4_group_linear(x, packed, scale, 32) - base
    assert moved[0, 3].abs().item() == pytest.approx(scale[3, 0].float().item(), rel=1e-6)
    assert not torch.cat([moved[0, :3], moved[0, 4:]]).any()


@triton.jit
def _dequantized_kernel(
    w_ptr,
    s_ptr,
    out_ptr,
    N,
    K,
    GROUP: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    K_TILED: tl.constexpr,
):
    """out [N, K] = the INT4 weight's tiles as ``weight_tile`` dequantizes them into out's dtype."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = rows < N
    k0 = tl.program_id(1) * BK
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * (K // 8)
    s_rows = s_ptr + rows.to(tl.int64)[:, None] * (K // GROUP)
    tile = weight_tile(
        w_rows, s_rows, k0, K, n_ok, 1, "int4_group", GROUP, BK, out_ptr.dtype.element_ty, K_TILED
    )
    ks = k0 + tl.arange(0, BK)
    tl.store(
        out_ptr + rows[:, None] * K + ks[None, :], tile, mask=n_ok[:, None] & (ks < K)[None, :]
    )


def tiles_equal_the_reference(n: int, k: int, group: int, dtype: torch.dtype, device: str) -> bool:
    """``weight_tile``'s INT4 tiles, scales stored in ``dtype`` (on a GPU in bf16 and fp16 the PTX path,
    quant_matmul_kernel.py ``int4_tile_by_ptx``; Triton's interpreter the general one), bit for bit the
    reference's dequantization rounded to ``dtype``. Every nibble value at every position of a word."""
    g = torch.Generator().manual_seed(k + group)
    packed = torch.randint(-(2**31), 2**31, (n, k // 8), generator=g, dtype=torch.int64)
    packed = packed.to(torch.int32).to(
        device
    )  # random words: nibble 0 (-8) too, which quantizers leave out
    scale = (torch.randn(n, k // group, generator=g) * 1e-2).to(dtype).to(device)
    out = torch.empty(n, k, dtype=dtype, device=device)
    bk = 256
    _dequantized_kernel[(triton.cdiv(n, 16), triton.cdiv(k, bk))](
        packed, scale, out, n, k, GROUP=group, BN=16, BK=bk, K_TILED=k % bk == 0
    )
    nibbles = torch.stack([(packed >> (4 * j)) & 0xF for j in range(8)])
    assert nibbles.unique().numel() == 16  # (the weight holds every value)
    return torch.equal(out, dequantize_int4_group(packed, scale, group).to(dtype))


@pytest.mark.parametrize("group", [32, 128])
def test_tiles_dequantize_bit_for_bit(group):
    """float32 (half precision takes the PTX path on a GPU, below; Triton's interpreter rounds float32 to bf16
    by truncation). K = 384 ends half way into the second 256-column tile, N = 40 in the third 16-row block."""
    assert tiles_equal_the_reference(40, 384, group, torch.float32, DEVICE)


def test_bad_shapes_are_refused_by_name():
    packed, scale = random_int4(8, 64, seed=2)
    x = torch.randn(1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="weight_scale"):
        int4_group_linear(x, packed, scale[:, :1], 32)
    with pytest.raises(ValueError, match="holds 64"):
        int4_group_linear(x[:, :32], packed, scale, 32)
    with pytest.raises(ValueError, match="int32"):
        int4_group_linear(x, packed.to(torch.int64), scale, 32)
    with pytest.raises(ValueError, match="power of two"):
        int4_group_linear(x, packed, scale, 24)


# ---- GPU: bf16 at the Kimi-K2 shapes, and the speed of the few-row kernel --------------------------------

KIMI_SHAPES = {"expert_gate_up": (4096, 7168), "expert_down": (7168, 2048)}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64, 256])
@pytest.mark.parametrize("name", list(KIMI_SHAPES))
def test_gpu_bf16_at_the_kimi_shapes(name, m):
    """Tolerance: the nibble times its bf16 scale is rounded to bf16 (2^-9 relative, random across K),
    float32 accumulation, bf16 output: below 1e-2 relative."""
    n, k = KIMI_SHAPES[name]
    packed, scale = random_int4(n, k, seed=m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    expected = F.linear(x.float(), dequantize_int4_group(packed, scale, 32))
    assert relative_error(int4_group_linear(x, packed, scale, 32), expected) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_ptx_tiles_dequantize_bit_for_bit(dtype, group):
    """The PTX nibbles (scales in x's dtype) at a Kimi-K2 expert's down shape, the last rows masked (K a whole
    number of tiles: the rows alone masked), and at K = 384 (the columns masked too)."""
    assert tiles_equal_the_reference(7168 - 8, 2048, group, dtype, "cuda")
    assert tiles_equal_the_reference(40, 384, group, dtype, "cuda")


@pytest.mark.gpu
def test_gpu_few_row_bandwidth():
    """Prints the few-row kernel's speed over the packed bytes (``pytest -s``); asserts nothing about time."""
    from outpace.bench.quant_kernels import report_linear

    report_linear({"kimi": KIMI_SHAPES}, rows=(1, 8, 64), formats=("int4",))


SM90_TILES = """
sys.path.insert(0, sys.argv[1])
from kernels.test_int4_linear import _dequantized_kernel

for out, scale in (("*fp32", "*fp32"), ("*fp16", "*fp32"), ("*bf16", "*bf16"), ("*fp16", "*fp16")):
    try:
        compiled = compile_for_hopper(
            _dequantized_kernel, {"w_ptr": "*i32", "s_ptr": scale, "out_ptr": out},
            {"GROUP": 128, "BN": 16, "BK": 256, "K_TILED": False},
        )
    except Exception as error:  # (triton.compiler.errors.CompilationError)
        print(out, scale, type(error).__name__)
        continue
    print(out, scale, "lop3" if "lop3.b32" in compiled.asm["ptx"] else "general")
"""


# A few-row product of a group-128 weight compiled for sm_90 as quant_matmul launches it: the loads of bf16 values in
# its K loop (the scales: 2 bytes a row, which the software pipeline does not stream) and what the loop carries on
SM90_SCALES_AHEAD = """
import re
from outpace.layers.quant import quant_matmul_kernel as qm
x = torch.randn(8, 4096, dtype=torch.bfloat16)
w = torch.zeros(1024, 512, dtype=torch.int32)
s = torch.ones(1024, 32, dtype=torch.bfloat16)
run = lambda: qm.quant_matmul(x, w, s, "int4_group", (1, 128))
(args, kwargs), = launches_of(qm, ["_quant_matmul_kernel"], run)["_quant_matmul_kernel"]
ttgir = compile_as_launched(qm._quant_matmul_kernel, args, kwargs).asm["ttgir"]
lines = ttgir[ttgir.index("scf.for"):].splitlines()
indent = len(lines[1]) - len(lines[1].lstrip())
body = lines[1:next(i for i, l in enumerate(lines) if l.startswith(" " * indent + "scf.yield"))]
yielded = next(l for l in lines if l.startswith(" " * indent + "scf.yield"))
loads = [l.split("=")[0].strip() for l in body if "tt.load" in l and "ptr<bf16>" in l]
print(len(loads), all(re.search(re.escape(v) + r"\\b", yielded) for v in loads))
"""


def test_group_scales_of_a_k_step_load_a_step_ahead_on_sm90(tmp_path):
    """Compiled for sm_90 (no GPU needed): the scales of a K step in one group of 128 columns are loaded in the step
    before (the loop carries them on), not loaded and used at once, each step waiting on its load."""
    from pathlib import Path

    from helpers.hopper_compile import run_compile_script

    done = run_compile_script(SM90_SCALES_AHEAD, str(Path(__file__).parents[1]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "True"]


def test_int4_tiles_compile_for_sm90_with_the_ptx_path_chosen_at_compile_time(tmp_path):
    """``weight_tile``'s INT4 tiles compiled for sm_90 (no GPU needed): the nibbles by PTX exactly where x and the
    scales share a half-precision dtype, chosen when the kernel compiles. The choice had been a runtime branch
    (a local holding a comparison's bool becomes a tensor in Triton), which compiled both returns and failed
    for float32 (the PTX path's fp16 against float32): on the H100, gpu_2026-12-06c."""
    from pathlib import Path

    from helpers.hopper_compile import run_compile_script

    done = run_compile_script(SM90_TILES, str(Path(__file__).parents[1]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "*fp32 *fp32 general",
        "*fp16 *fp32 general",
        "*bf16 *bf16 lop3",
        "*fp16 *fp16 lop3",
    ]
