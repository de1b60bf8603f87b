"""The few-row quantized matmul (layers/quant/quant_matmul_kernel.py ``_quant_matmul_kernel``) compiled for an
H100 / H200 (sm_90) without a GPU, in a process of its own (the interpreter replaces @triton.jit here), as its
launches compile it: ``quant_matmul`` runs on CPU tensors of two tokens or one (bf16) over a block-FP8 weight (132 SMs)
with a recorder in place of the kernel, and each recorded launch is compiled as Triton's launcher specializes
it. Six launches: the plan's at Step-3.5-Flash's q_proj at tensor parallelism 2 (6144 x 4096: the wide
tiles, 64 columns a program over 256-column K steps, 3 stages, K split), a 512-column K step over the
128-column scales (the settings sweep's widest, benchmarks/scripts/quant_matmul_settings.py) and an unsplit
launch (Llama-8B's gate_up 28672 x 4096 at one program an SM), and two of the fused residual stack's epilogues
(``RowEpilogue``: the residual add and the next norm readied; the input norm's factor), each over two tokens;
and one token's launch (ONE-ROW: the plan's row streams) with the first epilogue; SiLU's gating in the store
(``RowEpilogue.swiglu``) at one row and two, and GELU-tanh's (``RowEpilogue.gelu``, Gemma's GeGLU). Each must
compile, keep its registers (ptxas -v: no spills) and, launched with programmatic dependent launch, prefetch its first weight
lines into L2 before it waits; the 16-row tiles stream the weight through cp.async and multiply with mma.sync
(under wgmma's M of 64, the weight read from shared memory into registers and dequantized there), the one-row
tile loads it 16 bytes at a time into registers and uses no tensor cores. Over an INT4 weight (Kimi-K2's expert
gate/up, group 32, bf16 scales): at one row the one-row tile (no tensor cores, no conversion instruction), at eight
the plan's INT4 tiles, the nibbles turned into bf16 by PTX and every bf16 load (the scales too) streamed through
cp.async; and the fused stack's INT4 epilogues (GELU-tanh's gating, the next norm readied) at one row and two."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: ptxas_report, launches_of, compile_as_launched)
SM90_COMPILE = """
from outpace.layers.quant import quant_matmul_kernel as qm

qm.num_sms = lambda device: 132  # an H200's grids
qm.pdl_available = lambda device: True  # as on an H200: programmatic dependent launch, weights prefetched

