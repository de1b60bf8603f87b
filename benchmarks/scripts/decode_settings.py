"""Launch settings (module attributes of the kernels' files) measured on a family's decode step (bench/family_shapes.py,
random bf16 weights, or a sweep's quantization as bench/families.py's ``--quantized``, one GPU): for each setting of a
sweep, the decode graphs captured again and the engine's step time (bench/gpu.py ``time_decode``) at the sweep's
(batch, cached tokens) points; each setting twice, in two passes, the lower kept. A setting that fails to compile or
run (shared memory, registers) is reported and skipped.

    PYTHONPATH=. python3 benchmarks/scripts/decode_settings.py OUT.json SWEEP
    PYTHONPATH=. python3 benchmarks/scripts/decode_settings.py OUT_DIR SWEEP SWEEP ...   (OUT_DIR/SWEEP.json each)

(SWEEP: a key of ``SWEEPS``.) Several sweeps run in one process, and consecutive sweeps of one shape and
quantization on one engine, built once with every batch they time: a device call then pays for a build and the
kernels' first compilation once a shape, where a process a sweep paid them each time (gpu_2026-12-05d call 9 built
Qwen3-30B-A3B four times, and two sweeps ran out of their time limits before a row)."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from outpace.attention import kernel_parts, mla_kernels
from outpace.bench.families import bench_shapes, build, close
from outpace.bench.family_shapes import family_shapes
from outpace.bench.gpu import time_decode
from outpace.bench.profile import _recapture_decode
from outpace.layers import (
    expert_blocks,
    fused_projection,
    mamba2_step_kernel,
    mla_fused,
    moe_kernels,
    moe_routing_kernel,
)
from outpace.layers.quant import quant_matmul_kernel

# knob -> (module, attribute)
KNOBS = {
    "min_split_rows": (mla_kernels, "min_split_rows"),
    "attention_programs_per_sm": (kernel_parts, "programs_per_sm"),
    "half_block_n": (mla_kernels, "half_block_n"),
    "attention_warps": (mla_kernels, "attention_warps"),
    "combine_block_tokens": (mla_kernels, "combine_block_tokens"),
    "tile_elements": (mla_fused, "_TILE_ELEMENTS"),
    "max_block_k": (mla_fused, "_MAX_BLOCK_K"),
    "down_stages": (mla_fused, "_DOWN_STAGES"),
    "q_absorb_stages": (mla_fused, "_Q_ABSORB_STAGES"),
    "down_outs": (mla_fused, "_DOWN_OUTS"),
    "fp8_scale_columns": (mla_fused, "fp8_scale_columns"),
    "quantized_pdl": (moe_kernels, "quantized_pdl"),
    "dot_precision": (moe_routing_kernel, "dot_precision"),
    "logit_programs": (moe_routing_kernel, "_LOGIT_PROGRAMS"),
    "many_token_logit_programs": (moe_routing_kernel, "many_token_logit_programs"),
    "many_token_route_warps": (moe_routing_kernel, "many_token_route_warps"),
    "sorted_top_k_experts": (moe_routing_kernel, "sorted_top_k_experts"),
    "min_r_chunk": (mla_fused, "min_r_chunk"),
    "max_head_block": (mamba2_step_kernel, "max_head_block"),
    "scan_warps": (mamba2_step_kernel, "scan_warps"),
    "swiglu_sub_tile": (fused_projection, "swiglu_sub_tile"),
    "swiglu_block_k": (fused_projection, "swiglu_block_k"),
    "swiglu_stages": (fused_projection, "swiglu_stages"),
    "narrow_block_k": (fused_projection, "narrow_block_k"),
    "narrow_stages": (fused_projection, "narrow_stages"),
    "one_row_cuda_cores": (quant_matmul_kernel, "one_row_cuda_cores"),
    "one_row_wide_tiles": (quant_matmul_kernel, "one_row_wide_tiles"),
    "one_row_streams": (quant_matmul_kernel, "one_row_streams"),
    "row_streams": (quant_matmul_kernel, "row_streams"),
    "stream_prefetch_bytes": (quant_matmul_kernel, "stream_prefetch_bytes"),
    "one_token_cuda_cores": (moe_kernels, "one_token_cuda_cores"),
    "one_token_gate_up": (moe_kernels, "one_token_gate_up"),
    "one_token_down": (moe_kernels, "one_token_down"),
    "pairs_apart_max_tokens": (moe_kernels, "pairs_apart_max_tokens"),
    "small_blocks_max_tokens": (expert_blocks, "small_blocks_max_tokens"),
    "few_token_gate_up": (moe_kernels, "few_token_gate_up"),
    "few_token_down": (moe_kernels, "few_token_down"),
}


@dataclass(frozen=True)
class Sweep:
    shape: str
    points: tuple[tuple[int, int], ...]  # (batch, cached tokens)
    settings: tuple[dict, ...]  # the shipped values first ({})
    quantized: str | None = None  # bench/families.py's --quantized


def _on_shapes(
    prefix: str,
    points: tuple[tuple[int, int], ...],
    settings: tuple[dict, ...],
    shapes: tuple[tuple[str, str, str | None], ...],
) -> dict[str, Sweep]:
    """One sweep of ``settings`` at ``points`` a shape: (name, shape, quantization) -> ``prefix + name``."""
    return {
        prefix + name: Sweep(shape, points, settings, quantized)
        for name, shape, quantized in shapes
    }


SWEEPS = {
    # the fused MLA kernels' weight bytes in flight (stages x tile elements x 2) and KV split length
    "mla": Sweep(
        "deepseek-v2-lite",
        ((1, 512), (1, 2048), (8, 512)),
        (
            {},
            {"tile_elements": 8192, "max_block_k": 256},
            {"tile_elements": 16384, "max_block_k": 512, "q_absorb_stages": 4, "down_stages": 3},
            {"q_absorb_stages": 4, "down_stages": 5},
        ),
    ),
    # without a q_lora_rank (q_proj streamed by the down kernel beside kv_a): outputs a program, K steps, and
    # W_UK's columns an absorb_kernel program (layers/mla_fused_kernels.py)
    "mla_down": Sweep(
        "deepseek-v2-lite",
        ((1, 512), (8, 512)),
        (
            {},
            {"down_outs": 32},
            {"down_stages": 6},
            {"tile_elements": 8192, "max_block_k": 256},
            {"down_outs": 32, "tile_elements": 8192, "max_block_k": 256},
            {"down_outs": 32, "down_stages": 6},
            {"min_r_chunk": 128},
            {"min_r_chunk": 32},
        ),
    ),
    # block FP8 (DeepSeek-V3's quantization_config): the down projections' and q_proj's K steps over one, two or
    # four (shipped) scale columns (gpu_2026-12-03f call 2: layers/mla_fused.py fp8_scale_columns)
    "mla_down_fp8": Sweep(
        "deepseek-v2-lite",
        ((1, 512), (8, 512)),
        ({}, {"fp8_scale_columns": 1}, {"fp8_scale_columns": 2}),
        quantized="fp8",
    ),
    "mla_down_fp8_v3": Sweep(
        "deepseek-v3-slice",
        ((1, 512), (8, 512)),
        ({}, {"fp8_scale_columns": 1}, {"fp8_scale_columns": 2}),
        quantized="fp8",
    ),
    # the grouped experts over quantized stacks with programmatic dependent launch or without, each format the other
    # way from its shipped one (moe_kernels.quantized_pdl)
    **{
        f"moe_pdl_{name}": Sweep(
            shape,
            ((1, 512), (8, 512)),
            ({}, {"quantized_pdl": {fmt: not moe_kernels.quantized_pdl[fmt]}}),
            quantized=quantized,
        )
        for name, shape, quantized, fmt in (
            ("v2_fp8", "deepseek-v2-lite", "fp8", "fp8_block"),
            ("qwen3next_fp8", "qwen3-next-80b-slice", "fp8", "fp8_block"),
            ("kimi_int4", "kimi-k2-slice", "int4", "int4_group"),
        )
    },
    # the route kernel's top_k by rounds of max, not one partial sort of the keys (moe_routing_kernel.sorted_top_k_experts)
    "sorted_top_k_qwen3next_fp8": Sweep(
        "qwen3-next-80b-slice",
        ((1, 512), (8, 512)),
        ({}, {"sorted_top_k_experts": None}),
        quantized="fp8",
    ),
    # one token's block-FP8 experts (moe_kernels.one_token_gate_up / one_token_down: BLOCK_N, BLOCK_K, warps,
    # stages) in fewer, wider K steps (the dense one-row product's wide tiles won in the step: quant_matmul_kernel
    # ONE_ROW_WIDE_TILES), and the sorted top_k, in one build of the Qwen3-Next slice at batch 1
    "one_token_qwen3next_fp8": Sweep(
        "qwen3-next-80b-slice",
        ((1, 512),),
        (
            {},
            {"one_token_gate_up": (8, 2048, 8, 1)},
            {"one_token_gate_up": (16, 1024, 4, 1)},
            {"one_token_down": (8, 512, 4, 1)},
            {"one_token_down": (32, 512, 8, 1)},
            {"sorted_top_k_experts": None},
        ),
        quantized="fp8",
    ),
    # the MLA attention kernel's KV tile and warps (mla_kernels.half_block_n, attention_warps; shipped 64 and 8)
    "mla_tile": Sweep(
        "deepseek-v2-lite",
        ((1, 512), (8, 512), (32, 512)),
        ({}, {"half_block_n": 32, "attention_warps": 4}),
    ),
    # the MLA merge's tokens a program (mla_kernels.combine_block_tokens: W_UV read once a program)
    "mla_combine_v3": Sweep(
        "deepseek-v3-slice",
        ((8, 512), (32, 512)),
        ({}, {"combine_block_tokens": 4}, {"combine_block_tokens": 16}),
    ),
    # the router logits' tl.dot path (past 16 tokens) in IEEE float32 (shipped) or tf32x3 (moe_routing_kernel)
    "router_dot_v2": Sweep("deepseek-v2-lite", ((32, 512),), ({}, {"dot_precision": "tf32x3"})),
    # ... and with more programs (moe_routing_kernel._LOGIT_PROGRAMS: more hidden splits, fewer K steps a program; the
    # matvec of Qwen3-Next's router took 21.3 / 41.5 us at 32 / 64 tokens, gpu_2026-12-04e call 5), in the FP8 slice's
    # step at batch 32
    "router_dot_qwen3next": Sweep(
        "qwen3-next-80b-slice",
        ((32, 512),),
        (
            {},
            {"dot_precision": "tf32x3"},
            {"logit_programs": 1056},
            {"logit_programs": 1056, "dot_precision": "tf32x3"},
        ),
        quantized="fp8",
    ),
    # ... past 64 tokens (moe_routing_kernel.many_token_logit_programs: 65 tokens took 35.55 us at 264 programs, 19.70
    # at 1056 alone, gpu_2026-12-04f call 5), in the FP8 slice's step at batches 96 and 128 (a batch of 32 verifying 3
    # and 4 tokens routes as many)
    "many_token_logits_qwen3next": Sweep(
        "qwen3-next-80b-slice",
        ((96, 512), (128, 512)),
        ({}, {"many_token_logit_programs": 1056}),
        quantized="fp8",
    ),
    # a token's route program's warps past 64 tokens up to 256 experts (moe_routing_kernel.many_token_route_warps: 8
    # shipped, 1 before; alone at 96 / 128 tokens V2-Lite's 8.15 / 9.65 us against 17.73 / 19.45, gpu_2026-12-04g
    # call 5), in the step at batches 96 and 128 (a batch of 32 verifying 3 and 4 tokens routes as many)
    **_on_shapes(
        "many_token_route_",
        ((96, 512), (128, 512)),
        ({}, {"many_token_route_warps": 1}),
        (
            ("v2", "deepseek-v2-lite", None),
            ("v2_fp8", "deepseek-v2-lite", "fp8"),
            ("v3_fp8", "deepseek-v3-slice", "fp8"),
        ),
    ),
    # the grouped experts' 16-row blocks up to 128 tokens rather than 64 (expert_blocks.small_blocks_max_tokens): at 96
    # tokens Qwen3-Next's 960 routed pairs over 512 experts fill 64-row blocks with about 2 rows each, while V2-Lite's
    # two shared slots would read the shared MLP 6 times rather than twice
    **_on_shapes(
        "small_blocks_",
        ((96, 512), (128, 512)),
        ({}, {"small_blocks_max_tokens": 128}),
        (("qwen3next_fp8", "qwen3-next-80b-slice", "fp8"), ("v2", "deepseek-v2-lite", None)),
    ),
    # the grouped experts' 16-row tiles (BLOCK_N, BLOCK_K, warps, stages) over half-precision stacks: Gemma 4's down
    # kernel (K = 704 = 5.5 K steps of 128; 11 slots x 44 column blocks, two waves at two programs an SM) took 14.7 us a
    # layer at batch 1 for 43.6 MB (10.4 us at 4.2 TB/s), its gate/up 24 for 87 MB (gpu_2026-12-04d call 1's timeline)
    **_on_shapes(
        "expert_tiles_",
        ((1, 512), (8, 512)),
        (
            {},
            {"few_token_down": (128, 128, 4, 3)},
            {"few_token_down": (64, 64, 4, 4)},
            {"few_token_down": (128, 64, 4, 4)},
            {"few_token_gate_up": (64, 128, 4, 4)},
        ),
        (("gemma4", "gemma-4-26b-a4b", None), ("v2", "deepseek-v2-lite", None)),
    ),
    # one row on the CUDA cores (quant_matmul_kernel.py and moe_kernels.py ONE-ROW) or in the 16-row tiles
    # (batch 8 runs the same code both ways; it sizes the KV cache for the timed steps)
    "one_row_v2": Sweep(
        "deepseek-v2-lite", ((1, 512), (8, 512)), ({}, {"one_token_cuda_cores": False})
    ),
    "one_row_gemma4": Sweep(
        "gemma-4-26b-a4b", ((1, 512), (8, 512)), ({}, {"one_token_cuda_cores": False})
    ),
    **_on_shapes(
        "one_row_",
        ((1, 512), (8, 512)),
        (
            {},
            {"one_token_cuda_cores": False},
            {"one_row_cuda_cores": False},
            {"one_token_cuda_cores": False, "one_row_cuda_cores": False},
        ),
        (("v2_fp8", "deepseek-v2-lite", "fp8"), ("qwen3next_fp8", "qwen3-next-80b-slice", "fp8")),
    ),
    **_on_shapes(
        "one_row_",
        ((1, 512), (8, 512)),
        ({}, {"one_token_cuda_cores": False, "one_row_cuda_cores": False}),
        (("v3_fp8", "deepseek-v3-slice", "fp8"), ("step_fp8", "step-3.5-flash-slice", "fp8")),
    ),
    # one row of an fp8 weight in the row streams (shipped), in the wide tiles where they fill the GPU
    # (quant_matmul_kernel.one_row_wide_tiles: the streams off) or in the one-row tiles
    **_on_shapes(
        "one_row_wide_",
        ((1, 512),),
        ({}, {"one_row_streams": False}, {"one_row_streams": False, "one_row_wide_tiles": None}),
        (
            ("qwen3next_fp8", "qwen3-next-80b-slice", "fp8"),
            ("v2_fp8", "deepseek-v2-lite", "fp8"),
            ("step_fp8", "step-3.5-flash-slice", "fp8"),
        ),
    ),
    # each (token, slot) pair a program row of its own up to pairs_apart_max_tokens tokens (moe_kernels.py PAIRS
    # APART, by format); 0: the layout's blocks (one token's one pair a block). (gpu_2026-12-04c call 1 ran these at
    # b0106fd, where the knob was one count for both formats: shipped 4, then 0, 1, 8.)
    **_on_shapes(
        "pairs_apart_",
        ((1, 512), (2, 512), (4, 512), (8, 512)),
        (
            {},
            *(
                {"pairs_apart_max_tokens": {"fp8_block": most, "int4_group": most}}
                for most in (0, 1, 4, 8)
            ),
        ),
        (
            ("v2_fp8", "deepseek-v2-lite", "fp8"),
            ("qwen3next_fp8", "qwen3-next-80b-slice", "fp8"),
            ("step_fp8", "step-3.5-flash-slice", "fp8"),
            ("kimi_int4", "kimi-k2-slice", "int4"),
        ),
    ),
    # INT4 pairs apart up to 8 tokens (shipped) or 4, on DeepSeek-V3's slice: 256 experts of 22 MB, top 8, so 8 tokens'
    # pairs share an expert more often than Kimi-K2's 384
    "pairs_apart_v3_int4": Sweep(
        "deepseek-v3-slice",
        ((4, 512), (8, 512)),
        ({}, {"pairs_apart_max_tokens": {"fp8_block": 0, "int4_group": 4}}),
        quantized="int4",
    ),
    # Mamba2's state scan: a head's state rows a program and its warps
    "mamba2": Sweep(
        "nemotron-h-8b",
        ((1, 512), (8, 512), (32, 512)),
        (
            {},
            {"max_head_block": 64},
            {"scan_warps": 8},
            {"max_head_block": 64, "scan_warps": 8},
            {"max_head_block": 16},
            {"scan_warps": 2},
        ),
    ),
}
# the few-row SwiGLU's (gate/up) sub-tiles, K step and stages (shipped: one sub-tile of 128 at BK 128 over 4 stages,
# gpu_2026-12-02 call 19; the others: call 19's alternatives)
# the paged attention's split-KV grid (attention/kernel_parts.py programs_per_sm: programs an SM it aims for; 0:
# one split, the output normalised in the attention launch, no merge launch): Llama-8B's 8 KV heads at batch 1 over
# 512 cached rows take 8 splits of 64 rows and a merge of 2.4 us a layer (gpu_2026-12-01i call 1)
SWEEPS["attention_splits_llama"] = Sweep(
    "llama-3.1-8b",
    ((1, 512), (1, 2048), (8, 512)),
    (
        {},
        {"attention_programs_per_sm": 0},
        {"attention_programs_per_sm": 0.125},
        {"attention_programs_per_sm": 0.25},
    ),
)
# The A3B MoE shapes, first benched in gpu_2026-12-05b call 1 (batch 1 at 50% of the floor): their o_proj is a
# narrow plain projection (2048 outputs, 16 an SM: fused_projection.narrow_*), 4 (Qwen3) or 2 (Qwen3.5) KV heads
# split over the SMs, bf16 experts of 768 / 512 intermediate rows on the few-token tiles, and a route over 128 /
# 256 experts
SWEEPS |= _on_shapes(
    "a3b_",
    ((1, 512), (8, 512)),
    (
        {},
        {"narrow_block_k": 256},
        {"narrow_stages": 8},
        {"attention_programs_per_sm": 0.5},
        {"attention_programs_per_sm": 0},
        {"few_token_gate_up": (64, 128, 4, 4)},
        {"few_token_gate_up": (32, 256, 4, 3)},
        {"few_token_down": (32, 128, 4, 4)},
        # one token's top 8 of 128 experts by one partial sort rather than 8 rounds of a max (the route kernel
        # took 4.1 us a layer, gpu_2026-12-05b call 4)
        {"sorted_top_k_experts": 128},
    ),
    (("qwen3", "qwen3-30b-a3b", None), ("qwen35", "qwen3.5-35b-a3b", None)),
)
# the gate/up kernel's few-token tiles at a K step of 256 over 3 stages, which won on both A3B shapes at batch 1 and
# 8 (gpu_2026-12-05c calls 1 and 2, H100): on the other MoE shapes, bf16 and block FP8
SWEEPS |= _on_shapes(
    "gate_up_k256_",
    ((1, 512), (8, 512), (32, 512)),
    ({}, {"few_token_gate_up": (32, 256, 4, 3)}),
    (
        ("v2", "deepseek-v2-lite", None),
        ("v2_fp8", "deepseek-v2-lite", "fp8"),
        ("gemma4", "gemma-4-26b-a4b", None),
        ("qwen3next", "qwen3-next-80b-slice", None),
        ("mistral4", "mistral-small-4-slice", None),
    ),
)
# the gate/up kernel's few-token tiles 16 columns wide: at batch 1 Qwen3-30B-A3B's 8 experts of 768 make 192
# programs of 32 columns, which 132 SMs take two on some and one on others (Gemma 4's 176 alike), 384 of 16
# columns share them about evenly. Slower on Qwen3-30B-A3B (gpu_2026-12-05d call 9, an H100, ms at batch 1 / 8):
# 3.541 / 10.536 and 3.483 / 10.686 against 3.367 / 10.289
SWEEPS |= _on_shapes(
    "gate_up_n16_",
    ((1, 512), (8, 512)),
    (
        {},
        {"few_token_gate_up": (16, 256, 4, 3)},
        {"few_token_gate_up": (16, 512, 4, 2)},
    ),
    (
        ("qwen3", "qwen3-30b-a3b", None),
        ("qwen35", "qwen3.5-35b-a3b", None),
        ("gemma4", "gemma-4-26b-a4b", None),
    ),
)
# longer K steps for the grouped experts' few-token tiles: a step of 256 over 3 stages beat 128 over 4 by 1-2% at batch
# 1 (gpu_2026-12-05c calls 1-3), where 16 columns a program lost (gate_up_n16_*). Each compiles for sm_90 without
# spills at Qwen3-30B-A3B's shape (ptxas -v: gate/up 148 / 80 / 108 registers, 80 / 80 / 144 KB of shared memory;
# down 128 / 64 registers, 80 KB)
SWEEPS |= _on_shapes(
    "expert_k_steps_",
    ((1, 512), (8, 512)),
    (
        {},
        {"few_token_gate_up": (32, 512, 4, 2)},
        {"few_token_gate_up": (32, 512, 8, 2)},
        {"few_token_gate_up": (64, 256, 8, 3)},
        {"few_token_down": (64, 256, 4, 3)},
        {"few_token_down": (64, 256, 8, 3)},
    ),
    (
        ("qwen3", "qwen3-30b-a3b", None),
        ("qwen35", "qwen3.5-35b-a3b", None),
        ("v2", "deepseek-v2-lite", None),
    ),
)
SWIGLU_SETTINGS = (
    {},
    {"swiglu_sub_tile": 32, "swiglu_block_k": 256, "swiglu_stages": 5},
    {"swiglu_sub_tile": 64, "swiglu_block_k": 128, "swiglu_stages": 5},
)
SWEEPS |= _on_shapes(
    "swiglu_",
    ((1, 512), (8, 512)),
    SWIGLU_SETTINGS,
    (
        ("llama", "llama-3.1-8b", None),
        ("qwen35", "qwen3.5", None),
        ("gemma3", "gemma-3-12b", None),
    ),
)
# one row of an fp8 weight in row streams (quant_matmul_kernel.one_row_streams: whole weight rows a program, K unsplit;
# shipped) or the one-row / wide tiles before them. gpu_2026-12-06 call 40 ran these sweeps on 7 shapes when the knob
# had a bf16 twin (fused_projection's one-row plain products in these tiles, since removed: it lost on every bf16 shape)
SWEEPS |= _on_shapes(
    "row_streams_",
    ((1, 512), (8, 512)),
    ({}, {"one_row_streams": False}),
    (
        ("v2_fp8", "deepseek-v2-lite", "fp8"),
        ("qwen3next_fp8", "qwen3-next-80b-slice", "fp8"),
        ("step_fp8", "step-3.5-flash-slice", "fp8"),
    ),
)


def _streams(step_bytes: int, most_k: int) -> dict:
    """A ``row_streams`` setting: (bytes a step, most columns a step) for both fp8 formats."""
    return {"row_streams": {fmt: (step_bytes, most_k) for fmt in ("fp8_block", "fp8_tensor")}}


# the row streams' tiles in the step (call 40's second sweep: 2 rows a program over 2048-column steps, each program's
# whole first step prefetched, lost there though fastest alone): other bytes a step, shorter steps, more prefetched
SWEEPS |= _on_shapes(
    "row_stream_tiles_",
    ((1, 512),),
    (
        {},
        _streams(8192, 4096),
        _streams(32768, 4096),
        _streams(16384, 2048),
        {"stream_prefetch_bytes": 1024},
        {"stream_prefetch_bytes": 4096},
    ),
    (
        ("v2_fp8", "deepseek-v2-lite", "fp8"),
        ("qwen3next_fp8", "qwen3-next-80b-slice", "fp8"),
        ("step_fp8", "step-3.5-flash-slice", "fp8"),
    ),
)


def _config(sweep: Sweep) -> dict:
    """A sweep's model config: bench/family_shapes.py's (quantized as bench/families.py's --quantized)."""
    if sweep.quantized:
        return bench_shapes(sweep.quantized, [sweep.shape])[sweep.shape].config
    return family_shapes()[sweep.shape].config


def apply(setting: dict, shipped: dict) -> None:
    for knob, (module, attr) in KNOBS.items():
        setattr(module, attr, setting.get(knob, shipped[knob]))


def run_sweep(llm, sweep: Sweep, shipped: dict) -> dict:
    """Each of the sweep's settings in turn on ``llm``'s engine, two passes; the report (the lower step ms of a
    point's two passes)."""
    times: dict[tuple[int, int, int], list[float]] = {}
    try:
        for _ in range(2):
            for i, setting in enumerate(sweep.settings):
                apply(setting, shipped)
                try:
                    _recapture_decode(llm.engine)
                    for batch, context in sweep.points:
                        ms = time_decode(llm, batch, context, steps=24)["step_ms"]
                        times.setdefault((i, batch, context), []).append(ms)
                        print(
                            f"  {setting or 'shipped'} b{batch}@{context}: {ms:.3f} ms", flush=True
                        )
                except Exception as e:  # noqa: BLE001 (a setting beyond the shared memory)
                    print(f"setting {setting}: {type(e).__name__}: {e}"[:300], flush=True)
    finally:
        apply({}, shipped)
    print(
        f"{sweep.shape}: " + " ".join(f"b{b}@{c}" for b, c in sweep.points) + " (step ms)  setting"
    )
    for i, setting in enumerate(sweep.settings):
        cells = " ".join(
            f"{min(times[(i, b, c)]):7.3f}" if (i, b, c) in times else "      -"
            for b, c in sweep.points
        )
        print(f"{cells}  {setting or 'shipped'}", flush=True)
    rows = [
        {"setting": sweep.settings[i], "batch": b, "context": c, "step_ms": min(ms)}
        for (i, b, c), ms in times.items()
    ]
    return {"shape": sweep.shape, "shipped": shipped, "rows": rows}


def engine_groups(names: list[str]) -> list[list[str]]:
    """The sweeps in order, consecutive ones of one shape and quantization together (one engine each)."""
    groups: list[list[str]] = []
    for name in names:
        key = (SWEEPS[name].shape, SWEEPS[name].quantized)
        if groups and (SWEEPS[groups[-1][0]].shape, SWEEPS[groups[-1][0]].quantized) == key:
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def main(out: str, *sweep_names: str) -> None:
    unknown = [name for name in sweep_names if name not in SWEEPS]
    if not sweep_names or unknown:
        raise SystemExit(f"sweeps: one or more of {sorted(SWEEPS)} (unknown: {unknown})")
    if len(sweep_names) > 1:
        Path(out).mkdir(parents=True, exist_ok=True)
    shipped = {knob: getattr(module, attr) for knob, (module, attr) in KNOBS.items()}
    for group in engine_groups(list(sweep_names)):
        sweeps = [SWEEPS[name] for name in group]
        batches = tuple(sorted({b for sweep in sweeps for b, _ in sweep.points}))
        with tempfile.TemporaryDirectory() as tmp:
            # (at least 2 requests' KV: time_decode asks 64 tokens a step for its one request at batch 1)
            llm = build(
                Path(tmp), _config(sweeps[0]), max_num_seqs=max(2, *batches), graph_sizes=batches
            )
            try:
                for name, sweep in zip(group, sweeps):
                    report = run_sweep(llm, sweep, shipped)
                    path = Path(out) / f"{name}.json" if len(sweep_names) > 1 else Path(out)
                    path.write_text(json.dumps(report, indent=1))
                    print(f"{name}: {path}", flush=True)
            finally:
                close(llm)


if __name__ == "__main__":
    main(*sys.argv[1:])
