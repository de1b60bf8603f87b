"""Multi-head latent attention's few-row path (decode and verify on the GPU; layers/mla.py chooses it): one
attention block in five launches, where the eager chain takes about 17 (16 to 18 counted along its code
path; tests/kernels/test_mla_fused.py counts both on the GPU). This file launches them; kernels 1 and 2 are
layers/mla_fused_kernels.py.

1. ``down_kernel``: the projections of the (already normalised) input x in one grid, the query's outputs
   and kv_a_proj_with_mqa's side by side (both stream their weights against the same rows). On a fused
   residual stack (models/deepseek.py ``forward_fused``) x is the stream times the input norm's weight
   (layers/normed_rows.py ``NormedRows``) and each row's products are scaled by the norm's factor from
   the stream's partial sums of squares, as that file's projections fold a norm in: no launch for the norm. With a
   q_lora_rank the query's part is q_a_proj: it leaves q_a * w (w: q_a_layernorm's weight) and each
   program's sums of q_a^2, so that the next kernel applies the norm as rstd * ((q_a * w) @ W.T)
   (layers/normed_rows.py's NormedRows idea). Without one it is q_proj, the whole query: its float32
   rows. The kv part leaves its raw float32 rows [latent | k_pe].
2. The query latent W_UK^T q_nope, the rotated q_pe, and one program that finishes the kv rows
   (kv_a_layernorm on the latent, RoPE on k_pe) and writes them into the latent cache at the tokens'
   slots (an FP8 cache: quantized with the layer's k scale, attention/kv_quant.py):
   - with a q_lora_rank, ``q_absorb_kernel``: per head, the q_nope rows of q_b_proj times the head's W_UK,
     in ``q_parts`` partial products over slices of the nope dimension (the attention kernel sums them:
     enough programs for few heads without an atomic or another launch), and the head's q_pe rows;
   - without, ``absorb_kernel``: q_proj's rows are already there, so a program takes one head's whole
     q_nope and a slice of W_UK's R columns (``r_parts``): the query latent whole, W_UK read once. With
     q_proj in kernel 2 (DeepSeek-V2-Lite: 16 heads, 12.6 MB of q_proj), its 96 programs took 10.6 us a
     layer on the H200 (benchmarks/results/gpu_2026-11-30e call 1), a third of the bytes' bandwidth.
3-4. attention/mla_kernels.py ``mla_attention_up``: attention over the latent cache (split-KV partials),
   then the merge of the splits with each head's W_UV applied to its attended latent.
5. o_proj (layers/linear.py: the few-row projection kernel on CUDA); on a fused residual stack, the
   projection that adds the residual and readies the post-attention norm (layers/fused_decoder.py
   ``project_add_ready``), over ``mla_attend_fused``'s output.

Block FP8 checkpoints (DeepSeek-V3, Kimi-K2: layers/quant/): kernels 1 and 2 read q_a_proj (or q_proj),
kv_a_proj_with_mqa and q_b_proj in their stored float8 bytes, each weight's format a compile-time fact, and
dequantize a tile in registers to the rows' dtype, times its block's scale (the few-row FP8 projections'
``weight_tile``, layers/quant/weight_tiles.py); a K step then spans at most ``fp8_scale_columns``
scale blocks' columns. W_UK and W_UV are ``up_weights``' (a quantized kv_b_proj dequantized once after
loading, as the eager path reads it), and o_proj, called as a module, runs its own few-row FP8 kernel: the
same five launches. Per-tensor FP8 checkpoints (Mistral Small 4's) are read the same way, each weight's one
scale viewed as that of every 128 x 128 block (``_operand``). Which formats the kernels take: layers/mla.py
``fuses``.

Kernels 1 and 2 launch with programmatic dependent launch on Hopper (layers/pdl.py): their programs
start while the kernel before drains, prefetch their first weight columns into L2, then wait.

RoPE pairs dimensions (2i, 2i + 1) in DeepSeek's interleaved layout and (i, i + P/2) otherwise; either way
the rotated pair lands at (i, i + P/2), the layout RotaryEmbedding gives (layers/rotary.py). Roundings
differ from the eager chain (the projections' outputs stay in float32 up to where the eager chain would
have rounded a result it then multiplies). With TRITON_INTERPRET=1 the kernels run on CPU tensors in float32
(tests).

Batch-invariant mode (EngineConfig.batch_invariant): the block serves every absorbed forward, any number of
rows. Kernels 1 and 2 take the rows in tiles of MAX_ROWS, a grid axis (one tile outside the mode), and every
compile-time fact of theirs follows the model's shape and the device, never the batch: tiles, parts, the
programs' outputs; M is not specialised (``do_not_specialize``), so one compiled kernel serves every row
count. A row's products then depend on its own row only (an MMA row's bits do not depend on the other rows of
its tile, as the other invariant kernels rest on), its q_a norm sums the same programs' partial sums, and the
attention and merge take their invariant variant (attention/mla_kernels.py), o_proj the mode's projection: a
decode row gets the bits it gets inside a verify chain or any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from outpace.attention.metadata import PagedAttentionMetadata
from outpace.attention.mla_kernels import mla_attention_up
from outpace.layers.mla import MultiHeadLatentAttention, fused_weight_format
from outpace.layers.mla_fused_kernels import absorb_kernel, down_kernel, q_absorb_kernel
from outpace.layers.normed_rows import NormedRows
from outpace.layers.pdl import pdl_available, pdl_launch_options
from outpace.layers.quant.linear import Fp8Tensor, is_quantized
from outpace.layers.skinny_gemm import MAX_ROWS
from outpace.layers.sm_count import num_sms

# Outputs a program of the down projections: _DOWN_OUTS (132 programs at DeepSeek-V3's 1536 + 576), twice as
# many where that would leave a second, partial wave of programs (``_down_outs``). DeepSeek-V2-Lite's q_proj and
# kv_a (3072 + 576 outputs): 2.442 -> 2.380 ms a decode step at batch 1, 5.672 -> 5.600 at batch 8 with 32
# (benchmarks/scripts/decode_settings.py mla_down, gpu_2026-11-30e call 3). In block FP8 too: V2-Lite's step
# 2.048 -> 1.986 ms at batch 1 over one scale column a K step (gpu_2026-12-03f call 2; the table at
# ``fp8_scale_columns``), where a run that also gave the FP8 experts PDL had lost (gpu_2026-11-30e calls 2, 4).
_DOWN_OUTS = 16
# A weight tile's elements a pipeline stage (32 KB of bf16) and its K columns at most: against 8192 and 256,
# DeepSeek-V2-Lite's decode step took 2.741 -> 2.657 ms at batch 1, 5.876 -> 5.826 at batch 8 on the H200
# (benchmarks/scripts/decode_settings.py, gpu_2026-11-30c call 1; 32768 and 1024 were slower)
_TILE_ELEMENTS = 16384
_MAX_BLOCK_K = 512
_DOWN_STAGES = 4  # software pipeline stages of the down projections' weight stream
_Q_ABSORB_STAGES = 3  # of q_b_proj's (or q_proj's)
MAX_Q_PARTS = 4  # every attention program reads every part: a few heads' programs, not more
# W_UK's R columns an ``absorb_kernel`` program takes at least (a power of two >= 16; tests lower it)
min_r_chunk = 64
_PREFETCH_K = 512  # weight columns a program prefetches into L2 before waiting on its inputs (PDL)
# Scale blocks a K step of a block-FP8 weight spans at most (``weight_tile`` reads one scale a row, or one a
# row and scale column). Over one (16 steps of 128 columns where bf16 takes 4 of 512) V2-Lite's down
# projections took 9.2 us a layer against 6.9 in bf16 (gpu_2026-12-01i call 2). The decode step in block FP8 at
# batch 1 / 8, ms (benchmarks/scripts/decode_settings.py mla_down_fp8 and mla_down_fp8_v3, gpu_2026-12-03f call
# 2; V2-Lite's columns with 32 outputs a program):
#   columns              1                2                4
#   DeepSeek-V2-Lite     1.986 / 4.153    1.986 / 4.142    1.980 / 4.137   (16 outputs, 1 column: 2.048 / 4.211)
#   DeepSeek-V3 slice    1.445 / 3.514    1.433 / 3.444    1.439 / 3.405
fp8_scale_columns = 4


def q_parts(heads: int, nope: int, rope: int, device: torch.device) -> tuple[int, int]:
    """``q_absorb_kernel``'s (query latent parts, q_pe parts) a head: the most parts (a power of two up to
    ``MAX_Q_PARTS``) whose programs stay within about two an SM, q_pe split alike so that every program
    streams about as many weight rows (nope / parts, rope / pe parts). Kimi-K2 (64 heads): 2 and 1; V3
    (128): 1 and 1."""

    def pe_parts(parts: int) -> int:
        return min(rope // 2, max(1, parts * rope // nope))

    parts = MAX_Q_PARTS
    while parts > 1 and heads * (parts + pe_parts(parts)) > 2 * num_sms(device):
        parts //= 2
    return parts, pe_parts(parts)


def r_chunk(heads: int, rank: int, device: torch.device) -> int:
    """``absorb_kernel``'s R columns a program (a power of two): as few as keep the programs within about
    two an SM, ``min_r_chunk`` at least. DeepSeek-V2-Lite (16 heads, R 512): 64, eight programs a head."""
    chunk = max(min_r_chunk, triton.next_power_of_2(rank))
    while chunk > min_r_chunk and heads * triton.cdiv(rank, chunk // 2) <= 2 * num_sms(device):
        chunk //= 2
    return chunk


def _down_outs(outputs: int, device: torch.device) -> int:
    """Outputs a program of ``down_kernel`` over ``outputs`` in all (module setting ``_DOWN_OUTS``)."""
    wide = triton.cdiv(outputs, _DOWN_OUTS) > num_sms(device)
    return 2 * _DOWN_OUTS if wide else _DOWN_OUTS


def _block_k(block_n: int, fp32: bool) -> int:
    """K columns a tile of ``block_n`` weight rows streams a step: ``_TILE_ELEMENTS`` in all (half in
    float32: the same bytes)."""
    return max(16, min(_MAX_BLOCK_K, _TILE_ELEMENTS // block_n) // (2 if fp32 else 1))


def _prefetch_k(k: int) -> int:
    """``_PREFETCH_K``, or less for a narrow input (K columns)."""
    return max(64, min(_PREFETCH_K, triton.next_power_of_2(k)))


@dataclass(frozen=True)
class _Operand:
    """A projection's weight as ``_rows_dot`` reads it."""

    weight: torch.Tensor  # [N, K]: x's dtype, or float8_e4m3fn
    scale: torch.Tensor  # "fp8_block": [ceil(N / bn), ceil(K / bk)]; "none": the weight (not read)
    format: str  # layers/mla.py ``fused_weight_format``: "none" or "fp8_block"
    block: tuple[int, int] | None  # "fp8_block": (bn, bk), the rows and columns a scale covers

    def scale_strides(self) -> tuple[int, int]:
        return self.scale.stride(0), self.scale.stride(1)


