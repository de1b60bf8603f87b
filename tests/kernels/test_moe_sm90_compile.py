"""The mixture's kernels (layers/moe_routing_kernel.py's logits and route, layers/moe_kernels.py's gate/up, down
and combine) compiled for an H100 / H200 (sm_90) without a GPU, in a process of its own (the interpreter
replaces @triton.jit here), with programmatic dependent launch on: what Triton's interpreter does not check
(the griddepcontrol instructions, the L2 prefetch before the wait) at DeepSeek-V2-Lite's routing (64 experts,
top 6, two shared slots) and grouped tiles. Each kernel's PTX must hold the wait.

The grouped gate/up and down kernels also over block-FP8 stacks, as their launches at one and two tokens compile
them (the one-token tiles, one row a block on the CUDA cores: 16-byte loads, no tensor cores; the few-token fp8
tiles; without the dependent launch and with it: ``quantized_pdl``): the launch code runs
on CPU tensors of the real shapes with recorders in place of the kernels, and each recorded launch is compiled as Triton's launcher
specializes its arguments (an int of 1 a constant, multiples of 16 and 16-byte aligned tensors marked so), at
Step-3.5-Flash's stacks (gate, up and down apart, expert parallel: slots skipped) and DeepSeek-V2-Lite's
(packed gate/up, the shared MLP's two slots from views of its own weights and scales). Each must compile
without spilling registers (ptxas -v), and the few-token tiles stream their weights through cp.async (the
software pipeline whose stages the tiles set). Compiled without the specialization, as this test first did, the loads fall back to
single bytes without the pipeline, and Triton 3.6's ptxas spilled the fp8 gate/up kernel's registers; the
runtime never compiles that at these shapes. Over bf16 stacks (Qwen3-30B-A3B's experts) at one and eight tokens
the few-token tiles (moe_kernels.few_token_gate_up, few_token_down) stream through cp.async onto the tensor
cores without spills. Over Kimi-K2-Thinking's INT4 stacks at one token each grouped kernel
reads one row a block on the CUDA cores (no tensor cores, no conversion instruction), at two each pair apart
(moe_kernels.py PAIRS APART) the same way; past ``pairs_apart_max_tokens`` it turns the nibbles
into bf16 by PTX (lop3, bf16x2 fmas: weight_tiles.int4_tile_by_ptx) and streams its words and bf16 scales
through cp.async (K a whole number of K steps: no column mask), no bf16 load left for a K step to wait on."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report, launches_of,
# compile_as_launched)
SM90_COMPILE = """
import itertools
import torch
from outpace.layers.quant.experts import QuantizedShared, slot_views
from outpace.layers.quant.moe_quant_kernels import (
    ExpertScales, fp8_block_grouped_experts, int4_group_grouped_experts
)
from outpace.layers import grouped_experts as ge, moe_kernels as mk, moe_routing_kernel as rk
from outpace.layers.expert_blocks import BlockLayout

def build(kernel, types, constants, num_warps=4, num_stages=2):
    compiled = compile_for_hopper(kernel, types, constants, num_warps, num_stages)
    print(kernel.__name__, "griddepcontrol.wait" in compiled.asm["ptx"])

def pointers(names, dtype):
    return {n: dtype for n in names}

experts = {
    **pointers(["x_ptr", "shared_x_ptr", "gate_ptr", "up_ptr", "shared_gate_ptr", "shared_up_ptr", "act_ptr",
                "w_ptr", "shared_w_ptr", "out_ptr", "shared_out_ptr"], "*bf16"),
    **pointers(["gate_scale_ptr", "up_scale_ptr", "scale_ptr", "shared_gate_scale_ptr",
                "shared_up_scale_ptr", "shared_scale_ptr", "weights_ptr", "partial_ptr", "row_scale_ptr"],
               "*fp32"),
    **pointers(["sorted_pairs_ptr", "block_expert_ptr"], "*i32"),
    "ids_ptr": "*i64",
    "limit": "fp32",
}
tiles = dict(TOP_K=6, SLOTS=8, BLOCK_M=16, ROWS=16, PAIRS_APART=False, GROUP=128, BLOCK_N=64, BLOCK_K=128, K_TILED=True, PRECISION="tf32", FORMAT="none",
             SCALE_BN=1, SCALE_BK=1, PDL=True)
