"""The attention kernels' cache prefetch (``prefetch_kv_rows`` of attention/triton_kernels.py and
attention/mla_kernels.py) compiled for an H100 / H200 (sm_90) without a GPU, in a process of its own: Triton's
interpreter runs no PTX, so only a build shows that the prefetches are there and that they come before the
dependent launch's wait (which the program's loads of q and of the rows the kernel before it writes must follow).
Decode at Llama-3.1-8B's attention shape over a bf16 cache (a 128-wide head: 2 lines a K or V row), and MLA at
DeepSeek-V2-Lite's over a bf16 latent cache (576 elements: 9 of 16 lines a row) and at DeepSeek-V3's over an fp8
one (5 of 8)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper)
SM90_COMPILE = """
import sys
from outpace.attention import mla_kernels as mk, triton_kernels as tk

rows = int(sys.argv[1])


def prefetches(kernel, pointers, constants, num_warps, num_stages):
    compiled = compile_for_hopper(kernel, {"qk_scale": "fp32", **pointers}, constants, num_warps, num_stages)
    ptx = compiled.asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    print(ptx.count("prefetch.global.L2"), ptx[:wait].count("prefetch.global.L2"))


cfg = tk.launch_config(1, 8, 4, 128, 2, 1, 8192, 132)
prefetches(
    tk._attention_kernel,
    dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16", gate_ptr="*bf16",
         part_acc_ptr="*fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32", tickets_ptr="*i32",
         token_table_ptr="*i32", block_tables_ptr="*i64", seq_lens_ptr="*i64", query_lens_ptr="*i64", custom_mask_ptr="*u8",
         positions_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32"),
    dict(KV_HEADS=8, GROUP=4, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_Q=cfg.block_q, BLOCK_M=cfg.block_m,
         BLOCK_N=cfg.block_n, BLOCK_N_TAIL=cfg.block_n_tail, BLOCK_D=cfg.block_d, SPLIT_KV=True, MERGE=False, HAS_MASK=False,
         SLIDING=False, PRECISION="tf32", PDL=True, KV_SCALED=False, GATE=0, PREFETCH_ROWS=rows, LINES=2,
         LINE_ELEMS=64),
    cfg.num_warps, cfg.num_stages)
for cache, heads, block_m, lines, line_elems, warps in (("*bf16", 16, 16, 16, 64, 4), ("*fp8e4nv", 128, 32, 8, 128, 8)):
    prefetches(
        mk._mla_kernel,
        dict(q_latent_ptr="*bf16", q_rope_ptr="*bf16", cache_ptr=cache, out_ptr="*bf16", part_acc_ptr="*fp32",
             part_max_ptr="*fp32", part_sum_ptr="*fp32", token_table_ptr="*i32", block_tables_ptr="*i64",
             seq_lens_ptr="*i64", query_lens_ptr="*i64", custom_mask_ptr="*u8", k_scale_ptr="*fp32"),
        dict(HEADS=heads, R=512, P=64, BLOCK_R=512, BLOCK_P=64, BLOCK_SIZE=64, BLOCK_M=block_m, BLOCK_N=32,
             MIN_SPLIT=64, Q_PARTS=1, PARTIALS=True, HAS_MASK=False, LOGICAL_ROWS=False, BLOCK_W=16,
             PRECISION="tf32", KV_SCALED=cache != "*bf16", PDL=True, PREFETCH_ROWS=rows, LINES=lines,
             LINE_ELEMS=line_elems),
        warps, 2)
"""


@pytest.mark.parametrize("rows", [0, 64])
def test_cache_rows_are_prefetched_before_the_wait(tmp_path, rows):
    done = run_compile_script(SM90_COMPILE, str(rows), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = [tuple(map(int, line.split())) for line in done.stdout.splitlines()]
    assert len(counts) == 3, done.stdout  # paged attention, MLA bf16, MLA fp8
    for total, before_wait in counts:
        assert total == before_wait  # every prefetch before the wait
        assert (total > 0) == (rows > 0)  # and none without the setting