# the blocks a per-tensor FP8 weight is read as (its checkpoint's other projections, if in block FP8, share them)
_TENSOR_BLOCK = 128


def _operand(proj: torch.nn.Module, dtype: torch.dtype) -> _Operand:
    fmt = fused_weight_format(proj, dtype)
    if fmt is None:
        raise ValueError(f"the fused MLA kernels cannot read {proj} for rows of {dtype}")
    if not is_quantized(proj):
        return _Operand(proj.weight, proj.weight, fmt, None)
    if isinstance(
        proj.format, Fp8Tensor
    ):  # one scale, repeated over 128 x 128 blocks (a stride-0 view)
        n, k = proj.stored_weight.shape
        block = (_TENSOR_BLOCK, _TENSOR_BLOCK)
        scale = proj.scale.reshape(1, 1).expand(triton.cdiv(n, block[0]), triton.cdiv(k, block[1]))
        return _Operand(proj.stored_weight, scale, fmt, block)
    return _Operand(proj.stored_weight, proj.scale, fmt, proj.format.scheme.block)


def _scale_block(*operands: _Operand) -> tuple[int, int] | None:
    """The scale block of a kernel's quantized operands (one checkpoint's ``weight_block_size``, shared:
    the kernel takes one), None where none is quantized."""
    blocks = {o.block for o in operands if o.block is not None}
    if len(blocks) > 1:
        raise ValueError(f"the fused MLA kernels take one scale block, not {sorted(blocks)}")
    return blocks.pop() if blocks else None