build(mk.expert_gate_up_kernel, experts, dict(tiles, ACT="silu", GATED=True, CLAMP=False, ROW_SCALE=False), 4, 3)
build(mk.expert_gate_up_kernel, experts, dict(tiles, ACT="silu", GATED=True, CLAMP=False, ROW_SCALE=True), 4, 3)
build(mk.expert_down_kernel, experts, dict(tiles, WEIGHTED_SLOTS=6), 4, 3)
combine = {**experts, **pointers(["stream_ptr", "addend_ptr", "norm_w_ptr", "normed_ptr"], "*bf16"),
           "sq_ptr": "*fp32", "norm_offset": "fp32"}
build(mk.expert_combine_kernel, combine, dict(SLOTS=8, TOP_K=6, SKIPS=True, APART=False, READY=False,
      ADDEND=False, BLOCK_H=1024, PDL=True))  # (an expert-parallel rank's: slots of other ranks' experts skipped)
build(mk.expert_combine_kernel, combine, dict(SLOTS=11, TOP_K=8, SKIPS=False, APART=True, READY=False,
      ADDEND=False, BLOCK_H=1024, PDL=True))  # (Gemma 4's dense MLP apart: 3 shared slots)
build(mk.expert_combine_kernel, combine, dict(SLOTS=11, TOP_K=10, SKIPS=False, APART=False, READY=True,
      ADDEND=False, BLOCK_H=128, PDL=True))  # (Qwen3-Next's on the fused stack: the stream readied for the next norm)
build(mk.expert_combine_kernel, combine, dict(SLOTS=8, TOP_K=8, SKIPS=False, APART=False, READY=True,
      ADDEND=True, BLOCK_H=128, PDL=True))  # (Kimi-K2-Thinking's: its bf16 shared expert's output added too)

def launched(run):
    '''{kernel name: (args, keywords)} of the grouped kernels ``run`` launches (the last launch of each).'''
    launches = launches_of(ge, ("expert_gate_up_kernel", "expert_down_kernel", "expert_combine_kernel"), run)
    return {n: calls[-1] for n, calls in launches.items()}

def fp8(*shape):
    return torch.empty(*shape, dtype=torch.float8_e4m3fn)

def scales(*shape):
    return torch.empty(*shape, dtype=torch.float32)

def step_flash(tokens=1, experts=2, hidden=4096, inter=1280):
    '''Step-3.5-Flash's stacked block-FP8 experts (gate, up and down stacks of their own) at expert
    parallelism 2: layers/quant/experts.py run_quantized_stacks' launch.'''
    quant = ExpertScales("fp8_block", (128, 128), scales(experts, 10, 32), scales(experts, 10, 32),
                         scales(experts, 32, 10))
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.full((tokens, 8), -1, dtype=torch.int32)
    ge.grouped_experts(x, torch.empty(tokens, 8), ids, fp8(experts, inter, hidden), fp8(experts, inter, hidden),
                       fp8(experts, hidden, inter), layout=BlockLayout.empty(tokens, 8, experts, "cpu"),
                       skipped_slots=True, quant=quant)

def deepseek_v2_lite(tokens=1, experts=8, hidden=2048, inter=1408):
    '''DeepSeek-V2-Lite's per-expert block-FP8 experts stacked (gate and up packed) and its shared MLP of two
    experts' width as two shared slots: layers/quant/experts.py QuantizedExpertStacks.run's launch.'''
    (gate, up), down = slot_views([fp8(2 * inter, hidden)] * 2, fp8(hidden, 2 * inter), 2)
    (gate_s, up_s), down_s = slot_views([scales(22, 16)] * 2, scales(16, 22), 2)
    shared = QuantizedShared((gate, up, down), (gate_s, up_s, down_s))
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, 6, dtype=torch.int32)
    fp8_block_grouped_experts(x, torch.empty(tokens, 6), ids, fp8(experts, 2 * inter, hidden),
                              scales(experts, 22, 16), fp8(experts, hidden, inter), scales(experts, 16, 11),
                              layout=BlockLayout.empty(tokens, 8, experts + 2, "cpu"), shared=shared)

