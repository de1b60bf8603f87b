"""The fused few-row projection kernel (layers/fused_rows_kernel.py, launched by layers/fused_projection.py) compiled for an
H100 / H200 (sm_90) without a GPU, in a process of its own (the interpreter replaces @triton.jit here), as its
launches compile it: the launch code runs on CPU tensors of Step-3.5-Flash's shapes at tensor parallelism 2 (one
token, 132 SMs) with a recorder in place of the kernel, and each recorded launch is compiled as Triton's launcher
specializes it. Over fp8 weights (``Fp8Weight``) in the plain (o_proj with the residual and the next norm), SwiGLU
(the shared expert's gate/up) and q/k/v epilogues (in batch-invariant mode; otherwise the quantized product,
whose compile tests/layers/test_quant_matmul_sm90_compile.py checks, and for q/k/v the per-head kernel, whole or
half of each head turned), and over bf16 weights (plain; q/k/v with Step-3.5's
zero-centred head norms; Gemma 4's full layers, v from k's projection): each must compile (the interpreter ran
an fp8 kernel that Triton's compiler refused: the product of bf16 and fp8 tiles after an early return), keep its
registers (ptxas -v: no spills) and stream its weights through cp.async. And the embedding-and-norms pair
(layers/normed_rows.py ``embed_norm_pair``: EAGLE3's and MTP layers' input) at the widened Qwen3.5's shape, and the greedy draft
heads with the argmax folded in (``head_argmax``)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report, launches_of,
# compile_as_launched)
SM90_COMPILE = """
from outpace.layers import fused_projection as fp, normed_rows
from outpace.layers.quant.fp8_weight import Fp8Weight

from outpace.attention.context import forward_settings

fp.num_sms = lambda device: 132  # an H200's grids

def invariant(fn, *args, **kwargs):
    with forward_settings(batch_invariant=True):
        return fn(*args, **kwargs)

