"""The paged attention kernel with its splits merged by each tile's last split (attention/split_merge.py)
compiled for an H100 / H200 (sm_90) without a GPU, in a process of its own: Triton's interpreter runs no PTX,
so only a build shows that the merge fits the registers beside the attention's tiles (no spills) and that
its ticket is the acq_rel atomic at gpu scope the ordering needs. Decode at the heads of Llama-3.1-8B (8 kv
heads of 4 q heads, 128 wide), Qwen3-30B-A3B (4 of 8) and Gemma-3-12B (8 of 2, 256 wide), over a bf16
cache, with and without an output gate of one logit an element (Qwen3-Next's)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper)
SM90_COMPILE = """
from outpace.attention import triton_kernels as tk

for kv_heads, group, head_dim, gate in ((8, 4, 128, 0), (4, 8, 128, 0), (4, 8, 128, 2), (8, 2, 256, 0)):
    cfg = tk.launch_config(1, kv_heads, group, head_dim, 2, 1, 8192, 132)
    compiled = compile_for_hopper(
        tk._attention_kernel,
        dict(qk_scale="fp32", q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16",
             gate_ptr="*bf16", part_acc_ptr="*fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32",
             tickets_ptr="*i32", token_table_ptr="*i32", block_tables_ptr="*i64", seq_lens_ptr="*i64",
             query_lens_ptr="*i64", custom_mask_ptr="*u8", positions_ptr="*i64", k_scale_ptr="*fp32",
             v_scale_ptr="*fp32"),
        dict(KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_Q=cfg.block_q,
             BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_N_TAIL=cfg.block_n_tail, BLOCK_D=cfg.block_d,
             SPLIT_KV=True, MERGE=True, HAS_MASK=False, SLIDING=False, PRECISION="tf32", PDL=True,
             KV_SCALED=False, GATE=gate, PREFETCH_ROWS=0, LINES=2, LINE_ELEMS=64),
        cfg.num_warps, cfg.num_stages)
    ptx = compiled.asm["ptx"]
    tickets = [line for line in ptx.splitlines() if "atom" in line and ".add" in line]
    print(len(tickets), all("acq_rel" in t and ".gpu" in t for t in tickets),
          "0 bytes spill stores" in ptxas_report(compiled))
"""


def test_merge_compiles_with_its_ticket_and_without_spills(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows == [["1", "True", "True"]] * 4, done.stdout
