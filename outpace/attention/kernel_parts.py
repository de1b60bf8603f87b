"""The Triton building blocks that the paged attention kernels share, the fast path's
(attention/triton_kernels.py), the batch-invariant variant's (attention/invariant_attention.py) and MLA's
(attention/mla_kernels.py), and the launch arguments their launchers share: a program's query rows and their KV
rows through the block table, the online softmax's step, an FP8 cache's rows and scales, and the output gate."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from outpace.attention.backend import KVScales
from outpace.attention.kv_quant import FP8_KV_MAX, is_fp8
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.layers.fused_kernels import sigmoid_gated

LOG2E = 1.4426950408889634
FP8_MAX = tl.constexpr(FP8_KV_MAX)  # e4m3's largest finite value, 448
MAX_BLOCK_M = 128  # tile rows (query tokens x GQA group) per program
# target grid size for split-KV, in programs per streaming multiprocessor, of the fast path (triton_kernels.py
# ``launch_config``) and of the batch-invariant variant (``invariant_programs``); read at each launch. Fewer
# splits lost in the Llama-3.1-8B shape's decode step (benchmarks/scripts/decode_settings.py
# attention_splits_llama, gpu_2026-12-04g call 3, ms at batch 1 over 512 / 2048 cached rows, batch 8 over 512):
# 2 (8 splits of 64 rows at batch 1 and 512) 4.049 / 4.121 / 4.280; 0.25 (4 splits) 4.098 / 4.459 / 4.573; 0 (one
# split: no merge launch) 4.450 / 5.913 / 4.570.
programs_per_sm = 2


@triton.jit
def fp8_rows(x, scale_ptr):
    """Rows x as an FP8 cache stores them, in float32: clamp(x / scale) to e4m3's range, rounded to the
    nearest e4m3 value (ties to even), so the cast to float8 that follows is exact.

    NOTE: Triton's interpreter casts float32 to float8e4nv without carrying a rounded-up mantissa into
    the exponent (1.98 -> 1.0, where torch and the GPU give 2.0); rounding here first keeps the
    interpreter's cast (the CPU tests) exact too, at a few ALU operations a value on the GPU."""
    # div_rn: IEEE division as torch's x / scale (Triton's "/" may be approximate on the GPU)
    y = tl.clamp(tl.div_rn(x.to(tl.float32), tl.load(scale_ptr).to(tl.float32)), -FP8_MAX, FP8_MAX)
    bits = y.to(tl.int32, bitcast=True)
    magnitude = tl.abs(y)
    # e4m3: 3 mantissa bits, normal from 2^-6, subnormals spaced 2^-9
    exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    ulp = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(exponent - 3)
    # magnitude / ulp < 16: adding and taking away 1.5 * 2^23 rounds it to an integer, ties to even
    rounded = ((tl.div_rn(magnitude, ulp) + 12582912.0) - 12582912.0) * ulp
    sign = (
        bits >> 31
    ) << 31  # y's sign bit (a rounded -0.0 or tiny negative stays -0.0, as torch's cast)
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def query_rows(
    token_table_ptr,
    seq_lens_ptr,
    query_lens_ptr,
    stride_table_seq,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The program's (sequence, kv head, query tile, split) and the rows of its tile: row m is query
    q_start + m // GROUP of the sequence, q head kv_head * GROUP + m % GROUP. Metadata only (no q)."""
    seq = tl.program_id(0) // KV_HEADS
    kv_head = tl.program_id(0) % KV_HEADS
    q_start = tl.program_id(1) * BLOCK_Q
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    query_len = tl.load(query_lens_ptr + seq).to(tl.int32)
    offs_m = tl.arange(0, BLOCK_M)
    q_index = q_start + offs_m // GROUP  # [BLOCK_M]
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M]
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_index < query_len)  # [BLOCK_M]
    token = tl.load(token_table_ptr + seq * stride_table_seq + q_index, mask=row_ok, other=0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    return (
        seq,
        kv_head,
        q_start,
        split,
        seq_len,
        query_len,
        q_index,
        head,
        row_ok,
        token,
        offs_d,
        d_ok,
    )


@triton.jit
def load_queries(q_ptr, token, head, row_ok, offs_d, d_ok, stride_qt, stride_qh):
    """The tile's queries [BLOCK_M, BLOCK_D] (``query_rows``)."""
    return tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )


@triton.jit
def kv_offsets(rows, ok, bt_ptr, stride_cache_slot, offs_d, d_ok, BLOCK_SIZE: tl.constexpr):
    """The cache offsets [BLOCK_N, BLOCK_D] of KV rows ``rows`` [BLOCK_N] (those ``ok`` are real)
    through the block table, block_tables[row // BLOCK_SIZE] * BLOCK_SIZE + row % BLOCK_SIZE."""
    block = tl.load(bt_ptr + rows // BLOCK_SIZE, mask=ok, other=0)
    slot = block * BLOCK_SIZE + rows % BLOCK_SIZE  # [BLOCK_N] int64
    return slot[:, None] * stride_cache_slot + offs_d[None, :], ok[:, None] & d_ok[None, :]


@triton.jit
def split_geometry(
    seq_lens_ptr,
    query_lens_ptr,
    seq,
    q_start,
    window,
    sliding_window,
    num_splits,
    HAS_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """For the query tile starting at query ``q_start`` of sequence ``seq``: kv_start (a multiple of
    BLOCK_N; rows below it are outside every row's sliding window, 0 without one), kv_end (it sees KV
    rows below it), shared_end (rows below it are seen by every row of the tile, sliding window aside),
    prefix (rows cached before this forward) and split_len (KV rows a split covers from kv_start;
    splits past kv_end are empty)."""
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    query_len = tl.load(query_lens_ptr + seq).to(tl.int32)
    prefix = seq_len - query_len
    if HAS_MASK:
        kv_end = seq_len
        shared_end = seq_len - window  # rows before the mask's window: seen by every row
        first_pos = seq_len - window  # no query of the mask sits before its window
    else:
        kv_end = tl.minimum(seq_len, prefix + q_start + BLOCK_Q)
        shared_end = prefix + q_start + 1  # rows up to the tile's first query: seen by every row
        first_pos = prefix + q_start  # the tile's first query's position
    kv_end = tl.where(q_start < query_len, kv_end, 0)  # a tile past the new tokens: no rows, no KV
    kv_start = 0
    if (
        SLIDING
    ):  # the first query's window starts at first_pos - sliding_window + 1; later ones after it
        kv_start = tl.minimum(
            tl.maximum(first_pos - sliding_window + 1, 0) // BLOCK_N * BLOCK_N, kv_end
        )
    split_len = tl.cdiv(tl.cdiv(kv_end - kv_start, num_splits), BLOCK_N) * BLOCK_N
    return kv_start, kv_end, shared_end, prefix, split_len


@triton.jit
def softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One KV tile of the online softmax, base 2: masked scores s [BLOCK_M, BLOCK_N] (-inf where not
    visible) and values v [BLOCK_N, BLOCK_D] update the running max m_i, sum l_i [BLOCK_M] and the
    unnormalised output acc [BLOCK_M, BLOCK_D]."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def cache_scales(k_scale_ptr, v_scale_ptr, KV_SCALED: tl.constexpr):
    """An FP8 cache's (k_scale, v_scale) as float32 scalars; (1.0, 1.0) for a cache in the model's dtype."""
    k_scale = 1.0
    v_scale = 1.0
    if KV_SCALED:
        k_scale = tl.load(k_scale_ptr).to(tl.float32)
        v_scale = tl.load(v_scale_ptr).to(tl.float32)
    return k_scale, v_scale


@triton.jit
def output_values(
    out,  # the normalised attention output, float32: [BLOCK_M, BLOCK_D], or [BLOCK_D] for one row
    out_dtype: tl.constexpr,
    gate_ptr,
    token,
    head,  # the output rows' (token, q head): [BLOCK_M, 1] or scalars
    row_ok,  # [BLOCK_M, 1] or a scalar: the rows that are real
    offs_d,
    d_ok,  # [1, BLOCK_D] or [BLOCK_D]: the columns, those below HEAD_DIM
    stride_gt,
    stride_gh,
    stride_gd,
    GATE: tl.constexpr,
):
    """What the output stores: out rounded to out_dtype; with an output gate (GATE 1: one logit a head
    at gate[token, head], 2: one an element at gate[token, head, d]) that rounded output times the
    sigmoid of its logits (``sigmoid_gated``), rounded again: this attention's output followed by
    ``sigmoid_gate`` (module docstring)."""
    values = out.to(out_dtype)
    if GATE:
        logits_ptr = gate_ptr + token * stride_gt + head * stride_gh
        if GATE == 1:
            logits = tl.load(logits_ptr, mask=row_ok)  # [BLOCK_M, 1] or a scalar
        else:
            logits = tl.load(logits_ptr + offs_d * stride_gd, mask=row_ok & d_ok)
        values = sigmoid_gated(values, logits).to(out_dtype)
    return values


@triton.jit
def store_output_row(
    out,  # [BLOCK_D] float32: one (token, head)'s normalised output
    out_ptr,
    token,
    head,
    stride_ot,
    stride_oh,
    offs_d,
    d_ok,
    gate_ptr,
    stride_gt,
    stride_gh,
    stride_gd,
    GATE: tl.constexpr,
):
    """A combine's store of one output row, gated by GATE (``output_values``)."""
    values = output_values(
        out,
        out_ptr.dtype.element_ty,
        gate_ptr,
        token,
        head,
        True,
        offs_d,
        d_ok,
        stride_gt,
        stride_gh,
        stride_gd,
        GATE,
    )
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d, values, mask=d_ok)


@dataclass(frozen=True)
class LaunchConfig:
    """Tile sizes and grid of ``_attention_kernel``: functions of shapes and python ints only."""

    block_q: int  # query tokens per tile: block_m // group
    block_m: int  # tile rows: block_q * group, padded to a power of two >= 16 (tl.dot)
    block_n: int  # KV rows per step over the rows every row of the tile sees
    block_n_tail: int  # KV rows per step over the masked rest (causal diagonal or tree window)
    block_d: int  # head_dim padded to a power of two >= 16
    num_q_tiles: int
    num_splits: int
    num_warps: int
    num_stages: int
    split_rows: int | None = (
        None  # batch-invariant variant: KV rows per split, fixed (split j: [j * S, (j + 1) * S))
    )


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def scale_args(cache: torch.Tensor, kv_scales: KVScales | None) -> KVScales:
    """The kernels' scale pointers: an FP8 cache's scales, which it must come with; for a cache in the
    model's dtype, any tensor (unused)."""
    if is_fp8(cache.dtype) != (kv_scales is not None):
        raise ValueError(
            f"a {cache.dtype} cache comes with its k/v scales exactly when it is FP8 "
            f"(got {'scales' if kv_scales is not None else 'none'})"
        )
    return kv_scales if kv_scales is not None else (cache, cache)


def gate_args(
    out_gate: torch.Tensor | None, out: torch.Tensor
) -> tuple[torch.Tensor, tuple[int, int, int], int]:
    """The kernels' output-gate arguments for ``out_gate`` (``paged_attention``) over out [num_tokens, heads,
    head_dim]: (the logits, their token, head and column strides, GATE: 1 one logit a head, 2 one an
    element); without a gate, out, zeros and 0 (unused)."""
    if out_gate is None:
        return out, (0, 0, 0), 0
    if out_gate.dtype not in (torch.float32, out.dtype):
        raise ValueError(f"an output gate is float32 or {out.dtype}, not {out_gate.dtype}")
    if out_gate.shape == out.shape[:2]:
        return out_gate, (*out_gate.stride(), 0), 1
    if out_gate.shape == out.shape:
        return out_gate, out_gate.stride(), 2
    raise ValueError(
        f"an output gate is [num_tokens, heads] or [num_tokens, heads, head_dim] = {list(out.shape)}, "
        f"not {list(out_gate.shape)}"
    )


def mask_args(meta: PagedAttentionMetadata) -> tuple[torch.Tensor, int, tuple[int, int]]:
    """The kernels' custom-mask arguments: (the mask as uint8 [num_seqs, max_query_len, window], the window, its
    sequence and query strides); without a mask, seq_lens, 0 and zero strides (unused by the kernels)."""
    mask = meta.custom_mask
    if mask is None:
        return meta.seq_lens, 0, (0, 0)
    mask_arg = last_dim_contiguous(mask).view(torch.uint8)
    return mask_arg, mask.shape[2], (mask_arg.stride(0), mask_arg.stride(1))


def split_partials(
    num_splits: int, num_tokens: int, heads: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each split's unnormalised partial for the combine: (acc [num_splits, num_tokens, heads, head_dim], running
    max and sum [num_splits, num_tokens, heads]), float32."""
    acc = torch.empty(num_splits, num_tokens, heads, head_dim, dtype=torch.float32, device=device)
    running_max = torch.empty(num_splits, num_tokens, heads, dtype=torch.float32, device=device)
    running_sum = torch.empty_like(running_max)
    return acc, running_max, running_sum