def fp8(n, k):
    return Fp8Weight(torch.empty(n, k, dtype=torch.float8_e4m3fn), torch.empty(-(-n // 128), -(-k // 128)),
                     (128, 128))

x, stream = torch.empty(1, 6144, dtype=torch.bfloat16), torch.empty(1, 4096, dtype=torch.bfloat16)
rows = normed_rows.NormedRows(stream, stream.clone(), torch.empty(1, 1))
norm = torch.empty(4096, dtype=torch.bfloat16)
caches = [torch.empty(64, 16, 4, 128, dtype=torch.bfloat16) for _ in range(2)]
qkv_args = (torch.zeros(1, dtype=torch.int64), torch.empty(4096, 64), torch.empty(4096, 64), *caches,
            torch.zeros(1, dtype=torch.int64))
cases = {
    # fp8 plain and SwiGLU epilogues: the fused kernel's in batch-invariant mode (the normal path's quantized
    # product: tests/layers/test_quant_matmul_sm90_compile.py)
    "plain:fp8_invariant": lambda: invariant(fp.project_add_normed, x, fp8(4096, 6144), stream, norm, pdl=True),
    "swiglu:fp8_invariant": lambda: invariant(fp.norm_project_swiglu, rows, 1e-5, fp8(1280, 4096), pdl=True),
    # the fused kernel's fp8 q/k/v epilogue (batch-invariant mode), the quantized product's per-head kernel
    "qkv:fp8_invariant": lambda: invariant(fp.norm_project_qkv, rows, 1e-5, fp8(7168, 4096), 128, 6144,
                                           *qkv_args, pdl=True),
    "qkv:fp8": lambda: fp.norm_project_qkv(rows, 1e-5, fp8(7168, 4096), 128, 6144, *qkv_args, pdl=True),
    # Step-3.5-Flash-FP8's full-attention layers at TP = 2 (32 heads, 4 kv heads): half of each head turned
    "qkv_partial:fp8": lambda: fp.norm_project_qkv(x[:, :4096], 0.0, fp8(4096 + 1024, 4096), 128, 4096,
                                                   qkv_args[0], torch.empty(4096, 32), torch.empty(4096, 32),
                                                   *qkv_args[3:], pdl=True,
                                                   qk_norm=(norm[:128], norm[:128], 1e-5), qk_offset=1.0),
    "plain:bf16": lambda: fp.project_add_normed(x, torch.empty(4096, 6144, dtype=torch.bfloat16), stream,
                                                norm, pdl=True),
    # Step-3.5's sliding layers at TP = 2 (48 heads, 4 kv heads): zero-centred q/k head norms
    "qkv_norms:bf16": lambda: fp.norm_project_qkv(x[:, :4096], 0.0, torch.empty(7168, 4096, dtype=torch.bfloat16),
                                                  128, 6144, *qkv_args, pdl=True,
                                                  qk_norm=(norm[:128], norm[:128], 1e-5), qk_offset=1.0),
    # Gemma-4-26B-A4B's full layers (16 heads, 2 kv heads of 512, k = v): q and k packed, v from k's projection
    "qkv_k_eq_v:bf16": lambda: fp.norm_project_qkv(x[:, :2816], 0.0, torch.empty(9216, 2816, dtype=torch.bfloat16),
                                                   512, 8192, qkv_args[0], torch.empty(4096, 256),
                                                   torch.empty(4096, 256),
                                                   *[torch.empty(64, 16, 2, 512, dtype=torch.bfloat16)] * 2,
                                                   qkv_args[5], pdl=True, qk_norm=(norm[:512], norm[:512], 1e-6),
                                                   v_norm=True, v_from_k=True),
    # an MTP draft pass's input at the widened Qwen3.5's shape: the embedding's gather and both norms (1 + w)
    "embed_norm_pair:bf16": lambda: normed_rows.embed_norm_pair(torch.zeros(12, dtype=torch.int64),
                                                       torch.empty(4096, 4096, dtype=torch.bfloat16),
                                                       (stream[0], 1e-6, 1.0), stream.expand(12, -1),
                                                       (stream[0], 1e-6, 1.0)),
    # greedy draft heads, the argmax folded in: the widened Qwen3.5's MTP head (4096 columns) on a window's last
    # row; an EAGLE3 draft's (32000 columns) behind its norm, through its token map
    "argmax:bf16": lambda: fp.head_argmax(stream.expand(12, -1), torch.empty(4096, 4096, dtype=torch.bfloat16),
                                          rows=torch.zeros(1, dtype=torch.int64), pdl=True),
    "argmax_normed_map:bf16": lambda: fp.head_argmax(rows, torch.empty(32000, 4096, dtype=torch.bfloat16), 1e-5,
                                                     token_map=torch.zeros(32000, dtype=torch.int64), pdl=True),
}
# {kernel: (the kernel, its launches)} of one case, each kernel recorded under the name its launcher calls (per-head
# norms on few programs: the first two, in turn)
def launches(run):
    projections = {}
    record = lambda: projections.update(launches_of(fp, ["fused_rows_kernel", "qkv_heads_kernel"], run))
    rows = launches_of(normed_rows, ["_embed_norm_pair_kernel"], record)
    return {
        **{k: (getattr(fp, k), v) for k, v in projections.items()},
        **{k: (getattr(normed_rows, k), v) for k, v in rows.items()},
    }

for name, run in cases.items():
    ok = True
    for kernel, (jitted, recorded) in launches(run).items():
        for args, kwargs in recorded:
            compiled = compile_as_launched(jitted, args, kwargs)
            ok &= "0 bytes spill stores" in ptxas_report(compiled)
            ok &= kernel != "fused_rows_kernel" or "cp.async" in compiled.asm["ptx"]
    print(name, ok)
"""


def test_fused_projection_compiles_for_sm90_over_fp8_and_bf16_weights(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = [
        "plain:fp8_invariant",
        "swiglu:fp8_invariant",
        "qkv:fp8_invariant",
        "qkv:fp8",
        "qkv_partial:fp8",
        "plain:bf16",
        "qkv_norms:bf16",
        "qkv_k_eq_v:bf16",
        "embed_norm_pair:bf16",
        "argmax:bf16",
        "argmax_normed_map:bf16",
    ]
    assert done.stdout.split() == [w for n in names for w in (n, "True")]
