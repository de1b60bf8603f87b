"""A decoder layer's few-row projections with their element-wise neighbours folded in (decode and
small verify batches on the GPU, where every projection is one pass over its weights).

At M <= 16 rows a projection is bound by reading its weights, and the small kernels around it (the
RMSNorm in front, the residual add, SiLU*mul, RoPE, the KV-cache write after it) cost their launch
and a round trip of the activations each. Here one kernel does a projection and its neighbours:

- ``norm_project``      RMSNorm(x) @ W.T                  (the LM head after the final norm)
- ``project_add``       residual + x @ W.T                (o_proj and down_proj: the residual stream)
- ``norm_project_swiglu`` silu(g) * u, [g | u] = RMSNorm(x) @ W_gate_up.T
- ``norm_project_qkv``  [q | k | v] = RMSNorm(x) @ W_qkv.T; RoPE on q and k; k and v stored straight
                        into the paged KV cache at the tokens' slots; returns q

RMSNorm folds into the product because its scale is one number per row: RMSNorm(x) @ W.T =
rstd * ((x * w_norm) @ W.T), and the sum of squares that gives rstd accumulates in the same pass
over x. RoPE and SwiGLU pair column c with column c + H (H = head_dim / 2 inside each head; H = the
intermediate size for [gate | up]): a program computes both columns of each of its pairs, so the
epilogue has what it needs. The roundings differ from the unfused chain (no bf16 round trip between
the steps), so this path is never used in batch-invariant mode.

On Hopper GPUs the kernels launch with programmatic dependent launch (layers/pdl.py): a kernel's
programs start while the previous kernel drains, prefetch their first weight tiles into L2 (weights
never depend on the previous kernel), and only then wait for the previous kernel's results.
With TRITON_INTERPRET=1 the kernels also run on CPU tensors (float32), which is how the tests check
them without a GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.layers.linear import batch_invariant_enabled
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options
from outpace.layers.skinny_gemm import MAX_ROWS

# epilogues (EPILOGUE)
_PLAIN = tl.constexpr(0)
_SWIGLU = tl.constexpr(1)
_QKV = tl.constexpr(2)
_PREFETCH_K = 512  # weight columns each program prefetches into L2 before waiting on its inputs (~2 us of reads)


@triton.jit
def _prefetch_l2(ptrs):
    """Ask for the 128-byte lines at ``ptrs`` to be brought into L2 (no registers are written)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _fused_rows_kernel(
        x_ptr, w_ptr, out_ptr, norm_ptr, res_ptr, pos_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        M, N_OUT, K, stride_xm, stride_wn, stride_om, stride_rm, eps, q_size, kv_size,
        NORM: tl.constexpr, RESIDUAL: tl.constexpr, EPILOGUE: tl.constexpr, HALF: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
        PREFETCH_K: tl.constexpr):
    """Program p owns outputs i = p * BN ... p * BN + BN - 1 of every row. PLAIN: output i is column i.
    SWIGLU / QKV: output i is the pair (a, a + HALF), a = (i // HALF) * 2 * HALF + i % HALF."""
    i = tl.program_id(0) * BN + tl.arange(0, BN)                               # [BN]
    i_ok = i < N_OUT
    paired: tl.constexpr = EPILOGUE != _PLAIN
    if paired:
        col_a = (i // HALF) * (2 * HALF) + i % HALF                             # [BN]
    else:
        col_a = i
    rows = tl.arange(0, BM)                                                      # [BM]
    row_ok = rows < M
    ks = tl.arange(0, BK)
    if PDL:
        lines = tl.arange(0, PREFETCH_K // 64) * 64                              # one bf16 element per 128 B
        lines = tl.where(lines < K, lines, 0)[None, :]                           # never past a row's end
        row_a = tl.where(i_ok, col_a, 0)[:, None] * stride_wn
        _prefetch_l2(w_ptr + row_a + lines)
        if paired:
            _prefetch_l2(w_ptr + row_a + HALF * stride_wn + lines)
    pdl_enter(PDL)
    acc_a = tl.zeros((BM, BN), dtype=tl.float32)
    acc_b = tl.zeros((BM, BN), dtype=tl.float32)
    sum_sq = tl.zeros((BM,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks                                                             # [BK]
        k_ok = kk < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :], mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)                                                   # [BM, BK]
        if NORM:
            xf = x.to(tl.float32)
            sum_sq += tl.sum(xf * xf, axis=1)
            x = (xf * tl.load(norm_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]).to(x.dtype)
        w_ok = i_ok[:, None] & k_ok[None, :]
        w_a = tl.load(w_ptr + col_a[:, None] * stride_wn + kk[None, :], mask=w_ok, other=0.0)   # [BN, BK]
        acc_a += tl.dot(x, tl.trans(w_a), input_precision=PRECISION)
        if paired:
            w_b = tl.load(w_ptr + (col_a + HALF)[:, None] * stride_wn + kk[None, :], mask=w_ok, other=0.0)
            acc_b += tl.dot(x, tl.trans(w_b), input_precision=PRECISION)
    if NORM:
        rstd = tl.rsqrt(sum_sq / K + eps)[:, None]                               # [BM, 1]
        acc_a *= rstd
        acc_b *= rstd
    ok = row_ok[:, None] & i_ok[None, :]
    if EPILOGUE == _PLAIN:
        if RESIDUAL:
            acc_a += tl.load(res_ptr + rows[:, None] * stride_rm + i[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows[:, None] * stride_om + i[None, :], acc_a.to(out_ptr.dtype.element_ty), mask=ok)
    elif EPILOGUE == _SWIGLU:
        silu = acc_a / (1.0 + tl.exp(-acc_a))
        tl.store(out_ptr + rows[:, None] * stride_om + i[None, :], (silu * acc_b).to(out_ptr.dtype.element_ty),
                 mask=ok)
    else:
        _qkv_epilogue(acc_a, acc_b, rows, row_ok, col_a, i % HALF, ok, out_ptr, stride_om, pos_ptr, cos_ptr, sin_ptr,
                      k_cache_ptr, v_cache_ptr, slot_ptr, q_size, kv_size, HALF)


@triton.jit
def _qkv_epilogue(a, b, rows, row_ok, col_a, j, ok, q_ptr, stride_qm, pos_ptr, cos_ptr, sin_ptr, k_cache_ptr,
                  v_cache_ptr, slot_ptr, q_size, kv_size, HALF: tl.constexpr):
    """a, b [BM, BN]: columns col_a and col_a + HALF of [q | k | v] for each row. Rotates q and k pairs
    by the row's position (neox layout, pair j of its head), then stores q into q_ptr [M, q_size] and
    k, v into the caches' rows at the rows' slots (caches [slots, kv_size], contiguous)."""
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)                          # [BM]
    trig = pos[:, None].to(tl.int64) * HALF + j[None, :]                         # [BM, BN]
    cos = tl.load(cos_ptr + trig, mask=ok, other=1.0)
    sin = tl.load(sin_ptr + trig, mask=ok, other=0.0)
    rotate = (col_a < q_size + kv_size)[None, :]
    a, b = tl.where(rotate, a * cos - b * sin, a), tl.where(rotate, b * cos + a * sin, b)
    is_q = (col_a < q_size)[None, :]
    q_col = tl.where(is_q, col_a, 0)[None, :]
    q_dst = q_ptr + rows[:, None] * stride_qm + q_col
    tl.store(q_dst, a.to(q_ptr.dtype.element_ty), mask=ok & is_q)
    tl.store(q_dst + HALF, b.to(q_ptr.dtype.element_ty), mask=ok & is_q)
    is_k = (col_a >= q_size)[None, :] & rotate
    is_v = (col_a >= q_size + kv_size)[None, :]
    kv_col = tl.where(is_v, col_a - q_size - kv_size, tl.where(is_k, col_a - q_size, 0))   # [1, BN]
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)[:, None]            # [BM, 1]
    k_dst = k_cache_ptr + slot * kv_size + kv_col
    v_dst = v_cache_ptr + slot * kv_size + kv_col
    tl.store(k_dst, a.to(k_cache_ptr.dtype.element_ty), mask=ok & is_k)
    tl.store(k_dst + HALF, b.to(k_cache_ptr.dtype.element_ty), mask=ok & is_k)
    tl.store(v_dst, a.to(v_cache_ptr.dtype.element_ty), mask=ok & is_v)
    tl.store(v_dst + HALF, b.to(v_cache_ptr.dtype.element_ty), mask=ok & is_v)


def fused_rows_apply(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernels serve x [M, K] @ weight.T: few rows of half precision on the GPU,
    autograd off, outside batch-invariant mode."""
    return (x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.is_contiguous() and not torch.is_grad_enabled()
            and not batch_invariant_enabled())


def _launch(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, n_out: int, epilogue: int, half: int = 1,
            norm: tuple[torch.Tensor, float] | None = None, residual: torch.Tensor | None = None,
            qkv: tuple | None = None, pdl: bool | None = None,
            tiles: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``tiles`` (benchmarks): (outputs a program, BK, warps, stages) instead of the defaults."""
    m, k = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    wide = weight.shape[0] >= 16384
    block_n = (64 if wide else 32) // (1 if epilogue == _PLAIN.value else 2)  # outputs a program: 32-64 weight rows
    block_k, num_warps, num_stages = 256, 4, 5
    if tiles is not None:
        block_n, block_k, num_warps, num_stages = tiles
    norm_w, eps = norm if norm is not None else (x, 0.0)
    res = residual if residual is not None else x
    pos, cos, sin, k_cache, v_cache, slots, q_size, kv_size = qkv if qkv is not None else (x,) * 6 + (0, 0)
    use_pdl = pdl_available(x.device) if pdl is None else pdl
    _fused_rows_kernel[(triton.cdiv(n_out, block_n),)](
        x, weight, out, norm_w, res, pos, cos, sin, k_cache, v_cache, slots,
        m, n_out, k, x.stride(0), weight.stride(0), out.stride(0), res.stride(0), eps, q_size, kv_size,
        NORM=norm is not None, RESIDUAL=residual is not None, EPILOGUE=epilogue, HALF=half,
        BM=MAX_ROWS, BN=block_n, BK=block_k, PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=use_pdl,
        PREFETCH_K=max(64, min(_PREFETCH_K, triton.next_power_of_2(k))),
        num_warps=num_warps, num_stages=num_stages, **pdl_launch_options(use_pdl))
    return out


def norm_project(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                 out_dtype: torch.dtype | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] -> RMSNorm(x) @ weight.T [M, N] in ``out_dtype`` (x's dtype by default)."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=out_dtype or x.dtype, device=x.device)
    return _launch(x, weight, out, weight.shape[0], _PLAIN.value, norm=(norm_weight, eps), pdl=pdl)


def project_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K], residual [M, N] -> residual + x @ weight.T [M, N] (a new tensor)."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, weight, out, weight.shape[0], _PLAIN.value, residual=residual, pdl=pdl)


def norm_project_swiglu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, gate_up: torch.Tensor,
                        pdl: bool | None = None) -> torch.Tensor:
    """x [M, K]; gate_up [2 * I, K] (gate rows, then up rows) -> silu(g) * u [M, I], where
    [g | u] = RMSNorm(x) @ gate_up.T."""
    inter = gate_up.shape[0] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    return _launch(x, gate_up, out, inter, _SWIGLU.value, half=inter, norm=(norm_weight, eps), pdl=pdl)


def norm_project_qkv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, qkv: torch.Tensor, head_dim: int,
                     q_size: int, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                     pdl: bool | None = None) -> torch.Tensor:
    """x [M, K]; qkv [q_size + 2 * kv_size, K] (q rows, k rows, v rows); positions, slot_mapping [M];
    cos, sin [max_positions, head_dim // 2] float32; caches [num_blocks, block_size, kv_heads, head_dim]
    (contiguous). Computes [q | k | v] = RMSNorm(x) @ qkv.T, rotates q and k (neox), writes k and v
    to the caches at the slots, and returns q [M, q_size]."""
    kv_size = (qkv.shape[0] - q_size) // 2
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("norm_project_qkv writes into contiguous KV caches only")
    q = torch.empty(x.shape[0], q_size, dtype=x.dtype, device=x.device)
    args = (positions, cos, sin, k_cache, v_cache, slot_mapping, q_size, kv_size)
    return _launch(x, qkv, q, qkv.shape[0] // 2, _QKV.value, half=head_dim // 2, norm=(norm_weight, eps), qkv=args,
                   pdl=pdl)
