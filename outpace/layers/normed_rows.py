"""A residual stream made ready for the RMSNorm behind it (``NormedRows``), and the norm kernels of one program a
row that work beside the fused few-row projections (layers/fused_projection.py).

RMSNorm folds into the projection behind it because its scale is one number per row: RMSNorm(s) @ W.T =
rstd * ((s * w_norm) @ W.T). The kernel that writes the stream s (a projection's ``project_add_normed``, or
``normed_rows`` here for a stream that comes from elsewhere) also writes s * w_norm and, per program, the
partial sums of s^2 over its columns; the projection behind the norm then streams its weights against
s * w_norm exactly as a plain matmul does and scales each row by rstd at the end. (Doing the multiply and the
sum of squares inside the projection's loop costs up to 2x: the input tile then passes through registers on
every step.)

- ``normed_rows``      a stream no fused kernel wrote (the embeddings, an all-reduced output plus the stream)
                       made ready
- ``add_normed``       a sandwich norm's residual add (Gemma: RMSNorm on a projection's output before the add,
                       its scale applied by ``project_normed``), the new stream made ready for the next norm
- ``embed_norm_pair``  EAGLE3's and MTP layers' input: the embedding's gather and both RMSNorms in one kernel

With TRITON_INTERPRET=1 the kernels also run on CPU tensors (float32), which is how the tests check them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class NormedRows:
    """A residual stream made ready for a projection behind an RMSNorm with weight w.

    stream [M, N]: the stream itself; normed [M, N]: stream * w, in the stream's dtype;
    sq_parts [P, M] float32: partial sums of the stream's squares, P of them per row (the programs of
    the kernel that wrote the stream), which sum to the row's sum of squares.
    """

    stream: torch.Tensor
    normed: torch.Tensor
    sq_parts: torch.Tensor


@triton.jit
def _normed_rows_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    stream_ptr,
    normed_ptr,
    sq_ptr,
    M,
    N,
    stride_xm,
    stride_rm,
    offset,
    RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row r: s = x[r] (+ res[r] with RESIDUAL, stored as stream[r] in the stream's dtype); normed[r] =
    s * (offset + w); sq[0, r] = sum(s^2)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    if RESIDUAL:
        x += tl.load(res_ptr + row * stride_rm + cols, mask=ok, other=0.0).to(tl.float32)
        x = x.to(stream_ptr.dtype.element_ty)
        tl.store(stream_ptr + row * N + cols, x, mask=ok)
        x = x.to(tl.float32)  # (the stream as stored)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32) + offset
    tl.store(normed_ptr + row * N + cols, (x * w).to(normed_ptr.dtype.element_ty), mask=ok)
    tl.store(sq_ptr + row, tl.sum(x * x, axis=0))


@triton.jit
def _add_normed_kernel(
    o_ptr,
    sq_in_ptr,
    res_ptr,
    scale_ptr,
    w_next_ptr,
    out_ptr,
    normed_ptr,
    sq_out_ptr,
    N,
    num_sq_parts,
    stride_om,
    stride_rm,
    eps,
    next_offset,
    HAS_SCALE: tl.constexpr,
    NEXT_NORM: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Row r: s = (res[r] + o[r] * rsqrt(sum(sq_in[:, r]) / N + eps)) (* scale[0]), o being a projection's
    output times its norm's scale (``project_normed``); stores s, and with NEXT_NORM s * (next_offset +
    w_next) and sum(s^2) (s as stored)."""
    row = tl.program_id(0)
    M = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    parts = tl.arange(0, BLOCK_P)
    sq = tl.load(sq_in_ptr + parts * M + row, mask=parts < num_sq_parts, other=0.0)
    rstd = tl.rsqrt(tl.sum(sq, axis=0) / N + eps)
    o = tl.load(o_ptr + row * stride_om + cols, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(res_ptr + row * stride_rm + cols, mask=ok, other=0.0).to(tl.float32) + o * rstd
    if HAS_SCALE:
        s = s * tl.load(scale_ptr).to(tl.float32)
    s = s.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * N + cols, s, mask=ok)
    if NEXT_NORM:
        sf = tl.where(ok, s.to(tl.float32), 0.0)
        w = tl.load(w_next_ptr + cols, mask=ok, other=0.0).to(tl.float32) + next_offset
        tl.store(normed_ptr + row * N + cols, (sf * w).to(normed_ptr.dtype.element_ty), mask=ok)
        tl.store(sq_out_ptr + row, tl.sum(sf * sf, axis=0))


