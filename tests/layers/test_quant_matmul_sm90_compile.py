"""The few-row quantized matmul (layers/quant/quant_matmul_kernel.py ``_quant_matmul_kernel``) compiled for an
H100 / H200 (sm_90) without a GPU, in a process of its own (the interpreter replaces @triton.jit here), as its
launches compile it: ``quant_matmul`` runs on CPU tensors of Step-3.5-Flash's q_proj at tensor parallelism 2
(6144 x 4096 block-FP8, one token, 132 SMs) with a recorder in place of the kernel, and each recorded launch is
compiled as Triton's launcher specializes it. The plan's launch and the launch options the settings sweep tries
(benchmarks/scripts/quant_matmul_settings.py): the transposed product (``swap_ab``: 64 and 128 weight rows a
program) and K steps of 256 and 512 columns over 128-column scales, split K and (Llama-8B's gate_up, one program
an SM) not. Each must compile, keep its registers (ptxas -v: no spills) and stream the weight through cp.async.
The plan's one-row tile is 16 rows, under wgmma's 64: it multiplies with mma.sync, the weight read from shared
memory into registers and dequantized there. With swap_ab the weight is wgmma's A operand, which it takes from
registers (the braced operand list in the PTX): unsplit, nothing is stored to shared memory at all."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report, launches_of,
# compile_as_launched)
SM90_COMPILE = """
import re
from outpace.layers.quant import quant_matmul_kernel as qm

qm.num_sms = lambda device: 132  # an H200's grids

def launch(n, k, **options):
    '''One token's quant_matmul over a block-FP8 [n, k] weight: plan's tiles, or few_row_tiles' with options.'''
    weight = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    scale = torch.empty(-(-n // 128), -(-k // 128))
    x = torch.empty(1, k, dtype=torch.bfloat16)
    tiles = qm.few_row_tiles(1, n, k, torch.device("cpu"), **options) if options else None
    return lambda: qm.quant_matmul(x, weight, scale, "fp8_block", (128, 128), tiles)

def swap(block_n, block_k, warps, stages, **options):
    return dict(block_n=block_n, block_k=block_k, num_warps=warps, num_stages=stages, swap_ab=True, **options)

REGISTER_A = re.compile(r"wgmma\\.mma_async[^;]*\\}, \\{")  # the A operand a braced list of registers
cases = {
    "plan": launch(6144, 4096),
    "swap_ab": launch(6144, 4096, **swap(64, 128, 4, 6)),
    "swap_ab:bk256": launch(6144, 4096, **swap(64, 256, 4, 3)),
    "swap_ab:bk512:w8": launch(6144, 4096, **swap(64, 512, 8, 3)),
    "swap_ab:bn128:bk256:w8": launch(6144, 4096, **swap(128, 256, 8, 3)),
    "bk512": launch(6144, 4096, block_n=32, block_k=512, num_warps=4, num_stages=3),
    "swap_ab:unsplit": launch(28672, 4096, **swap(128, 128, 4, 3, programs_per_sm=1)),
}
for name, run in cases.items():
    (args, kwargs), = launches_of(qm, ["_quant_matmul_kernel"], run)["_quant_matmul_kernel"]
    compiled = compile_as_launched(qm._quant_matmul_kernel, args, kwargs)
    ptx = compiled.asm["ptx"]
    checks = {
        "spills": "0 bytes spill stores" in ptxas_report(compiled),
        "cp.async": "cp.async" in ptx,
        "split": kwargs["SPLIT_K"] == (name != "swap_ab:unsplit"),
    }
    if kwargs["SWAP_AB"]:
        checks["wgmma_register_a"] = bool(REGISTER_A.search(ptx))
    else:
        checks["mma.sync"] = "mma.sync" in ptx and "wgmma" not in ptx
    if name == "swap_ab:unsplit":
        checks["no_st.shared"] = "st.shared" not in ptx
    print(name, all(checks.values()) or ",".join(c for c, ok in checks.items() if not ok))
"""


def test_quant_matmul_launch_options_compile_for_sm90(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = [
        "plan",
        "swap_ab",
        "swap_ab:bk256",
        "swap_ab:bk512:w8",
        "swap_ab:bn128:bk256:w8",
        "bk512",
        "swap_ab:unsplit",
    ]
    assert done.stdout.split() == [w for n in names for w in (n, "True")]