def launch(n, k, epilogue=None, rows=2, **options):
    '''quant_matmul of ``rows`` tokens over a block-FP8 [n, k] weight: plan's tiles, or few_row_tiles' with
    options; its tiles finished by ``epilogue`` (n, k, rows -> RowEpilogue) when given.'''
    weight = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    scale = torch.empty(-(-n // 128), -(-k // 128))
    x = torch.empty(rows, k, dtype=torch.bfloat16)
    tiles = qm.few_row_tiles(rows, n, k, torch.device("cpu"), **options) if options else None
    finish = epilogue(n, k, rows) if epilogue else None
    return lambda: qm.quant_matmul(x, weight, scale, "fp8_block", (128, 128), tiles, finish)

def ready(n, k, m):
    '''o_proj's over m rows: the residual added, the next norm readied.'''
    parts = qm.column_blocks(m, n, k, "fp8_block", 128, torch.device("cpu"))
    rows = torch.empty(m, n, dtype=torch.bfloat16)
    next_norm = (torch.empty(n, dtype=torch.bfloat16), 0.0, rows.clone(), torch.empty(parts, m))
    return qm.RowEpilogue(residual=rows, next_norm=next_norm)

def row_norm(n, k, m):
    '''A projection behind a norm: each of the m rows' factor from 64 partial sums of squares.'''
    return qm.RowEpilogue(row_norm=(torch.empty(64, m), 1e-6))

cases = {  # name: (launch, (BN, BK, stages, split K))
    "plan": (launch(6144, 4096), (64, 256, 3, True)),
    "bk512": (
        launch(6144, 4096, block_n=32, block_k=512, num_warps=4, num_stages=3),
        (32, 512, 3, True),
    ),
    "unsplit": (
        launch(28672, 4096, block_n=64, block_k=256, num_warps=4, num_stages=3, programs_per_sm=1),
        (64, 256, 3, False),
    ),
    # DeepSeek-V2-Lite's o_proj (2048 x 2048, K split) readying the post-attention norm; a dense gate/up
    # (2 x 10944 x 2048: the wide tiles, unsplit) behind the input norm
    "ready": (launch(2048, 2048, ready), (32, 128, 4, True)),
    "row_norm": (launch(21888, 2048, row_norm), (64, 256, 3, False)),
    # one row on the CUDA cores (ONE-ROW): DeepSeek-V2-Lite's o_proj readying the norm, plan's row streams
    "one_row": (launch(2048, 2048, ready, rows=1), None),
}
def int4(n, k, rows, epilogue=None):
    '''quant_matmul of ``rows`` tokens over an INT4 [n, k] weight (group 32, bf16 scales: Kimi-K2's experts), its
    tiles finished by ``epilogue`` (n, k, rows -> RowEpilogue) when given.'''
    packed = torch.empty(n, k // 8, dtype=torch.int32)
    scale = torch.empty(n, k // 32, dtype=torch.bfloat16)
    x = torch.empty(rows, k, dtype=torch.bfloat16)
    finish = epilogue(n, k, rows) if epilogue else None
    return lambda: qm.quant_matmul(x, packed, scale, "int4_group", (1, 32), epilogue=finish)

# INT4 at one row (Kimi-K2's expert gate/up) on the CUDA cores; at eight rows the nibbles by PTX (lop3, bf16x2 fmas)
# and every bf16 load, the scales' too, streamed through cp.async (K a whole number of steps), none left for a K step
# to wait on
for rows in (1, 8):
    (args, kwargs), = launches_of(qm, ["_quant_matmul_kernel"], int4(4096, 7168, rows))["_quant_matmul_kernel"]
    compiled = compile_as_launched(qm._quant_matmul_kernel, args, kwargs)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    checks = {"spills": "0 bytes spill stores" in ptxas_report(compiled)}
    if rows == 1:  # one row on the CUDA cores: 16-byte loads, no tensor cores, no conversion instruction
        checks["tiles"] = kwargs["BM"] == 1
        checks["registers"] = "ld.global.v4" in ptx and "mma" not in ptx and "cvt.rn.f32.s32" not in ptx
        # each nibble into float32 by one lop3 (and, or; weight_tiles._nibble_times), no and + or pair
        checks["one lop3 a nibble"] = "1258291200, 0xEA;" in ptx and ", 1258291200;" not in ptx
    else:
        checks["tiles"] = (kwargs["BN"], kwargs["BK"], kwargs["K_TILED"]) == (64, 128, True)
        checks["nibbles"] = "lop3.b32" in ptx and "fma.rn.bf16x2" in ptx
        checks["streamed"] = "cp.async" in ptx and not any(
            "tt.load" in l and "ptr<bf16>" in l for l in ttgir.splitlines()
        )
    print(f"int4_{rows}", all(checks.values()) or ",".join(c for c, ok in checks.items() if not ok))

# the fused stack's INT4 products (Gemma 4 QAT's projections): a gate/up gated by GELU-tanh behind the input norm, and
# an o_proj readying the next norm, at one row and two: each compiles and keeps its registers
gelu = lambda n, k, m: qm.RowEpilogue(row_norm=(torch.empty(64, m), 1e-6), swiglu=True, gelu=True)
ready_int4 = lambda n, k, m: qm.RowEpilogue(
    residual=torch.empty(m, n, dtype=torch.bfloat16),
    next_norm=(
        torch.empty(n), 0.0, torch.empty(m, n, dtype=torch.bfloat16),
        torch.empty(qm.column_blocks(m, n, k, "int4_group", 32, torch.device("cpu")), m),
    ),
)
for name, (n, k, finish) in {"int4_gelu": (2 * 7680, 3840, gelu), "int4_ready": (3840, 4096, ready_int4)}.items():
    for rows in (1, 2):
        (args, kwargs), = launches_of(qm, ["_quant_matmul_kernel"], int4(n, k, rows, finish))["_quant_matmul_kernel"]
        compiled = compile_as_launched(qm._quant_matmul_kernel, args, kwargs)
        print(f"{name}_{rows}", "0 bytes spill stores" in ptxas_report(compiled))

# SiLU's gating in the store (RowEpilogue.swiglu) over Step-3.5's shared expert (2 x 1280 rows of 4096), the input norm's
# factor folded in, at one row (ONE-ROW) and two (the 16-row tiles), and GELU-tanh's (RowEpilogue.gelu) over
# Gemma-3-12B's gate/up (2 x 15360 rows of 3840): each compiles and keeps its registers
for act, n, k in (("swiglu", 2560, 4096), ("gelu", 30720, 3840)):
    for rows in (1, 2):
        gated = lambda n, k, m: qm.RowEpilogue(
            row_norm=(torch.empty(64, m), 1e-6), swiglu=True, gelu=act == "gelu"
        )
        (args, kwargs), = launches_of(qm, ["_quant_matmul_kernel"], launch(n, k, gated, rows=rows))["_quant_matmul_kernel"]
        compiled = compile_as_launched(qm._quant_matmul_kernel, args, kwargs)
        ok = kwargs["SWIGLU"] and kwargs["GELU"] == (act == "gelu") and (kwargs["BM"] == 1) == (rows == 1)
        print(f"{act}_{rows}", ok and "0 bytes spill stores" in ptxas_report(compiled))

for name, (run, expected) in cases.items():
    (args, kwargs), = launches_of(qm, ["_quant_matmul_kernel"], run)["_quant_matmul_kernel"]
    compiled = compile_as_launched(qm._quant_matmul_kernel, args, kwargs)
    ptx = compiled.asm["ptx"]
    if expected is None:  # (plan's)
        t = qm.plan(1, 2048, 2048, "fp8_block", 128, torch.device("cpu"), next_norm=True)
        expected = (t.block_n, t.block_k, t.num_stages, t.splits > 1)
    tiles = (kwargs["BN"], kwargs["BK"], kwargs["num_stages"], kwargs["SPLIT_K"])
    checks = {
        "tiles": tiles == expected and (kwargs["BM"] == 1) == (name == "one_row"),
        "spills": "0 bytes spill stores" in ptxas_report(compiled),
        "pdl": "griddepcontrol.wait" in ptx and "prefetch.global.L2" in ptx,
    }
    if name == "one_row":  # 16-byte loads of the weight into registers, no tensor cores
        checks["ld.v4"] = "ld.global.v4" in ptx and "mma" not in ptx
    else:
        checks["cp.async"] = "cp.async" in ptx
        checks["mma.sync"] = "mma.sync" in ptx and "wgmma" not in ptx
    print(name, all(checks.values()) or ",".join(c for c, ok in checks.items() if not ok))
"""


def test_quant_matmul_launches_compile_for_sm90(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = (
        "int4_1",
        "int4_8",
        "int4_gelu_1",
        "int4_gelu_2",
        "int4_ready_1",
        "int4_ready_2",
        "swiglu_1",
        "swiglu_2",
        "gelu_1",
        "gelu_2",
        "plan",
        "bk512",
        "unsplit",
        "ready",
        "row_norm",
        "one_row",
    )
    assert done.stdout.split() == [w for n in names for w in (n, "True")]