APART = mk.pairs_apart_max_tokens  # (by format, at most: each pair a program row of its own, PAIRS APART)
for (name, run), tokens in itertools.product(
    (("step-3.5-flash", step_flash), ("deepseek-v2-lite", deepseek_v2_lite)), (1, 2)
):
    launches = launched(lambda: run(tokens))
    for kernel in (mk.expert_gate_up_kernel, mk.expert_down_kernel):
        args, kwargs = launches[kernel.__name__]
        for pdl in (False, True):  # (moe_kernels.quantized_pdl: the launch with the dependent launch too)
            compiled = compile_as_launched(kernel, args, {**kwargs, "PDL": pdl})
            report, ptx = ptxas_report(compiled), compiled.asm["ptx"]
            if tokens == 1 or tokens <= APART["fp8_block"]:  # one row (ONE-ROW): 16-byte loads, no tensor cores
                streams = kwargs["ROWS"] == 1 and "ld.global.v4" in ptx and "mma" not in ptx
            else:
                streams = kwargs["ROWS"] == 16 and "cp.async" in ptx
            ok = "0 bytes spill stores" in report and streams and pdl == ("griddepcontrol.wait" in ptx)
            print(f"{kernel.__name__}:fp8_block:{name}:{tokens}:pdl={pdl}", ok)
def bf16_stacks(tokens, experts=8, hidden=2048, inter=768):
    '''Qwen3-30B-A3B's bf16 experts (gate and up views of one packed stack): grouped_experts.grouped_experts' launch
    at the few-token tiles (mk.few_token_gate_up, mk.few_token_down).'''
    packed = torch.empty(experts, 2 * inter, hidden, dtype=torch.bfloat16)
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, 8, dtype=torch.int32)
    ge.grouped_experts(x, torch.empty(tokens, 8), ids, packed[:, :inter], packed[:, inter:],
                       torch.empty(experts, hidden, inter, dtype=torch.bfloat16),
                       layout=BlockLayout.empty(tokens, 8, experts, "cpu"))

for tokens in (1, 8):  # the 16-row tiles on the tensor cores, weights streamed through cp.async, no spills
    launches = launched(lambda: bf16_stacks(tokens))
    for kernel in (mk.expert_gate_up_kernel, mk.expert_down_kernel):
        args, kwargs = launches[kernel.__name__]
        compiled = compile_as_launched(kernel, args, kwargs)
        report, ptx = ptxas_report(compiled), compiled.asm["ptx"]
        ok = kwargs["ROWS"] == 16 and "cp.async" in ptx and "mma" in ptx and "0 bytes spill stores" in report
        print(f"{kernel.__name__}:bf16:qwen3-30b-a3b:{tokens}", ok)
