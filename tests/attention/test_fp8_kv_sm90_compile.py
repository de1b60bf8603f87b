"""The FP8 KV cache's kernel variants compiled for an H100 / H200 (sm_90) without a GPU, in a process of its
own (the interpreter replaces @triton.jit here and runs what a GPU build refuses, e.g. a loop-carried name
that changes type): the write kernel quantizing bf16 rows into a float8 cache, the fast attention kernel
(decode; tree mask with a sliding window), the batch-invariant kernel, the MLA kernel at DeepSeek-V3's
width and its batch-invariant tree walk over logical rows (a loop-carried name changing type there failed every
bf16 tree on the H200 once) and the fused MLA block's q/kv kernels (layers/mla_fused.py) at Kimi-K2's and
DeepSeek-V2-Lite's shapes, each over float8e4nv caches with their scale pointers, at the launchers' tiles.
ptxas's spill report is printed (the fast kernel's masked, windowed variant and MLA spill some registers already over a
bf16 cache or an fp8 one without scales: measured 240 / 344 and 68 bytes; the invariant tree walk 840 bytes; the fused q/kv kernel spills 48
bytes with an FP8 cache, none with bf16: its one kv-writing program quantizes a 16 x 512 tile)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report)
SM90_COMPILE = """
from outpace.attention import invariant_attention as ia, mla_kernels as mk, triton_kernels as tk
from outpace.layers import mla_fused_kernels


def build(kernel, pointers, constants, name, **options):
    compiled = compile_for_hopper(kernel, {"qk_scale": "fp32", **pointers}, constants, **options)
    assert "cvt" in compiled.asm["ptx"] and "e4m3" in compiled.asm["ptx"], name  # fp8 conversions
    spills = [line.strip() for line in ptxas_report(compiled).splitlines() if "spill" in line]
    print(name, spills[0])


fp8 = "*fp8e4nv"
build(tk._write_kv_kernel,
      dict(k_ptr="*bf16", v_ptr="*bf16", k_cache_ptr=fp8, v_cache_ptr=fp8, slot_ptr="*i64",
           seq_index_ptr="*i64", query_index_ptr="*i64", token_table_ptr="*i32",
           k_scale_ptr="*fp32", v_scale_ptr="*fp32"),
      dict(KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, QUANT=True), "write")
attention = dict(q_ptr="*bf16", k_cache_ptr=fp8, v_cache_ptr=fp8, out_ptr="*bf16", part_acc_ptr="*fp32",
                 part_max_ptr="*fp32", part_sum_ptr="*fp32", token_table_ptr="*i32",
                 block_tables_ptr="*i64", seq_lens_ptr="*i64", query_lens_ptr="*i64",
                 custom_mask_ptr="*u8", positions_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32")
shape = dict(KV_HEADS=8, GROUP=4, HEAD_DIM=128, BLOCK_SIZE=16, PRECISION="tf32", KV_SCALED=True)
for name, query_len, masked in (("decode", 1, False), ("tree+window", 6, True)):
    cfg = tk.launch_config(4, 8, 4, 128, 2, query_len, 8192, 132)
    build(tk._attention_kernel, attention,
          dict(shape, BLOCK_Q=cfg.block_q, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
               BLOCK_N_TAIL=cfg.block_n_tail, BLOCK_D=cfg.block_d, SPLIT_KV=True, HAS_MASK=masked,
               SLIDING=masked, PDL=False),
          name, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
cfg = ia.invariant_launch_config(8, 4, 128, 2, 6, 8192)
build(ia._invariant_attention_kernel, attention,
      dict(shape, BLOCK_Q=cfg.block_q, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
           BLOCK_W=16, SPLIT_ROWS=cfg.split_rows, HAS_MASK=True, SLIDING=False),
      "invariant tree", num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False)
mla = dict(q_latent_ptr="*bf16", q_rope_ptr="*bf16", cache_ptr=fp8, out_ptr="*bf16", part_acc_ptr="*fp32",
           part_max_ptr="*fp32", part_sum_ptr="*fp32", token_table_ptr="*i32", block_tables_ptr="*i64",
           seq_lens_ptr="*i64", query_lens_ptr="*i64", custom_mask_ptr="*u8", k_scale_ptr="*fp32")
# (name, heads, BLOCK_M, the batch-invariant tree walk over logical rows, warps, options)
for name, heads, block_m, logical, warps, options in (
    ("mla v3", 128, 32, False, 8, {}),
    ("mla v2-lite invariant tree", 16, 16, True, 4, dict(enable_fp_fusion=False)),
):
    build(mk._mla_kernel, mla,
          dict(HEADS=heads, R=512, P=64, BLOCK_R=512, BLOCK_P=64, BLOCK_SIZE=64, BLOCK_M=block_m, BLOCK_N=32,
               Q_PARTS=1, PARTIALS=True, HAS_MASK=True, LOGICAL_ROWS=logical, BLOCK_W=16,
               PRECISION="tf32", KV_SCALED=True, PDL=not logical),
          name, num_warps=warps, num_stages=2, **options)
fused = {n: "*bf16" for n in ("x_ptr", "wq_ptr", "wq_scale_ptr", "w_uk_ptr", "kv_norm_ptr", "q_parts_ptr",
                                "q_pe_ptr")}
fused.update({n: "*fp32" for n in ("sq_ptr", "kv_raw_ptr", "cos_ptr", "sin_ptr", "k_scale_ptr")})
build(mla_fused_kernels.q_absorb_kernel,
      dict(fused, cache_ptr=fp8, slot_ptr="*i64", pos_ptr="*i64", eps="fp32", kv_eps="fp32"),
      dict(HEADS=64, NOPE=128, P=64, R=512, Q_PARTS=2, NOPE_CHUNK=64, PE_PARTS=1, PE_CHUNK=32, BLOCK_NC=64,
           BLOCK_HP=32, BLOCK_KP=32, BLOCK_R=512, BLOCK_SQ=128, BR=128, BM=16, BK=128,
           INTERLEAVED=True, PRECISION="tf32", PDL=True, PREFETCH_K=512, Q_FORMAT="none", SCALE_BN=1,
           SCALE_BK=1),
      "fused mla q/kv (kimi-k2)", num_warps=4, num_stages=3)
build(mla_fused_kernels.absorb_kernel,
      dict(fused, q_ptr="*fp32", q_latent_ptr="*bf16", cache_ptr=fp8, slot_ptr="*i64", pos_ptr="*i64",
           kv_eps="fp32"),
      dict(HEADS=16, NOPE=128, P=64, R=512, R_PARTS=8, R_CHUNK=64, PREFETCH_LINES=1, BLOCK_NOPE=128,
           BLOCK_HP=32, BLOCK_R=512, BR=64, BM=16, INTERLEAVED=True, PRECISION="tf32", PDL=True),
      "fused mla latent query/kv (v2-lite)", num_warps=4, num_stages=1)
"""


def test_fp8_kernels_compile_for_sm90(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 8, done.stdout  # one ptxas report a kernel