def _block_k_within(block_k: int, block: tuple[int, int] | None) -> int:
    """``block_k`` (a power of two), cut to ``fp8_scale_columns`` scale blocks' columns (a power of two,
    ``fuses``) so that each K step covers whole scale columns or lies in one (``weight_tile``)."""
    return block_k if block is None else min(block_k, block[1] * fp8_scale_columns)


def mla_forward_fused(
    layer: MultiHeadLatentAttention,
    positions: torch.Tensor,
    x: torch.Tensor,
    meta: PagedAttentionMetadata,
) -> torch.Tensor:
    """``layer``'s absorbed forward (layers/mla.py ``fuses`` decides when): positions [M]; x [M, hidden]
    (M <= MAX_ROWS, any number in batch-invariant mode, normalised) -> [M, hidden]; writes the tokens' rows
    into ``layer.cache_rows`` at meta.slot_mapping. ``mla_attend_fused``, then o_proj."""
    return layer.o_proj(mla_attend_fused(layer, positions, x, 0.0, meta))


def mla_attend_fused(
    layer: MultiHeadLatentAttention,
    positions: torch.Tensor,
    rows: torch.Tensor | NormedRows,
    eps: float,
    meta: PagedAttentionMetadata,
) -> torch.Tensor:
    """The fused block up to o_proj: positions [M]; rows: the input x [M, hidden] normalised, or the residual
    stream made ready for the layer's input norm of eps ``eps`` (``NormedRows``: the norm folded into the
    down projections, ``down_kernel``'s ROW_NORM) -> the heads' attended values [M, heads * v_head_dim]
    (o_proj's input); writes the tokens' rows into ``layer.cache_rows`` at meta.slot_mapping."""
    s = layer.shape
    row_norm = isinstance(rows, NormedRows)
    x = rows.normed if row_norm else rows  # [M, hidden]
    m, device, fp32 = x.shape[0], x.device, x.dtype == torch.float32
    x = x if x.stride(1) == 1 else x.contiguous()
    precision = "ieee" if fp32 else "tf32"
    kv_width = s.kv_lora_rank + s.qk_rope_head_dim
    w_kv = _operand(layer.kv_a_proj_with_mqa, x.dtype)
    kv_raw = torch.empty(m, kv_width, dtype=torch.float32, device=device)
    if s.q_lora_rank is None:  # q_proj's whole rows
        w_down_q, q_norm = _operand(layer.q_proj, x.dtype), x  # (the norm weight: unused)
        q_width = s.num_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim)
        q_out = torch.empty(m, q_width, dtype=torch.float32, device=device)
    else:
        w_down_q, q_norm = _operand(layer.q_a_proj, x.dtype), layer.q_a_layernorm.weight
        q_out = torch.empty(m, s.q_lora_rank, dtype=x.dtype, device=device)
    pdl = pdl_available(device)
    down_block = _scale_block(w_down_q, w_kv)
    outs = _down_outs(q_out.shape[1] + kv_width, device)
    q_programs = triton.cdiv(q_out.shape[1], outs)
    q_sq = (
        kv_raw  # (unused)
        if s.q_lora_rank is None
        else torch.empty(q_programs, m, dtype=torch.float32, device=device)
    )
    sq_parts = rows.sq_parts if row_norm else kv_raw  # [P, M] (without the norm: unused)
    row_tiles = triton.cdiv(m, MAX_ROWS)  # one, but in batch-invariant mode
    down_kernel[(q_programs + triton.cdiv(kv_width, outs), row_tiles)](
        x,
        sq_parts,
        w_down_q.weight,
        w_kv.weight,
        w_down_q.scale,
        w_kv.scale,
        q_norm,
        q_out,
        q_sq,
        kv_raw,
        m,
        x.shape[1],
        q_out.shape[1],
        kv_width,
        q_programs,
        sq_parts.shape[0],
        eps,
        x.stride(0),
        w_down_q.weight.stride(0),
        w_kv.weight.stride(0),
        *w_down_q.scale_strides(),
        *w_kv.scale_strides(),
        BM=MAX_ROWS,
        BN=outs,
        BK=_block_k_within(_block_k(outs, fp32), down_block),
        PRECISION=precision,
        PDL=pdl,
        PREFETCH_K=_prefetch_k(x.shape[1]),
        Q_FORMAT=w_down_q.format,
        KV_FORMAT=w_kv.format,
        SCALE_BN=(down_block or (1, 1))[0],
        SCALE_BK=(down_block or (1, 1))[1],
        Q_NORMED=s.q_lora_rank is not None,
        ROW_NORM=row_norm,
        BLOCK_P=triton.next_power_of_2(sq_parts.shape[0]) if row_norm else 1,
        num_warps=4,
        num_stages=_DOWN_STAGES,
        **pdl_launch_options(pdl),
    )
    cache = layer.cache_rows.view(-1, kv_width)
    w_uk, w_uv = layer.up_weights()  # [heads, nope, R], [heads, v_head_dim, R]: bf16 (a quantized
    # kv_b_proj's copy dequantized after loading, layers/mla.py ``pack_rows``)
    kv_args = (kv_raw, layer.kv_a_layernorm.weight, cache, layer.k_scale, meta.slot_mapping)
    rope_args = (positions, layer.rotary.cos, layer.rotary.sin)
    q_pe = torch.empty(m, s.num_heads, s.qk_rope_head_dim, dtype=x.dtype, device=device)
    block_r = max(16, triton.next_power_of_2(s.kv_lora_rank))
    block_pairs = max(16, triton.next_power_of_2(s.qk_rope_head_dim // 2))
    if s.q_lora_rank is None:
        chunk = r_chunk(s.num_heads, s.kv_lora_rank, device)
        r_parts = triton.cdiv(s.kv_lora_rank, chunk)
        q_latent = torch.empty(1, m, s.num_heads, s.kv_lora_rank, dtype=x.dtype, device=device)
        absorb_kernel[(s.num_heads * r_parts + 1, row_tiles)](
            q_out,
            w_uk,
            *kv_args,
            *rope_args,
            q_latent,
            q_pe,
            m,
            layer.kv_a_layernorm.eps,
            w_uk.stride(0),
            w_uk.stride(1),
            cache.stride(0),
            HEADS=s.num_heads,
            NOPE=s.qk_nope_head_dim,
            P=s.qk_rope_head_dim,
            R=s.kv_lora_rank,
            R_PARTS=r_parts,
            R_CHUNK=chunk,
            PREFETCH_LINES=max(1, chunk // 64),
            BLOCK_NOPE=max(16, triton.next_power_of_2(s.qk_nope_head_dim)),
            BLOCK_HP=block_pairs,
            BLOCK_R=block_r,
            BR=min(chunk, 32 if fp32 else 64),
            BM=MAX_ROWS,
            INTERLEAVED=layer.rotary.interleaved,
            PRECISION=precision,
            PDL=pdl,
            num_warps=4,
            **pdl_launch_options(pdl),
        )
    else:
        q_latent = _q_absorb(layer, q_out, q_sq, q_pe, kv_args, rope_args, cache, w_uk, pdl)
    # Mistral 4's query scale by position, on the whole query: the absorbed latent's parts and the rotated part
    scale = layer.rotary.query_scales_at(positions, x.dtype)  # [M] or None
    if scale is not None:
        q_latent, q_pe = q_latent * scale.view(1, -1, 1, 1), q_pe * scale.view(-1, 1, 1)
    attended = mla_attention_up(
        q_latent, q_pe, layer.cache_rows, meta, s.scale, w_uv, k_scale=layer.latent_scale()
    )  # [M, heads, v_head_dim]
    return attended.view(m, -1)


def _q_absorb(
    layer: MultiHeadLatentAttention,
    q_in: torch.Tensor,
    q_sq: torch.Tensor,
    q_pe: torch.Tensor,
    kv_args: tuple,
    rope_args: tuple,
    cache: torch.Tensor,
    w_uk: torch.Tensor,
    pdl: bool,
) -> torch.Tensor:
    """``q_absorb_kernel``'s launch (a q_lora_rank): q_in [M, q_lora_rank] (q_a * its norm's weight) and
    q_sq [q programs, M] (down_kernel's) -> the query latent's parts [parts, M, heads, R]; fills q_pe
    [M, heads, P] and the cache rows."""
    s, m, device, fp32 = layer.shape, q_in.shape[0], q_in.device, q_in.dtype == torch.float32
    parts, pe_parts = q_parts(s.num_heads, s.qk_nope_head_dim, s.qk_rope_head_dim, device)
    nope_chunk = triton.cdiv(s.qk_nope_head_dim, parts)
    pe_chunk = triton.cdiv(s.qk_rope_head_dim // 2, pe_parts)
    block_nc = max(16, triton.next_power_of_2(nope_chunk))
    block_hp = max(16, triton.next_power_of_2(pe_chunk))
    block_r = max(16, triton.next_power_of_2(s.kv_lora_rank))
    q_latent = torch.empty(parts, m, s.num_heads, s.kv_lora_rank, dtype=q_in.dtype, device=device)
    w_q = _operand(layer.q_b_proj, q_in.dtype)
    q_block = _scale_block(w_q)
    q_absorb_kernel[(s.num_heads * (parts + pe_parts) + 1, triton.cdiv(m, MAX_ROWS))](
        q_in,
        q_sq,
        w_q.weight,
        w_q.scale,
        w_uk,
        *kv_args,
        *rope_args,
        q_latent,
        q_pe,
        m,
        q_in.shape[1],
        q_sq.shape[0],
        layer.q_a_layernorm.eps,
        layer.kv_a_layernorm.eps,
        q_in.stride(0),
        w_q.weight.stride(0),
        *w_q.scale_strides(),
        w_uk.stride(0),
        w_uk.stride(1),
        cache.stride(0),
        HEADS=s.num_heads,
        NOPE=s.qk_nope_head_dim,
        P=s.qk_rope_head_dim,
        R=s.kv_lora_rank,
        Q_PARTS=parts,
        NOPE_CHUNK=nope_chunk,
        PE_PARTS=pe_parts,
        PE_CHUNK=pe_chunk,
        BLOCK_NC=block_nc,
        BLOCK_HP=block_hp,
        BLOCK_KP=max(16, triton.next_power_of_2(s.qk_rope_head_dim // 2)),
        BLOCK_R=block_r,
        BLOCK_SQ=max(2, triton.next_power_of_2(q_sq.shape[0])),
        BR=min(block_r, 64 if fp32 else 128),
        BM=MAX_ROWS,
        BK=_block_k_within(_block_k(max(block_nc, block_hp), fp32), q_block),
        INTERLEAVED=layer.rotary.interleaved,
        PRECISION="ieee" if fp32 else "tf32",
        PDL=pdl,
        PREFETCH_K=_prefetch_k(q_in.shape[1]),
        Q_FORMAT=w_q.format,
        SCALE_BN=(q_block or (1, 1))[0],
        SCALE_BK=(q_block or (1, 1))[1],
        num_warps=4,
        num_stages=_Q_ABSORB_STAGES,
        **pdl_launch_options(pdl),
    )
    return q_latent
