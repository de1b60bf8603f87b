"""The mixture's kernels (layers/moe_routing_kernel.py's logits and route, layers/moe_kernels.py's gate/up, down
and combine) compiled for an H100 / H200 (sm_90) without a GPU, in a process of its own (the interpreter
replaces @triton.jit here), with programmatic dependent launch on: what Triton's interpreter does not check
(the griddepcontrol instructions, the L2 prefetch before the wait) at DeepSeek-V2-Lite's routing (64 experts,
top 6, two shared slots) and grouped tiles. Each kernel's PTX must hold the wait. The grouped gate/up and
down kernels also over block-FP8 stacks (FORMAT "fp8_block", launched without the dependent launch, with the
shared slots' own scale pointers: layers/quant/moe_quant_kernels.py) at the few-token tiles, which must
compile without spilling registers (ptxas -v: a per-slot choice of the scales' column stride spilled the
gate/up kernel's)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report)
SM90_COMPILE = """
from outpace.layers import moe_kernels as mk, moe_routing_kernel as rk

def build(kernel, types, constants, num_warps=4, num_stages=2):
    compiled = compile_for_hopper(kernel, types, constants, num_warps, num_stages)
    print(kernel.__name__, "griddepcontrol.wait" in compiled.asm["ptx"])

def pointers(names, dtype):
    return {n: dtype for n in names}

experts = {
    **pointers(["x_ptr", "gate_ptr", "up_ptr", "shared_gate_ptr", "shared_up_ptr", "act_ptr", "w_ptr",
                "shared_w_ptr", "out_ptr"], "*bf16"),
    **pointers(["gate_scale_ptr", "up_scale_ptr", "scale_ptr", "shared_gate_scale_ptr",
                "shared_up_scale_ptr", "shared_scale_ptr", "weights_ptr", "partial_ptr"], "*fp32"),
    **pointers(["sorted_pairs_ptr", "block_expert_ptr"], "*i32"),
    "limit": "fp32",
}
tiles = dict(SLOTS=8, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, PRECISION="tf32", FORMAT="none", SCALE_BN=1,
             SCALE_BK=1, PDL=True)
build(mk._gate_up_kernel, experts, dict(tiles, ACT="silu", GATED=True, CLAMP=False), 4, 3)
build(mk._down_kernel, experts, dict(tiles, WEIGHTED_SLOTS=6), 4, 3)
build(mk._combine_kernel, experts, dict(SLOTS=8, BLOCK_H=1024, PDL=True))
fp8_stacks = {**experts, **pointers(["gate_ptr", "up_ptr", "shared_gate_ptr", "shared_up_ptr", "w_ptr",
                                     "shared_w_ptr"], "*fp8e4nv")}
fp8 = dict(SLOTS=8, BLOCK_M=16, PRECISION="tf32", FORMAT="fp8_block", SCALE_BN=128, SCALE_BK=128, PDL=False)
for kernel, few_tiles, constants in (
    (mk._gate_up_kernel, mk.few_token_gate_up, dict(ACT="silu", GATED=True, CLAMP=False)),
    (mk._down_kernel, mk.few_token_down, dict(WEIGHTED_SLOTS=8)),
):
    block_n, block_k, warps, stages = few_tiles
    constants = dict(fp8, **constants, BLOCK_N=block_n, BLOCK_K=block_k)
    report = ptxas_report(compile_for_hopper(kernel, fp8_stacks, constants, warps, stages))
    print(kernel.__name__ + ":fp8_block", "0 bytes spill stores" in report)
build(rk._router_logits_kernel, {"x_ptr": "*bf16", "w_ptr": "*fp32", "scale_ptr": "*bf16",
      "partial_ptr": "*fp32"}, dict(BLOCK_T=16, BLOCK_E=16, BLOCK_K=256, INPUT_NORM=False, FEW_TOKENS=True,
      PDL=True))
route = {**pointers(["partial_ptr", "bias_ptr", "expert_scale_ptr", "weights_ptr"], "*fp32"),
         **pointers(["sorted_pairs_ptr", "block_expert_ptr", "cursor_ptr"], "*i32"),
         **pointers(["ids_ptr", "ticket_ptr"], "*i64"),
         **pointers(["scaling", "norm_eps", "norm_constant"], "fp32")}
build(rk._route_kernel, route, dict(SPLITS=8, NUM_EXPERTS=64, TOP_K=6, SOFTMAX=True, BIAS=False,
      INPUT_NORM=False, EXPERT_SCALE=False, SHARED_GATE=False, NUM_GROUPS=1, TOP_GROUPS=1, TOP2_SUM=False,
      NORMALIZE=False, BLOCK_T=1, BLOCK_E=64, BLOCK_G=1, BLOCK_K=8, LAYOUT=True, NUM_SHARED=2,
      BLOCK_SHARED=2, SORT_BLOCK_E=128, BLOCK_M=16, PAIR_BLOCK=8, PDL=True), 1, 2)
"""


def test_moe_kernels_compile_for_sm90_with_pdl(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = ["_gate_up_kernel", "_down_kernel", "_combine_kernel"]
    names += ["_gate_up_kernel:fp8_block", "_down_kernel:fp8_block", "_router_logits_kernel"]
    assert done.stdout.split() == [w for n in [*names, "_route_kernel"] for w in (n, "True")]
