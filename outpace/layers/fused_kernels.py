"""Triton kernels for the element-wise work of a decoder layer, and their launchers.

Each replaces a chain of small torch kernels with one launch, and computes exactly what the torch
reference next to its module does (``rms_norm_torch`` in norm.py, ``rotary_torch`` in rotary.py,
``silu_and_mul_torch``, ``sigmoid_gate_torch``, ``relu2_torch`` in activation.py): float32 math, with the same intermediate roundings to the
tensors' dtypes. Launches disable floating-point contraction (``enable_fp_fusion=False``), so a
``a * b - c * d`` rounds each product as torch's separate kernels do instead of fusing into an FMA.

1. ``_rms_norm_kernel`` (one program per row): optionally adds the residual, writes that sum (the
   new residual stream) and RMSNorm of it.
2. ``_rotary_kernel`` (one program per token): rotates all q and k heads of the token (neox layout),
   reading the token's row of the cached cos/sin tables; with partial rotary (tables narrower than the
   heads) the other dimensions are copied through into the full-width output.
3. ``_silu_and_mul_kernel`` (one program per row and BLOCK columns): silu(gate) * up.
4. ``_sigmoid_gate_kernel`` (one program per token and head): x * sigmoid(gate), the gate per element
   (Qwen3-Next's attention output gate) or one per head (Step-3.5's); its arithmetic, ``sigmoid_gated``, is
   also the paged-attention kernels' gated store (attention/triton_kernels.py).
5. ``_relu2_kernel`` (one program per row and BLOCK columns): relu(x)^2 (Nemotron-H's MLP).

Grids come from tensor shapes only and nothing syncs with the host, so every launch can be
captured in a CUDA graph. The kernels have no backward: the modules call them only on CUDA tensors
with autograd off (the engine runs under ``torch.inference_mode``). With TRITON_INTERPRET=1 the
launchers also run on CPU tensors (float32), which is how the tests check them without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ELEMENTWISE_BLOCK = 1024


@triton.jit
def row_rstd(sq_ptr, rows, row_ok, M, num_sq_parts, K, eps, BLOCK_P: tl.constexpr):
    """[BM, 1] float32: each row's RMSNorm factor rsqrt(sum(sq[:, row]) / K + eps) from the partial sums of
    squares sq [num_sq_parts, M] of a ``NormedRows`` (its ``sq_parts``), for the kernels that fold the norm
    into a projection of the rows ``rows`` [BM] (``row_ok``: the real ones)."""
    parts = tl.arange(0, BLOCK_P)
    sq = tl.load(
        sq_ptr + parts[:, None] * M + rows[None, :],
        mask=(parts < num_sq_parts)[:, None] & row_ok[None, :],
        other=0.0,
    )  # [BLOCK_P, BM]
    return tl.rsqrt(tl.sum(sq, axis=0) / K + eps)[:, None]


@triton.jit
def rms_normed(
    s,  # [BLOCK] a row of the stream, in its dtype (columns past dim zero)
    w_ptr,
    cols,  # [BLOCK]
    mask,  # [BLOCK] cols < dim
    dim,
    eps,
    offset,
    HAS_WEIGHT: tl.constexpr,
    WEIGHT_IN_FLOAT32: tl.constexpr,
):
    """The row's RMSNorm in float32 [BLOCK], ``_rms_norm_kernel``'s (its docstring)."""
    sf = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / dim + eps)
    if WEIGHT_IN_FLOAT32:
        normed = sf * rstd
        if HAS_WEIGHT:
            normed = normed * (offset + tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32))
    else:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        normed = w * (sf * rstd).to(s.dtype).to(tl.float32)
    return normed


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    dim,
    heads,
    stride_x,
    stride_x_head,
    stride_res,
    eps,
    offset,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    WEIGHT_IN_FLOAT32: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row r: s = x[r] (+ res[r], rounded to res_out's dtype and stored there); n = s * rsqrt(mean(s^2) + eps)
    in float32; out[r] = w * n.to(s.dtype) (``RMSNorm``), or with WEIGHT_IN_FLOAT32 (offset + w) * n in
    float32 (``Float32RMSNorm``; n itself without HAS_WEIGHT), rounded to out's dtype. Row r of x is head
    r % heads of token r // heads (x [tokens, heads, dim] with any token and head strides: q or k heads viewed
    in a packed projection); out, res and res_out are [rows, dim]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x_row = x_ptr + (row // heads) * stride_x + (row % heads) * stride_x_head
    s = tl.load(x_row + cols, mask=mask, other=0.0)  # [BLOCK]
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        s = (s.to(tl.float32) + res.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * dim + cols, s, mask=mask)
    normed = rms_normed(s, w_ptr, cols, mask, dim, eps, offset, HAS_WEIGHT, WEIGHT_IN_FLOAT32)
    tl.store(out_ptr + row * dim + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    offset: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., dim] (+ residual [..., dim]) -> (RMSNorm of the sum, the sum), as ``rms_norm_torch``, or with
    ``offset`` (0.0 or Gemma's 1.0) as ``rms_norm_f32``: the weight (None: no weight) applied in float32.

    Without a residual the sum is ``x`` itself. Outputs are new contiguous tensors: the sum in
    torch's dtype for ``x + residual``; the normed one in torch's dtype for ``weight * sum``, or in the
    sum's dtype with ``offset``.
    """
    dim = x.shape[-1]
    # [tokens, heads, dim] read in place with its strides (per-head q/k norms of a packed projection's views)
    x3 = x if x.dim() == 3 and x.stride(-1) == 1 else _rows(x).unsqueeze(1)
    res2 = x3 if residual is None else _rows(residual)  # [rows, dim] (unread without a residual)
    stream_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    stream = x if residual is None else torch.empty(x.shape, dtype=stream_dtype, device=x.device)
    in_float32 = offset is not None
    out_dtype = stream_dtype if in_float32 else torch.promote_types(weight.dtype, stream_dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    block = triton.next_power_of_2(dim)
    _rms_norm_kernel[(x3.shape[0] * x3.shape[1],)](
        x3,
        res2,
        x3 if weight is None else weight,
        out,
        stream,
        dim,
        x3.shape[1],
        x3.stride(0),
        x3.stride(1),
        res2.stride(0),
        eps,
        offset or 0.0,
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        WEIGHT_IN_FLOAT32=in_float32,
        BLOCK=block,
        num_warps=row_warps(block),
        enable_fp_fusion=False,
    )
    return out, stream


def row_warps(block: int) -> int:
    """Warps of a program that normalises one row of ``block`` columns: 256 columns a warp, 1 to 16."""
    return min(max(block // 256, 1), 16)


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    heads,
    stride_t,
    stride_h,
    cos,
    sin,
    half,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """One token's ``heads`` heads: x [.., heads, head_dim] (strided) -> out [.., heads, head_dim], contiguous,
    the first 2 * half dimensions rotated (cos, sin [1, BLOCK_HALF] float32), the others copied through
    (partial rotary; BLOCK_PASS 0: none)."""
    h = tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    j = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BLOCK_HALF]
    mask = (h < heads) & (j < half)
    src = x_ptr + token * stride_t + h * stride_h
    dst = out_ptr + (token * heads + h) * head_dim
    x1 = tl.load(src + j, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF] first halves
    x2 = tl.load(src + half + j, mask=mask, other=0.0).to(tl.float32)  # second halves
    tl.store(dst + j, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + half + j, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:
        p = 2 * half + tl.arange(0, BLOCK_PASS)[None, :]  # [1, BLOCK_PASS] the unrotated dimensions
        pass_mask = (h < heads) & (p < head_dim)
        tl.store(dst + p, tl.load(src + p, mask=pass_mask), mask=pass_mask)


@triton.jit
def _rotary_kernel(
    pos_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    q_heads,
    k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    half,
    head_dim,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Token t: q and k heads rotated by the angles of row positions[t] of the cos/sin tables."""
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + pos * half + j, mask=j < half, other=0.0)  # [1, BLOCK_HALF]
    sin = tl.load(sin_ptr + pos * half + j, mask=j < half, other=0.0)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        q_heads,
        stride_qt,
        stride_qh,
        cos,
        sin,
        half,
        head_dim,
        BLOCK_QH,
        BLOCK_HALF,
        BLOCK_PASS,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        k_heads,
        stride_kt,
        stride_kh,
        cos,
        sin,
        half,
        head_dim,
        BLOCK_KH,
        BLOCK_HALF,
        BLOCK_PASS,
    )


def rotary_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [n]; q [n, heads, head_dim], k [n, kv_heads, head_dim] (any token/head strides);
    cos, sin [max_positions, rotary_dim // 2] float32, rotary_dim <= head_dim -> (q, k) with their first
    rotary_dim dimensions rotated and the others passed through (partial rotary), new contiguous tensors,
    as ``rotary_torch``."""
    q, k = _unit_last_stride(q), _unit_last_stride(k)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    half, head_dim = cos.shape[-1], q.shape[-1]
    if k.shape[-1] != head_dim or head_dim < 2 * half:
        raise ValueError(
            f"rotary_triton: q and k heads of one head_dim >= the table's {2 * half} rotated dimensions, "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    unrotated = head_dim - 2 * half
    _rotary_kernel[(positions.shape[0],)](
        positions.contiguous(),
        cos.contiguous(),
        sin.contiguous(),
        q,
        k,
        q_out,
        k_out,
        q.shape[1],
        k.shape[1],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        half,
        head_dim,
        BLOCK_QH=triton.next_power_of_2(max(q.shape[1], 1)),
        BLOCK_KH=triton.next_power_of_2(max(k.shape[1], 1)),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_PASS=triton.next_power_of_2(unrotated) if unrotated else 0,
        enable_fp_fusion=False,
    )
    return q_out, k_out


@triton.jit
def _silu_and_mul_kernel(
    gate_ptr, up_ptr, out_ptr, width, stride_gate, stride_up, stride_out, BLOCK: tl.constexpr
):
    """One row, BLOCK columns: out = silu(gate) * up; silu is rounded to gate's dtype first, as F.silu's
    output is. Rows are strided, so gate and up may be the two halves of one packed projection."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    gate = tl.load(gate_ptr + row * stride_gate + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = tl.div_rn(g, 1.0 + tl.exp(-g)).to(gate.dtype).to(tl.float32)
    up = tl.load(up_ptr + row * stride_up + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., intermediate] -> silu(gate) * up, as ``silu_and_mul_torch``."""
    gate2, up2 = _rows(gate), _rows(up)
    rows, width = gate2.shape
    out = torch.empty(
        rows, width, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device
    )
    _silu_and_mul_kernel[(rows, triton.cdiv(width, _ELEMENTWISE_BLOCK))](
        gate2,
        up2,
        out,
        width,
        gate2.stride(0),
        up2.stride(0),
        out.stride(0),
        BLOCK=_ELEMENTWISE_BLOCK,
        enable_fp_fusion=False,
    )
    return out.view(gate.shape)


@triton.jit
def gelu_tanh(x):
    """transformers' GELU-tanh of float32 x, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), written as
    x * sigmoid(2 sqrt(2 / pi) (x + 0.044715 x^3)) (0.5 (1 + tanh z) = sigmoid(2 z)): the gate activation of
    Gemma's MLPs in every kernel that gates (the fused rows, the quantized product's store, the grouped experts)."""
    return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))  # 2 * sqrt(2 / pi)


@triton.jit
def sigmoid_gated(x, gate):
    """x * sigmoid(gate) in float32, rounded as ``sigmoid_gate_torch`` rounds it: x as given (in its dtype),
    sigmoid in float32 with IEEE division, rounded to gate's dtype as torch.sigmoid's output is, the product in
    float32 (the caller rounds it to the output's dtype). gate broadcasts against x (one logit a head).
    No product here meets an add, so FMA contraction cannot change these bits in a kernel compiled with it
    (the paged-attention kernels' gated store, attention/triton_kernels.py, whose docstring says where that
    store's bits were compared with this kernel's)."""
    sig = tl.div_rn(1.0, 1.0 + tl.exp(-gate.to(tl.float32))).to(gate.dtype).to(tl.float32)
    return x.to(tl.float32) * sig


@triton.jit
def _sigmoid_gate_kernel(
    x_ptr,
    gate_ptr,
    out_ptr,
    dim,
    stride_xt,
    stride_xh,
    stride_gt,
    stride_gh,
    stride_gd,
    BLOCK: tl.constexpr,
):
    """Token t, head h: out[t, h] = x[t, h] * sigmoid(gate[t, h]) over dim columns (``sigmoid_gated``).
    stride_gd 0: one gate value for the whole head."""
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    gate = tl.load(gate_ptr + token * stride_gt + head * stride_gh + cols * stride_gd, mask=mask)
    x = tl.load(x_ptr + token * stride_xt + head * stride_xh + cols, mask=mask)
    dst = out_ptr + (token * tl.num_programs(1) + head) * dim + cols
    tl.store(dst, sigmoid_gated(x, gate).to(out_ptr.dtype.element_ty), mask=mask)


def sigmoid_gate_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x [n, heads, dim] (any token/head strides); gate [n, heads, dim] or [n, heads, 1] (one value per
    head), any strides and float dtype -> x * sigmoid(gate) [n, heads, dim] in x's dtype, a new contiguous
    tensor, as ``sigmoid_gate_torch``."""
    x, gate = _unit_last_stride(x), gate.expand(x.shape)  # a per-head gate: column stride 0
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n, heads, dim = x.shape
    _sigmoid_gate_kernel[(n, heads)](
        x,
        gate,
        out,
        dim,
        x.stride(0),
        x.stride(1),
        gate.stride(0),
        gate.stride(1),
        gate.stride(2),
        BLOCK=triton.next_power_of_2(dim),
        enable_fp_fusion=False,
    )
    return out


@triton.jit
def _relu2_kernel(x_ptr, out_ptr, width, stride_x, BLOCK: tl.constexpr):
    """One row, BLOCK columns: out = relu(x)^2, the square rounded once (torch.square of F.relu's output;
    NaN stays NaN, as F.relu keeps it)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    relu = tl.where(x < 0.0, 0.0, x)
    tl.store(out_ptr + row * width + offs, (relu * relu).to(out_ptr.dtype.element_ty), mask=mask)


def relu2_triton(x: torch.Tensor) -> torch.Tensor:
    """x [..., width] -> relu(x)^2, a new contiguous tensor, as ``relu2_torch``."""
    x2 = _rows(x)  # [rows, width]
    rows, width = x2.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _relu2_kernel[(rows, triton.cdiv(width, _ELEMENTWISE_BLOCK))](
        x2, out, width, x2.stride(0), BLOCK=_ELEMENTWISE_BLOCK, enable_fp_fusion=False
    )
    return out


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is dense (stride 1), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., dim] as [rows, dim] with a dense last dimension (a view where possible)."""
    return _unit_last_stride(x.reshape(-1, x.shape[-1]))