@triton.jit
def _embed_norm_pair_kernel(
    ids_ptr,
    emb_ptr,
    w_emb_ptr,
    h_ptr,
    w_h_ptr,
    out_ptr,
    N,
    stride_emb,
    stride_h,
    eps_emb,
    eps_h,
    offset_emb,
    offset_h,
    BLOCK: tl.constexpr,
):
    """Row r: out[r] = [RMSNorm(emb[ids[r]]) * (offset_emb + w_emb) | RMSNorm(h[r]) * (offset_h + w_h)], out
    [M, 2 * N], the weights applied in float32 (``Float32RMSNorm``'s arithmetic; an offset 1 for Qwen's 1 + w)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    token = tl.load(ids_ptr + row).to(tl.int64)
    e = tl.load(emb_ptr + token * stride_emb + cols, mask=ok, other=0.0).to(tl.float32)
    h = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
    e = e * tl.rsqrt(tl.sum(e * e, axis=0) / N + eps_emb)
    e *= offset_emb + tl.load(w_emb_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / N + eps_h)
    h *= offset_h + tl.load(w_h_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * 2 * N + cols, e.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(out_ptr + row * 2 * N + N + cols, h.to(out_ptr.dtype.element_ty), mask=ok)


def normed_rows(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    offset: float = 0.0,
    residual: torch.Tensor | None = None,
) -> NormedRows:
    """A stream x [M, N] that no fused kernel wrote (the embeddings), made ready for RMSNorm(x) @ W.T
    (the norm's scale offset + norm_weight); with ``residual`` [M, N] the stream is x + residual (a new
    tensor: a sharded projection's all-reduced output added to the stream)."""
    x = x if x.stride(1) == 1 else x.contiguous()
    normed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    stream = x if residual is None else torch.empty_like(normed)
    res = x if residual is None else residual
    res = res if res.stride(1) == 1 else res.contiguous()
    sq = torch.empty(1, x.shape[0], dtype=torch.float32, device=x.device)
    _normed_rows_kernel[(x.shape[0],)](
        x,
        res,
        norm_weight,
        stream,
        normed,
        sq,
        x.shape[0],
        x.shape[1],
        x.stride(0),
        res.stride(0),
        offset,
        RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(x.shape[1]),
    )
    return NormedRows(stream, normed, sq)


def add_normed(
    o: NormedRows,
    eps: float,
    residual: torch.Tensor,
    next_norm: tuple[torch.Tensor, float] | None = None,
    scale: torch.Tensor | None = None,
) -> NormedRows | torch.Tensor:
    """A sandwich norm's residual add, one program a row: s = residual + RMSNorm(o.stream) (o from
    ``project_normed``, which applied the norm's scale), times ``scale`` [1] when given -> s made ready for
    the RMSNorm ``next_norm`` = (weight [N], offset) when given (``NormedRows``), else s [M, N]."""
    m, n = residual.shape
    residual = residual if residual.stride(1) == 1 else residual.contiguous()
    out = torch.empty(m, n, dtype=residual.dtype, device=residual.device)
    normed, sq = out, out
    if next_norm is not None:
        normed = torch.empty_like(out)
        sq = torch.empty(1, m, dtype=torch.float32, device=out.device)
    w_next, offset = next_norm if next_norm is not None else (out, 0.0)
    _add_normed_kernel[(m,)](
        o.normed,
        o.sq_parts,
        residual,
        out if scale is None else scale,
        w_next,
        out,
        normed,
        sq,
        n,
        o.sq_parts.shape[0],
        o.normed.stride(0),
        residual.stride(0),
        eps,
        offset,
        HAS_SCALE=scale is not None,
        NEXT_NORM=next_norm is not None,
        BLOCK=triton.next_power_of_2(n),
        BLOCK_P=triton.next_power_of_2(o.sq_parts.shape[0]),
    )
    return out if next_norm is None else NormedRows(out, normed, sq)


def embed_norm_pair(
    token_ids: torch.Tensor,
    embedding: torch.Tensor,
    embed_norm: tuple[torch.Tensor, float, float],
    hidden: torch.Tensor,
    hidden_norm: tuple[torch.Tensor, float, float],
) -> torch.Tensor:
    """EAGLE3's and MTP layers' input in one kernel: token_ids [M], embedding [vocab, N], hidden [M, N],
    norms (weight [N], eps, offset: the scale is offset + weight), each with its own eps (a widened zoo
    rescales the hidden norm's) -> [RMSNorm(embedding[token_ids]) | RMSNorm(hidden)] [M, 2 * N]."""
    (w_emb, eps_emb, offset_emb), (w_h, eps_h, offset_h) = embed_norm, hidden_norm
    m, n = hidden.shape
    hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
    out = torch.empty(m, 2 * n, dtype=hidden.dtype, device=hidden.device)
    _embed_norm_pair_kernel[(m,)](
        token_ids,
        embedding,
        w_emb,
        hidden,
        w_h,
        out,
        n,
        embedding.stride(0),
        hidden.stride(0),
        eps_emb,
        eps_h,
        offset_emb,
        offset_h,
        BLOCK=triton.next_power_of_2(n),
    )
    return out
