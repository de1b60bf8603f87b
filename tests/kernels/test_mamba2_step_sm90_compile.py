"""Mamba2's step kernels (layers/mamba2_step_kernel.py: the scan and the gated norm) compiled for an H100 / H200
(sm_90) without a GPU, in a process of its own (the interpreter replaces @triton.jit here), with programmatic
dependent launch on: what Triton's interpreter does not check. At Nemotron-H-8B's shape (128 heads of 64, 8
groups, state 128, convolution of 4; the launcher's head blocks and warps), decode into the state row, a verify
chain and a tree: each kernel's PTX holds the wait (griddepcontrol.wait), and ptxas spills no register but in
decode's norm kernel (its window copied into the state row), which spills at its 4 warps (layers/mamba2_step_kernel.py
``norm_warps``: 8 do not spill, and are not yet timed)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report)
SM90_COMPILE = """
import triton
from outpace.layers import mamba2_step_kernel as m

tree, snapshots, form_arg = (bool(int(a)) for a in sys.argv[1:4])
pointers = dict(zxbcdt="*bf16", table="*i32", query_lens="*i64", state_indices="*i64", has_initial="*i1",
                parents="*i64", conv_state="*bf16", conv_snapshots="*bf16", ssm_state="*fp32",
                ssm_snapshots="*fp32", conv_weight="*bf16", conv_bias="*bf16", dt_bias="*bf16", A_log="*bf16",
                D="*bf16", norm_weight="*bf16", y="*bf16", time_step_min="fp32", eps="fp32")
heads, p, groups, n, keep = 128, 64, 8, 128, 3
shape = dict(HEADS=heads, GROUPS=groups, P=p, N=n, KEEP=keep, BN=n, WB=triton.next_power_of_2(keep + 1),
             TREE=tree, FORM_ARG=form_arg, SNAPSHOTS=snapshots, PDL=True)
block = int(sys.argv[4])  # a head's state rows a program (the launcher's _head_block)
options = dict(enable_fp_fusion=False) if form_arg else {}  # (batch-invariant mode's launch)
scan = compile_for_hopper(m._scan_kernel, pointers, dict(shape, BP=block, HAS_BIAS=True),
                          num_warps=m.scan_warps, **options)
norm = compile_for_hopper(m._norm_kernel, pointers, dict(shape, BG=triton.next_power_of_2(heads // groups * p)),
                          num_warps=m.norm_warps, **options)
for name, compiled in (("scan", scan), ("norm", norm)):
    spills = "0 bytes spill stores" in ptxas_report(compiled)
    print(name, "griddepcontrol.wait" in compiled.asm["ptx"], spills)
"""


@pytest.mark.parametrize(
    "tree, snapshots, form_arg, block",
    [(0, 0, 0, 16), (0, 0, 0, 64), (0, 1, 0, 16), (1, 1, 0, 64), (0, 0, 1, 64), (0, 1, 1, 64)],
    ids=[
        "decode into the row",
        "decode, 64-row blocks",
        "verify chain",
        "tree, 64-row blocks",
        "batch-invariant, into the row",
        "batch-invariant, snapshots (a chain's or a tree's)",
    ],
)
def test_step_kernels_wait_for_their_inputs_without_spills(
    tree, snapshots, form_arg, block, tmp_path
):
    """Head blocks of 16 rows (batch 1 on 132 SMs: ``_head_block``) and 64 (from batch 4); in batch-invariant
    mode the run's form an argument (FORM_ARG: both forms compiled in)."""
    args = (tree, snapshots, form_arg, block)
    done = run_compile_script(SM90_COMPILE, *map(str, args), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # no spill but in decode's own compilation (module docstring; the mode's, both forms in, does not spill)
    norm_clean = "True" if snapshots or form_arg else "False"
    assert done.stdout.split() == ["scan", "True", "True", "norm", "True", norm_clean], done.stdout