def kimi_k2_int4(tokens=1, experts=4, hidden=7168, inter=2048, group=32):
    '''Kimi-K2-Thinking's INT4 experts (compressed-tensors pack-quantized, bf16 scales of 32 columns):
    moe_quant_kernels.int4_group_grouped_experts' launch.'''
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, 8, dtype=torch.int32)
    int4_group_grouped_experts(
        x, torch.empty(tokens, 8), ids, torch.empty(experts, 2 * inter, hidden // 8, dtype=torch.int32),
        torch.empty(experts, 2 * inter, hidden // group, dtype=torch.bfloat16),
        torch.empty(experts, hidden, inter // 8, dtype=torch.int32),
        torch.empty(experts, hidden, inter // group, dtype=torch.bfloat16),
        group, layout=BlockLayout.empty(tokens, 8, experts, "cpu"))

for tokens in (1, 2, APART["int4_group"] + 1):  # pairs apart, then the nibbles by PTX (weight_tiles.int4_tile_by_ptx: lop3 and bf16x2 fmas)
    launches = launched(lambda: kimi_k2_int4(tokens))
    for kernel in (mk.expert_gate_up_kernel, mk.expert_down_kernel):
        args, kwargs = launches[kernel.__name__]
        compiled = compile_as_launched(kernel, args, kwargs)
        report, ptx = ptxas_report(compiled), compiled.asm["ptx"]
        if tokens == 1 or tokens <= APART["int4_group"]:  # one row on the CUDA cores (_int4_row_part)
            ok = kwargs["ROWS"] == 1 and "mma" not in ptx and "cvt.rn.f32.s32" not in ptx
            ok = ok and "1258291200, 0xEA;" in ptx and ", 1258291200;" not in ptx  # one lop3 a nibble
            ok = ok and kwargs["PAIRS_APART"] == (tokens <= APART["int4_group"])
        else:  # every bf16 load streamed (the scales too: K_TILED), none a plain load a K step waits on
            nibbles = "lop3.b32" in ptx and "fma.rn.bf16x2" in ptx and "cp.async" in ptx
            ttgir = compiled.asm["ttgir"].splitlines()
            streamed = not any("tt.load" in l and "ptr<bf16>" in l for l in ttgir)
            ok = nibbles and streamed and kwargs["K_TILED"]
        ok = ok and "0 bytes spill stores" in report
        print(f"{kernel.__name__}:int4_group:kimi-k2:{tokens}", ok)
# Qwen3-30B-A3B's experts in RedHatAI's w4a16 (groups of 128, one a K step of the few-token tiles): each bf16 load
# in the K loop (a step's scales, 2 bytes a row) is the next step's, carried on (moe_kernels.py SCALES AHEAD)
def loads_ahead(ttgir):
    lines = ttgir[ttgir.index("scf.for"):].splitlines()
    indent = " " * (len(lines[1]) - len(lines[1].lstrip()))
    end = next(i for i, l in enumerate(lines) if l.startswith(indent + "scf.yield"))
    loads = [l.split("=")[0].strip() for l in lines[1:end] if "tt.load" in l and "ptr<bf16>" in l]
    yielded = lines[end].replace(",", " ").split()
    return bool(loads) and all(v in yielded for v in loads)

for tokens in (APART["int4_group"] + 1, 32):
    launches = launched(lambda: kimi_k2_int4(tokens, hidden=2048, inter=768, group=128))
    for kernel in (mk.expert_gate_up_kernel, mk.expert_down_kernel):
        args, kwargs = launches[kernel.__name__]
        compiled = compile_as_launched(kernel, args, kwargs)
        ok = loads_ahead(compiled.asm["ttgir"]) and "0 bytes spill stores" in ptxas_report(compiled)
        print(f"{kernel.__name__}:int4_group:qwen3-30b-a3b-w4a16:{tokens}", ok)
for few, block_k, precision in ((True, 256, "ieee"), (False, 64, "ieee"), (False, 64, "tf32x3")):
    build(rk._router_logits_kernel, {"x_ptr": "*bf16", "w_ptr": "*fp32", "scale_ptr": "*bf16",
          "partial_ptr": "*fp32"}, dict(BLOCK_T=16, BLOCK_E=16, BLOCK_K=block_k, INPUT_NORM=False,
          FEW_TOKENS=few, DOT_PRECISION=precision, PDL=True))
route = {**pointers(["partial_ptr", "bias_ptr", "expert_scale_ptr", "weights_ptr", "sq_ptr", "row_scale_ptr"],
                    "*fp32"),
         **pointers(["sorted_pairs_ptr", "block_expert_ptr", "cursor_ptr"], "*i32"),
         **pointers(["ids_ptr", "ticket_ptr"], "*i64"),
         **pointers(["scaling", "norm_eps", "norm_constant"], "fp32")}
v2_lite_route = dict(SPLITS=8, NUM_EXPERTS=64, TOP_K=6, SOFTMAX=True, BIAS=False,
      INPUT_NORM=False, ROW_NORM=False, BLOCK_P=1, EXPERT_SCALE=False, SHARED_GATE=False, NUM_GROUPS=1, TOP_GROUPS=1, TOP2_SUM=False,
      NORMALIZE=False, BLOCK_T=1, BLOCK_E=64, BLOCK_G=1, BLOCK_K=8, LAYOUT=True, NUM_SHARED=2,
      BLOCK_SHARED=2, SORT_BLOCK_E=128, BLOCK_M=16, PAIR_BLOCK=8, MASK_WORDS=1, PDL=True, ONE_TOKEN=False,
      SORTED_TOP_K=False)
build(rk._route_kernel, route, dict(v2_lite_route, EXPERT_RANGE=False, LIVE=False), 1, 2)
# a decode step of one token: the layout from its program's registers (expert_blocks.place_one_token)
build(rk._route_kernel, route, dict(v2_lite_route, EXPERT_RANGE=False, LIVE=False, ONE_TOKEN=True), 1, 2)
# an MTP draft window's padding rows routed nowhere (layers/routed_rows.py: the local ids' layout)
build(rk._route_kernel, {**route, "live_ptr": "*i1"}, dict(v2_lite_route, EXPERT_RANGE=True, LIVE=True), 1, 2)
# a prompt's rows in an MTP layer whose output nothing reads, routed nowhere past the fused layout's bound
# (speculative/drafters/mtp.py absorb: the layout is then align's, of the -1 ids)
build(rk._route_kernel, {**route, "live_ptr": "*i1"}, dict(v2_lite_route, EXPERT_RANGE=True, LIVE=True,
      LAYOUT=False, BLOCK_T=64, PAIR_BLOCK=1), rk.ROUTE_WARPS, 2)
# Qwen3-Next's one-token route on the fused stack (512 experts, its shared gate and slot, the post-attention
# norm's factor from the stream's 16 parts) at its warps, the top_k by rounds of max and by one partial sort
# (moe_routing_kernel.sorted_top_k_experts): no register spills
for sorted_top_k in (False, True):
    compiled = compile_for_hopper(rk._route_kernel, route, dict(SPLITS=8, NUM_EXPERTS=512, TOP_K=10,
        SOFTMAX=True, BIAS=False, INPUT_NORM=False, ROW_NORM=True, BLOCK_P=16, EXPERT_SCALE=False, SHARED_GATE=True,
        NUM_GROUPS=1, TOP_GROUPS=1, TOP2_SUM=False, NORMALIZE=True, BLOCK_T=1, BLOCK_E=512, BLOCK_G=1, BLOCK_K=16,
        LAYOUT=True, NUM_SHARED=1, BLOCK_SHARED=1, SORT_BLOCK_E=1024, BLOCK_M=16, PAIR_BLOCK=16, MASK_WORDS=1,
        PDL=True, EXPERT_RANGE=False, LIVE=False, ONE_TOKEN=True, SORTED_TOP_K=sorted_top_k),
        rk.token_route_warps(512), 1)
    print(f"_route_kernel:qwen3-next:sorted={sorted_top_k}", "0 bytes spill stores" in ptxas_report(compiled))
# the last program's layout of 65 to 128 tokens (the masks' two words, 1024 pairs a step, 64-row blocks) at
# V2-Lite's 64 + 2 and DeepSeek-V3's 256 + 1 experts and Qwen3-Next's 512 + 1, at the warps of a decode step's
# programs (batch-invariant mode's at every count) and of more than 64 tokens (rk.token_route_warps): no spills
for (name, experts, top_k, shared, block_k), tokens in itertools.product(
    (("v2-lite", 64, 6, 2, 8), ("v3", 256, 8, 1, 8), ("qwen3-next", 512, 10, 1, 16)), (1, 128)
):
    compiled = compile_for_hopper(rk._route_kernel, route, dict(v2_lite_route, NUM_EXPERTS=experts, TOP_K=top_k,
        BLOCK_E=experts, BLOCK_K=block_k, NUM_SHARED=shared, BLOCK_SHARED=shared, SORT_BLOCK_E=2 * experts,
        BLOCK_M=64, PAIR_BLOCK=1024, MASK_WORDS=2, EXPERT_RANGE=False, LIVE=False),
        rk.token_route_warps(experts, tokens), 1)
    print(f"_route_kernel:layout128:{name}:{rk.token_route_warps(experts, tokens)}w",
          "0 bytes spill stores" in ptxas_report(compiled))
"""


def test_moe_kernels_compile_for_sm90_with_pdl(tmp_path):
    from outpace.layers.moe_kernels import pairs_apart_max_tokens as apart

    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = ["expert_gate_up_kernel"] * 2 + ["expert_down_kernel"] + ["expert_combine_kernel"] * 4
    names += [
        f"{kernel}:fp8_block:{family}:{tokens}:pdl={pdl}"
        for family in ("step-3.5-flash", "deepseek-v2-lite")
        for tokens in (1, 2)
        for kernel in ("expert_gate_up_kernel", "expert_down_kernel")
        for pdl in (False, True)
    ]
    names += [
        f"{kernel}:bf16:qwen3-30b-a3b:{tokens}"
        for tokens in (1, 8)
        for kernel in ("expert_gate_up_kernel", "expert_down_kernel")
    ]
    names += [
        f"{kernel}:int4_group:kimi-k2:{tokens}"
        for tokens in (1, 2, apart["int4_group"] + 1)
        for kernel in ("expert_gate_up_kernel", "expert_down_kernel")
    ]
    names += [
        f"{kernel}:int4_group:qwen3-30b-a3b-w4a16:{tokens}"
        for tokens in (apart["int4_group"] + 1, 32)
        for kernel in ("expert_gate_up_kernel", "expert_down_kernel")
    ]
    names += [
        "_router_logits_kernel"
    ] * 3  # per-token sums; the tl.dot path in IEEE float32, in tf32x3
    names += ["_route_kernel"] * 4
    names += [f"_route_kernel:qwen3-next:sorted={s}" for s in (False, True)]
    names += [
        f"_route_kernel:layout128:{n}:{w}w"
        for n, warps in (("v2-lite", (1, 8)), ("v3", (1, 8)), ("qwen3-next", (4, 4)))
        for w in warps
    ]
    assert done.stdout.split() == [w for n in names for w in (n, "True")]
